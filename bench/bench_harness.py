"""Harness overhead with the fake model: agent turns per second, in-process (no sandbox).

Runs a generated one-step task whose scripted model makes N tool calls (bash `true`) and then
answers, through the real harness, MCP tool server, bash session and transcript writer. Prints
turns/s and the per-turn overhead beyond the tool call itself, plus a step-only figure (a task of
N steps each answered without tools) for the cost of a step (events, scoring, hooks).

    uv run python bench/bench_harness.py [--turns 200] [--steps 100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ENV_INIT = textwrap.dedent("""
    from karotte import Step, Task
    from karotte.judges import AlwaysPassJudge

    class S(Step):
        @property
        def instructions(self):
            return "go"

        @property
        def judge(self):
            return AlwaysPassJudge()

    class Bench(Task):
        id = "bench"

        @property
        def system_prompt(self):
            return "bench"

        @property
        def steps(self):
            return [S(config=self.config) for _ in range(self.config.extra_config["steps"])]

    def get_tasks():
        return [Bench]
""")
FAKE_MODEL = textwrap.dedent("""
    from karotte.schemas import assistant, tool_call

    def get_messages(config):
        calls = [assistant(None, [tool_call(f"c{i}", "bash", command="true")])
                 for i in range(config.extra_config["turns"])]
        return calls + [assistant("done")] * config.extra_config["steps"]
""")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="karotte-bench-"))
    package = tmp / "environment"
    package.mkdir()
    (package / "__init__.py").write_text(ENV_INIT)
    (package / "fake_model.py").write_text(FAKE_MODEL)
    sys.path.insert(0, str(tmp))

    from karotte import EvaluationRunConfig
    from karotte.events import Transcript
    from karotte.sandbox.entry import run_harness

    def run(turns: int, steps: int) -> tuple[float, Transcript]:
        config = EvaluationRunConfig(
            task_id="bench",
            use_fake_model=True,
            max_turns=turns + 5,
            transcript_file=tmp / f"t{turns}-{steps}.json",
            extra_config={"turns": turns, "steps": steps},
        )
        started = time.perf_counter()
        done = run_harness(config, events="none")
        elapsed = time.perf_counter() - started
        assert done.status == "passed", done
        return elapsed, Transcript.model_validate_json(config.transcript_file.read_text())

    run(5, 1)  # warm-up: imports, first bash session
    base, _ = run(0, 1)
    tool_run, transcript = run(args.turns, 1)
    tool_times = [e.duration_s for e in transcript.events if e.type == "tool_call_completed"]
    per_turn = (tool_run - base) / args.turns
    tool_median = statistics.median(tool_times)
    steps_run, _ = run(0, args.steps)
    per_step = (steps_run - base) / max(args.steps - 1, 1)
    print(
        f"turns with a bash `true` call: {args.turns / (tool_run - base):.0f} turns/s "
        f"({per_turn * 1000:.2f} ms/turn; tool call itself p50 {tool_median * 1000:.2f} ms, "
        f"harness overhead {(per_turn - tool_median) * 1000:.2f} ms/turn)"
    )
    print(
        f"steps answered without tools: {1 / per_step:.0f} steps/s ({per_step * 1000:.2f} ms/step "
        "incl. events, scoring, hooks)"
    )
    print(f"fixed cost of a run (imports excluded): {base * 1000:.0f} ms")


if __name__ == "__main__":
    main()
