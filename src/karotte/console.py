"""Rich rendering of transcript events for humans (used by the harness and the host launcher)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from karotte.events import (
    ErrorOccurred,
    Event,
    HookCompleted,
    LimitsApplied,
    MessageAdded,
    ScoringCompleted,
    StepCompleted,
    StepStarted,
    TaskCompleted,
    TaskStarted,
    ToolCallCompleted,
    ToolCallStarted,
)

_MAX = 600


def _short(text: str, limit: int = _MAX) -> str:
    text = text.rstrip()
    return text if len(text) <= limit else f"{text[:limit]}… [{len(text) - limit} more chars]"


class EventPrinter:
    """Prints one line or block per event. ``prefix`` tags parallel runs."""

    def __init__(self, console: Console | None = None, prefix: str = "") -> None:
        self.console = console or Console(stderr=True, highlight=False)
        self.prefix = f"[dim]{escape(prefix)}[/] " if prefix else ""

    def __call__(self, event: Event) -> None:
        p, out = self.prefix, self.console.print
        if isinstance(event, TaskStarted):
            out(
                f"{p}[bold]▶ task {escape(event.task_id)}[/] run {escape(event.run_id)} "
                f"model {escape(event.model)} ({event.step_count} steps, tools: "
                f"{', '.join(event.tools)})"
            )
        elif isinstance(event, StepStarted):
            out(
                f"{p}[bold cyan]── step {event.step_index}[/]\n{escape(_short(event.instructions))}"
            )
        elif isinstance(event, MessageAdded):
            text = event.message.text()
            if event.message.role == "assistant" and text:
                out(f"{p}[green]assistant:[/] {escape(_short(text))}")
            elif event.message.role == "user":
                out(f"{p}[yellow]user:[/] {escape(_short(text))}")
        elif isinstance(event, ToolCallStarted):
            out(
                f"{p}[magenta]→ {escape(event.name)}[/] {escape(_short(str(event.arguments), 300))}"
            )
        elif isinstance(event, ToolCallCompleted):
            style = "red" if event.is_error else "dim"
            out(
                f"{p}[{style}]← {escape(_short(event.output, 400))}[/] "
                f"[dim]({event.duration_s * 1000:.0f} ms)[/]"
            )
        elif isinstance(event, ScoringCompleted):
            why = event.metadata.get("misbehavior")
            extra = f" [red]misbehavior: {escape(str(why))}[/]" if why else ""
            out(f"{p}[bold]score {event.score:g}[/] (step {event.step_index}){extra}")
        elif isinstance(event, StepCompleted):
            out(
                f"{p}[dim]step {event.step_index} done: {event.stop_reason}, "
                f"{event.turns} turns, {event.duration_s:.1f}s[/]"
            )
        elif isinstance(event, HookCompleted) and event.result:
            out(f"{p}[dim]{event.hook}: {escape(_short(str(event.result), 300))}[/]")
        elif isinstance(event, LimitsApplied):
            out(f"{p}[dim]limits: {escape(_short(str(event.limits), 400))}[/]")
        elif isinstance(event, ErrorOccurred):
            out(f"{p}[bold red]error ({event.kind}):[/] {escape(event.message)}")
        elif isinstance(event, TaskCompleted):
            colour = {"passed": "green", "failed": "yellow", "error": "red"}[event.status]
            kind = f" ({event.error_kind})" if event.error_kind else ""
            out(
                f"{p}[bold {colour}]■ {event.status}{kind}[/] score {event.score:g} "
                f"scores {event.scores} in {event.duration_s:.1f}s, tokens in/out "
                f"{event.usage.input_tokens}/{event.usage.output_tokens}"
            )
