"""``karotte check``: load every task and tool (and, in an image, verify its permission model)."""

from __future__ import annotations

import typer

from karotte.cli import app
from karotte.cli._common import err_console, fail, friendly_errors
from karotte.config import EvaluationRunConfig
from karotte.discovery import load_tasks

check_app = typer.Typer(help="Check the environment (and sandbox).", invoke_without_command=True)
app.add_typer(check_app, name="check")


@check_app.callback()
def check(ctx: typer.Context) -> None:
    """Load every task and tool; fail on any that does not load, with the error."""
    if ctx.invoked_subcommand is not None:
        return
    with friendly_errors():
        tasks = load_tasks()
    problems: list[str] = []
    for task_id, cls in sorted(tasks.items()):
        try:
            task = cls(EvaluationRunConfig(task_id=task_id))
            steps = task.steps
            _ = task.system_prompt, list(task.tools), task.required_hardware
            for step in steps:
                _ = step.instructions, step.judge, step.submission_paths
        except Exception as exc:
            problems.append(f"task {task_id}: {type(exc).__name__}: {exc}")
    if problems:
        raise fail("\n".join(problems), code=1)
    err_console.print(f"[green]ok[/]: {len(tasks)} task(s) load")
