"""How the launcher shows its runs: one run's events as they come, or for ``-n N`` a live table
(one row per run) with the important events printed above it. ``--no-ui`` prints plain lines."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from karotte.console import EventPrinter
from karotte.events import (
    ErrorOccurred,
    Event,
    MessageAdded,
    ScoringCompleted,
    StepStarted,
    TaskCompleted,
    ToolCallCompleted,
)

if TYPE_CHECKING:
    from karotte.host.launcher import RunSlot

_STATE_STYLE = {
    "pending": "dim",
    "starting": "cyan",
    "running": "cyan",
    "passed": "green",
    "failed": "yellow",
    "error": "red",
}


class PlainDisplay:
    """Every event through :class:`EventPrinter`; sandbox logs (stderr, non-JSON stdout) dimmed."""

    def __init__(self, prefix_runs: bool = False, colour: bool = True) -> None:
        self.console = Console(stderr=True, highlight=False, no_color=not colour)
        self.prefix_runs = prefix_runs
        self._printers: dict[str, EventPrinter] = {}
        self._lock = threading.Lock()

    def _printer(self, slot: RunSlot) -> EventPrinter:
        if slot.label not in self._printers:
            prefix = slot.label if self.prefix_runs else ""
            self._printers[slot.label] = EventPrinter(self.console, prefix=prefix)
        return self._printers[slot.label]

    def event(self, slot: RunSlot, event: Event) -> None:
        with self._lock:
            self._printer(slot)(event)

    def log(self, slot: RunSlot, line: str) -> None:
        prefix = f"{escape(slot.label)} " if self.prefix_runs else ""
        with self._lock:
            self.console.print(f"[dim]{prefix}{escape(line)}[/]", soft_wrap=True)

    def message(self, text: str) -> None:
        with self._lock:
            self.console.print(escape(text), soft_wrap=True)

    def update(self, slot: RunSlot) -> None:
        pass

    @contextlib.contextmanager
    def active(self, slots: list[RunSlot]) -> Iterator[None]:
        yield


class _Progress:
    def __init__(self) -> None:
        self.step = "-"
        self.turns = 0
        self.tool_calls = 0
        self.score = "-"


class LiveDisplay:
    """``-n N`` with a terminal: a live table of the runs; results and errors printed above it."""

    def __init__(self) -> None:
        self.console = Console(stderr=True, highlight=False)
        self._slots: list[RunSlot] = []
        self._progress: dict[str, _Progress] = {}
        self._live: Live | None = None
        self._lock = threading.Lock()

    def _table(self) -> Table:
        table = Table(expand=False, show_edge=False, pad_edge=False)
        for column in ("run", "state", "step", "turns", "tools", "score", "last event"):
            table.add_column(column)
        for slot in self._slots:
            progress = self._progress.setdefault(slot.label, _Progress())
            style = _STATE_STYLE.get(slot.state, "")
            table.add_row(
                escape(slot.label),
                f"[{style}]{slot.state}[/]" if style else slot.state,
                progress.step,
                str(progress.turns),
                str(progress.tool_calls),
                progress.score,
                escape(slot.detail),
            )
        return table

    def event(self, slot: RunSlot, event: Event) -> None:
        with self._lock:
            progress = self._progress.setdefault(slot.label, _Progress())
            if isinstance(event, StepStarted):
                progress.step = str(event.step_index)
            elif isinstance(event, MessageAdded) and event.message.role == "assistant":
                progress.turns += 1
            elif isinstance(event, ToolCallCompleted):
                progress.tool_calls += 1
            elif isinstance(event, ScoringCompleted):
                progress.score = f"{event.score:g}"
            if isinstance(event, ErrorOccurred | TaskCompleted):
                EventPrinter(self.console, prefix=slot.label)(event)
            self._refresh()

    def log(self, slot: RunSlot, line: str) -> None:
        pass  # too noisy for N runs; the transcripts (and --no-ui) have them

    def message(self, text: str) -> None:
        with self._lock:
            self.console.print(escape(text))

    def update(self, slot: RunSlot) -> None:
        with self._lock:
            self._refresh()

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._table())

    @contextlib.contextmanager
    def active(self, slots: list[RunSlot]) -> Iterator[None]:
        self._slots = slots
        with Live(self._table(), console=self.console, refresh_per_second=4) as live:
            self._live = live
            try:
                yield
            finally:
                self._refresh()
                self._live = None
