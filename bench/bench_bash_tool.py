"""Benchmark: the bash tool's round trip vs. starting a fresh bash, and harness overhead per turn.

    uv run python bench/bench_bash_tool.py [--calls 300] [--student-user NAME]

Measures, in one process and one run (1-3 interleaved call by call, so that a busy machine
affects them alike):

1. ``true`` through the real ToolBox (MCP client -> MCP server -> persistent bash session);
2. ``true`` through the bash session alone (no MCP), to split the cost;
3. ``subprocess.run(["bash", "-c", "true"])``, what a fresh shell per command costs;
4. the harness's per-turn overhead: the builtin agent loop driving a zero-latency scripted
   model whose every turn is one bash ``true`` call, minus that call's own duration (model
   call, events, message bookkeeping).

Prints p50/p95 (ms) and the ratio of fresh-bash to persistent-tool p50.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time
from typing import Any

from karotte.config import EvaluationRunConfig
from karotte.events import ToolCallCompleted
from karotte.sandbox.agent import StepLimits, run_agent_step
from karotte.sandbox.confinement.demote import demoted_env
from karotte.sandbox.model_client import FakeModelClient
from karotte.sandbox.tools import open_toolbox
from karotte.sandbox.tools.bash import BashSession
from karotte.sandbox.transcript import EventRecorder
from karotte.schemas import ChatCompletionMessageToolCall, Function, Message
from karotte.task import Task


class BenchTask(Task):
    id = "bench"

    @property
    def system_prompt(self) -> str:
        return "bench"

    @property
    def steps(self) -> list[Any]:
        return []

    @property
    def tools(self) -> list[str]:
        return ["bash"]


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def line(name: str, samples: list[float]) -> str:
    return (
        f"{name:<44} p50 {pct(samples, 0.5):7.3f} ms   p95 {pct(samples, 0.95):7.3f} ms   "
        f"mean {statistics.fmean(samples) * 1000:7.3f} ms   (n={len(samples)})"
    )


async def bench_interleaved(
    config: EvaluationRunConfig, calls: int
) -> tuple[list[float], list[float], list[float], list[float]]:
    """ToolBox call (direct and memory transports), bare session call and fresh bash,
    interleaved: all see the same load."""
    tool_s: list[float] = []
    memory_s: list[float] = []
    session_s: list[float] = []
    fresh_s: list[float] = []
    session = BashSession(None, demoted_env(None), "/tmp", output_limit_chars=30_000)
    await session.start()
    try:
        async with (
            open_toolbox(config, BenchTask(config)) as box,
            open_toolbox(config, BenchTask(config), transport="memory") as memory_box,
        ):
            for index in range(calls + 20):
                before = time.perf_counter()
                await memory_box.call("bash", {"command": "true"})
                started = time.perf_counter()
                result = await box.call("bash", {"command": "true"})
                middle = time.perf_counter()
                await session.run("true", 10)
                end = time.perf_counter()
                subprocess.run(["bash", "-c", "true"], check=True)  # noqa: ASYNC221 - measured
                done = time.perf_counter()
                assert not result.is_error, result.output
                if index >= 20:  # warm-up
                    memory_s.append(started - before)
                    tool_s.append(middle - started)
                    session_s.append(end - middle)
                    fresh_s.append(done - end)
    finally:
        await session.close()
    return tool_s, memory_s, session_s, fresh_s


async def bench_agent_turns(
    config: EvaluationRunConfig, turns: int
) -> tuple[list[float], list[float]]:
    """Per-turn wall time of the agent loop (model: scripted, zero latency; tool: bash true),
    and per turn that time minus the tool call's own duration: the harness's overhead."""
    script = [
        Message(
            role="assistant",
            tool_calls=[
                ChatCompletionMessageToolCall(
                    id=f"call_{i}", function=Function(name="bash", arguments='{"command":"true"}')
                )
            ],
        )
        for i in range(turns + 1)
    ]
    model = FakeModelClient(script)
    recorder = EventRecorder(config.run_id, config.task_id, config.model)
    per_turn: list[float] = []
    overhead: list[float] = []
    async with open_toolbox(config, BenchTask(config)) as box:
        await box.call("bash", {"command": "true"})
        messages = [Message(role="system", content="bench"), Message(role="user", content="go")]
        limits = StepLimits(max_turns=turns + 1, deadline=time.monotonic() + 3600)
        last = time.perf_counter()

        def emit(event: Any) -> None:
            nonlocal last
            recorder.emit(event)
            if isinstance(event, ToolCallCompleted):
                now = time.perf_counter()
                per_turn.append(now - last)
                overhead.append(now - last - event.duration_s)
                last = now

        await run_agent_step(model, box, messages, limits, 0, emit)
    return per_turn[1:], overhead[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--student-user", default=None, help="act as this user (needs root)")
    args = parser.parse_args()
    config = EvaluationRunConfig(task_id="bench", student_user=args.student_user)

    toolbox, memory, session, fresh = asyncio.run(bench_interleaved(config, args.calls))
    turns, overhead = asyncio.run(bench_agent_turns(config, args.calls))

    print(line("bash tool `true` via MCP ToolBox", toolbox))
    print(line("  same, SDK InMemoryTransport (JSON-RPC)", memory))
    print(line("bash session `true` (no MCP)", session))
    print(line('subprocess.run(["bash","-c","true"])', fresh))
    print(line("agent loop turn (fake model + bash true)", turns))
    print(line("  of which harness overhead (turn - tool call)", overhead))
    print(
        f"fresh bash p50 / persistent tool p50 = {pct(fresh, 0.5) / pct(toolbox, 0.5):.1f}x; "
        f"MCP layer adds {pct(toolbox, 0.5) - pct(session, 0.5):.3f} ms at p50"
    )


if __name__ == "__main__":
    main()
