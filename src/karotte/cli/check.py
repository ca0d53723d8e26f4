"""``karotte check``: load every task and tool (and, in an image, verify its permission model)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from karotte.cli import app
from karotte.cli._common import err_console, fail, friendly_errors
from karotte.config import EvaluationRunConfig
from karotte.discovery import load_tasks

check_app = typer.Typer(help="Check the environment (and sandbox).", invoke_without_command=True)
app.add_typer(check_app, name="check")


def _check_tasks() -> list[str]:
    from karotte.sandbox.tools.registry import check_task_tools

    with friendly_errors():
        tasks = load_tasks()
    problems: list[str] = []
    for task_id, cls in sorted(tasks.items()):
        for use_hints in (False, True):
            config = EvaluationRunConfig(task_id=task_id, use_hints=use_hints)
            try:
                task = cls(config)
                steps = task.steps
                _ = task.system_prompt, task.required_hardware
                check_task_tools(config, task)  # tool names exist, options are valid
                for step in steps:
                    _ = step.instructions, step.judge, step.submission_paths
            except Exception as exc:
                hints = " (with use_hints)" if use_hints else ""
                problems.append(f"task {task_id}{hints}: {type(exc).__name__}: {exc}")
                break
    if not problems:
        err_console.print(f"[green]ok[/]: {len(tasks)} task(s) load")
    return problems


@check_app.callback()
def check(
    ctx: typer.Context,
    image: bool = typer.Option(
        False,
        "--image",
        help="Also verify the image: the permission model as the real student user, and no "
        "leaked credentials (run as root, as the Containerfile's last step).",
    ),
    root: Path = typer.Option(Path("/"), "--root", hidden=True, help="Root of the image tree."),
    student: str = typer.Option("student", "--student", hidden=True, help="The student user."),
) -> None:
    """Load every task and tool; fail on any that does not load, with the error."""
    if ctx.invoked_subcommand is not None:
        return
    problems = _check_tasks()
    if image:
        from karotte.sandbox.image_check import ImageLayout, check_image

        layout = ImageLayout(root=root, student=student)
        findings = check_image(layout)
        problems.extend(str(f) for f in findings)
        if not findings:
            err_console.print("[green]ok[/]: permission model and credential scan")
    if problems:
        for problem in problems:
            err_console.print(f"[bold red]✗[/] {escape(problem)}")
        raise fail(f"{len(problems)} problem(s) found", code=1)


@check_app.command("confinement")
def check_confinement(
    json_output: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Measure what this sandbox enforces for the student (as root); exit 1 if too little."""
    from karotte.sandbox.confinement.selfcheck import render_selfcheck, run_selfcheck

    try:
        report = run_selfcheck()
    except PermissionError as exc:
        raise fail(str(exc), code=1) from exc
    render_selfcheck(report, json_output)
    if not report.ok:
        raise typer.Exit(1)
