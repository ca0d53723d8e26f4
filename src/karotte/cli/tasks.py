"""``karotte tasks list``."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from karotte.cli import app
from karotte.cli._common import err_console, friendly_errors
from karotte.config import EvaluationRunConfig
from karotte.discovery import load_tasks

tasks_app = typer.Typer(help="List the environment's tasks.", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")


@tasks_app.command("list")
def list_tasks(
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """List the tasks of the installed environment."""
    with friendly_errors():
        tasks = load_tasks()
    rows = []
    for task_id, cls in sorted(tasks.items()):
        row: dict[str, object] = {"id": task_id, "class": f"{cls.__module__}.{cls.__qualname__}"}
        try:
            task = cls(EvaluationRunConfig(task_id=task_id))
            row["steps"] = len(task.steps)
            row["tools"] = list(task.tools)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table("id", "steps", "tools", "class")
    for row in rows:
        table.add_row(
            str(row["id"]),
            str(row.get("steps", "-")),
            ", ".join(row.get("tools", [])) or str(row.get("error", "")),  # type: ignore[arg-type]
            str(row["class"]),
        )
    err_console.print(table)
