"""``karotte create-env``, ``karotte templates list``, ``karotte update``."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from karotte.cli import app
from karotte.cli._common import err_console, fail, friendly_errors

templates_app = typer.Typer(help="Environment templates.", no_args_is_help=True)
app.add_typer(templates_app, name="templates")


@app.command("create-env")
def create_env_command(
    directory: Path = typer.Argument(..., help="New (or empty) directory for the environment."),
    template: list[str] = typer.Option(
        ["default"],
        "--template",
        "-t",
        help="Template id; repeat to stack templates (rendered in order, requirements first).",
    ),
    name: str | None = typer.Option(
        None, "--name", help="Environment name (default: the directory's name)."
    ),
    karotte_from_index: bool = typer.Option(
        False,
        "--karotte-from-index",
        help="Depend on a released karotte from the package index instead of a wheel of this one.",
    ),
    no_lock: bool = typer.Option(False, "--no-lock", help="Do not run `uv lock`."),
    agent: list[str] = typer.Option(
        [],
        "--agent",
        help="A coding-agent CLI to install into the image (e.g. claude-code, codex); "
        "repeatable. See `karotte agents list`.",
    ),
) -> None:
    """Create an environment from templates (default: the `default` template)."""
    from karotte.host.create_env import create_env

    with friendly_errors():
        created = create_env(
            directory,
            template,
            name=name,
            karotte_from_index=karotte_from_index,
            lock=not no_lock,
            agents=agent,
        )
    for warning in created.warnings:
        err_console.print(f"[bold yellow]warning:[/] {escape(warning)}")
    source = created.manifest.karotte_source
    origin = source.path if source.kind == "wheel" else "the package index"
    err_console.print(
        f"[green]created[/] {escape(str(created.path))} "
        f"(templates: {', '.join(created.manifest.templates)}; karotte {source.version} from "
        f"{escape(str(origin))})\nnext:\n  cd {escape(str(directory))}\n  uv sync --extra dev\n"
        "  uv run setup_data.py\n  uv run karotte tasks list\n  uv run just test"
    )


@templates_app.command("list")
def list_templates(
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """List the templates on this machine (Karotte's and those of installed packages)."""
    from karotte.host.templates import discover_templates

    with friendly_errors():
        templates = discover_templates()
    rows = [
        {
            "id": t.id,
            "description": t.spec.description,
            "requires": t.spec.requires,
            "distribution": t.distribution,
            "distribution_version": t.distribution_version,
            "path": str(t.path),
        }
        for t in templates.values()
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table("id", "description", "requires", "from")
    for row in rows:
        table.add_row(
            str(row["id"]),
            str(row["description"]),
            ", ".join(row["requires"]),  # type: ignore[arg-type]
            str(row["distribution"]),
        )
    err_console.print(table)


@app.command("update")
def update_command(
    directory: Path = typer.Argument(Path("."), help="The environment (default: here)."),
    add_template: list[str] = typer.Option(
        [], "--add-template", "-a", help="Add a template to the environment; repeatable."
    ),
    no_lock: bool = typer.Option(False, "--no-lock", help="Do not run `uv lock` afterwards."),
) -> None:
    """Merge the current templates into an environment; your edits survive, conflicts are listed.

    Exits with 1 when a file has conflicts (marked with <<<<<<< / >>>>>>> in the file).
    """
    from karotte.host.update import update_env

    with friendly_errors():
        report = update_env(directory, add_template, lock=not no_lock)
    styles = {"conflict": "bold red", "kept-modified": "yellow", "removed": "magenta"}
    for change in report.changes:
        style = styles.get(change.action, "green")
        detail = f" ({escape(change.detail)})" if change.detail else ""
        err_console.print(f"[{style}]{change.action:>13}[/] {escape(change.path)}{detail}")
    if report.lock is not None and not report.lock.ok:
        err_console.print(f"[bold yellow]warning:[/] {escape(report.lock.message)}")
    if not report.changes:
        err_console.print("[green]up to date[/]: the templates changed nothing")
    if report.conflicts:
        raise fail(
            f"{len(report.conflicts)} file(s) have conflicts; resolve the <<<<<<< / >>>>>>> "
            f"markers in: {', '.join(report.conflicts)}",
            code=1,
        )
