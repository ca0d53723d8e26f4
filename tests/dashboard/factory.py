"""Transcripts for the dashboard's tests and benchmark, built from the real event models and
written by the harness's own recorder (so the files have exactly the harness's format)."""

from __future__ import annotations

import base64
import json
import struct
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from karotte.errors import ErrorKind
from karotte.events import (
    ErrorOccurred,
    Event,
    HookCompleted,
    LimitsApplied,
    MessageAdded,
    RunStatus,
    ScoringCompleted,
    StepCompleted,
    StepStarted,
    TaskCompleted,
    TaskStarted,
    TokenUsage,
    ToolCallCompleted,
    ToolCallStarted,
)
from karotte.sandbox.transcript import EventRecorder
from karotte.schemas import Message, assistant, tool_call


def png(width: int = 48, height: int = 32) -> bytes:
    """A small checkered RGB PNG (so an inline image is visible in screenshots)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    orange, cream = bytes((230, 90, 30)), bytes((250, 240, 220))
    rows = b"".join(
        b"\x00" + b"".join(orange if (x // 8 + y // 8) % 2 else cream for x in range(width))
        for y in range(height)
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


PNG_B64 = base64.b64encode(png()).decode()


def run_events(
    *,
    run_id: str,
    task_id: str = "demo-task",
    model: str = "openai/gpt-test",
    scores: Sequence[float | None] = (1.0,),
    misbehavior: dict[int, str] | None = None,
    tool_calls_per_step: int = 1,
    output_chars: int = 40,
    error: tuple[ErrorKind, str] | None = None,
    started_at: float | None = None,
    with_image: bool = False,
    complete: bool = True,
) -> list[Event]:
    """The events of one run, in the order the harness emits them (seq set by the recorder)."""
    misbehavior = misbehavior or {}
    if started_at is None:
        started_at = time.time() - 600
    clock = [started_at]

    def at(dt: float = 0.01) -> float:
        clock[0] += dt
        return clock[0]

    events: list[Event] = [
        TaskStarted(
            timestamp=at(0),
            run_id=run_id,
            task_id=task_id,
            model=model,
            karotte_version="0.0.0-test",
            system_prompt=f"You are solving {task_id}. Be careful.",
            tools=["bash", "view_image_file"],
            step_count=len(scores),
            config={"run_id": run_id, "task_id": task_id, "model": model, "max_turns": 50},
        ),
        LimitsApplied(timestamp=at(), limits={"memory": "cgroup", "pids": "cgroup"}),
        HookCompleted(timestamp=at(), hook="pre_hook", result={"prepared": True}),
    ]
    usage = TokenUsage()
    for index, score in enumerate(scores):
        if score is None:
            break
        events.append(
            StepStarted(timestamp=at(), step_index=index, instructions=f"Step {index}: do it.")
        )
        events.append(
            MessageAdded(
                timestamp=at(),
                step_index=index,
                message=Message(role="user", content=f"Step {index}: do it."),
            )
        )
        for call in range(tool_calls_per_step):
            call_id = f"call_{index}_{call}"
            command = f"echo step{index}-call{call}"
            turn_usage = TokenUsage(input_tokens=100 + call, output_tokens=10)
            usage = usage + turn_usage
            events.append(
                MessageAdded(
                    timestamp=at(),
                    step_index=index,
                    message=assistant(
                        f"Running call {call}.", [tool_call(call_id, "bash", command=command)]
                    ),
                    usage=turn_usage,
                    model_latency_s=0.5,
                )
            )
            events.append(
                ToolCallStarted(
                    timestamp=at(),
                    step_index=index,
                    call_id=call_id,
                    name="bash",
                    arguments={"command": command},
                )
            )
            output = (f"step{index}-call{call} " * (output_chars // 12 + 1))[:output_chars]
            events.append(
                ToolCallCompleted(
                    timestamp=at(0.25),
                    step_index=index,
                    call_id=call_id,
                    name="bash",
                    output=output,
                    duration_s=0.25,
                )
            )
            content: str | list[dict[str, Any]] = output
            if with_image and call == 0:
                content = [
                    {"type": "text", "text": output},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}},
                ]
            events.append(
                MessageAdded(
                    timestamp=at(),
                    step_index=index,
                    message=Message(
                        role="tool", tool_call_id=call_id, name="bash", content=content
                    ),
                )
            )
        final_usage = TokenUsage(input_tokens=200, output_tokens=5)
        usage = usage + final_usage
        events.append(
            MessageAdded(
                timestamp=at(),
                step_index=index,
                message=assistant("Done."),
                usage=final_usage,
                model_latency_s=0.4,
            )
        )
        metadata: dict[str, Any] = {"judge": "exact"}
        if index in misbehavior:
            metadata["misbehavior"] = misbehavior[index]
        events.append(
            ScoringCompleted(
                timestamp=at(),
                step_index=index,
                score=score,
                metadata=metadata,
                continue_task=True,
                duration_s=0.01,
            )
        )
        events.append(
            StepCompleted(
                timestamp=at(),
                step_index=index,
                stop_reason="model_done",
                score=score,
                turns=tool_calls_per_step + 1,
                duration_s=1.0,
            )
        )
    if error is not None:
        events.append(ErrorOccurred(timestamp=at(), kind=error[0], message=error[1]))
    if not complete:
        return events
    ran = [s for s in scores if s is not None]
    status: RunStatus
    kind: ErrorKind | None
    if error is not None:
        status, kind = "error", error[0]
    elif misbehavior:
        status, kind = "failed", ErrorKind.MISBEHAVIOR
    else:
        passed = bool(scores) and all(s is not None and s >= 1.0 for s in scores)
        status, kind = ("passed" if passed else "failed"), None
    events.append(
        TaskCompleted(
            timestamp=at(),
            status=status,
            error_kind=kind,
            scores=list(scores),
            score=sum(ran) / len(scores) if scores else 0.0,
            duration_s=clock[0] - started_at,
            usage=usage,
        )
    )
    return events


def write_transcript(path: Path, events: list[Event], run_id: str | None = None) -> Path:
    """Write a transcript file the way the harness does (recorder + atomic write)."""
    first = events[0]
    assert isinstance(first, TaskStarted)
    recorder = EventRecorder(run_id or first.run_id, first.task_id, first.model)
    for event in events:
        recorder.emit(event.model_copy())
    recorder.write(path)
    return path


def make_run(directory: Path, name: str | None = None, **kwargs: Any) -> Path:
    """One complete transcript file ``<directory>/<name>.json`` (name defaults to the run id)."""
    events = run_events(**kwargs)
    return write_transcript(directory / f"{name or kwargs['run_id']}.json", events)


def append_jsonl(path: Path, events: Sequence[Event], start_seq: int = 0) -> None:
    """Append events as the harness's ``--events jsonl`` stream does (one object per line)."""
    with path.open("a", encoding="utf-8") as handle:
        for offset, event in enumerate(events):
            numbered = event.model_copy(update={"seq": start_seq + offset})
            handle.write(numbered.model_dump_json() + "\n")
            handle.flush()


def big_run(directory: Path, run_id: str = "big", n_events: int = 10_000) -> Path:
    """A transcript with about ``n_events`` events (many tool calls with varied output sizes)."""
    per_call = 4
    steps = 4
    calls = max(1, (n_events - 10) // (per_call * steps))
    return make_run(
        directory,
        run_id=run_id,
        scores=[1.0] * steps,
        tool_calls_per_step=calls,
        output_chars=600,
        started_at=time.time() - 3600,
    )


def dump(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data
