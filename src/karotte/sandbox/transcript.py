"""Records events: numbers them, forwards them to sinks (terminal, JSON lines, backend), and
writes the transcript file durably at the end."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from karotte.events import Event, TaskCompleted, Transcript
from karotte.io import write_text_atomic

EventSink = Callable[[Event], None]


class EventRecorder:
    """Collects the run's events in order. A failing sink never loses an event."""

    def __init__(self, run_id: str, task_id: str, model: str, sinks: list[EventSink] | None = None):
        self.transcript = Transcript(run_id=run_id, task_id=task_id, model=model)
        self.sinks = list(sinks or [])
        self.sink_errors: list[str] = []

    @property
    def events(self) -> list[Event]:
        return self.transcript.events

    def emit(self, event: Event) -> None:
        event.seq = len(self.transcript.events)
        self.transcript.events.append(event)
        if isinstance(event, TaskCompleted):
            self.transcript.status = event.status
            self.transcript.error_kind = event.error_kind
            self.transcript.score = event.score
        for sink in self.sinks:
            try:
                sink(event)
            except Exception as exc:  # a broken terminal or backend must not lose the run
                self.sink_errors.append(f"{type(exc).__name__}: {exc}")

    def write(self, path: Path) -> None:
        """Write the whole transcript: temp file, fsync, rename."""
        write_text_atomic(path, self.transcript.model_dump_json(indent=1) + "\n")


def jsonl_sink(stream: TextIO | None = None) -> EventSink:
    """One JSON object per line: the machine-readable event stream the host launcher reads."""
    out = stream or sys.stdout

    def sink(event: Event) -> None:
        out.write(event.model_dump_json() + "\n")
        out.flush()

    return sink
