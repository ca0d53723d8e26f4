"""``karotte clean``: remove what killed launchers left behind (sandboxes, student cgroups)."""

from __future__ import annotations

import typer
from rich.markup import escape

from karotte.cli import app
from karotte.cli._common import err_console, fail


@app.command("clean")
def clean(
    runtime: list[str] = typer.Option(
        [], "--runtime", "-r", help="Only these runtimes (default: every available one)."
    ),
    kept: bool = typer.Option(
        False, "--kept", help="Also remove sandboxes left by --keep-containers."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would be removed."),
) -> None:
    """Remove sandboxes whose launcher is gone (killed), and their leftover student cgroup dirs
    and host disk quotas."""
    from karotte.errors import KarotteError
    from karotte.host import reaper
    from karotte.host.runtimes import Runtime, disk_delegation, get_runtime, runtime_names
    from karotte.host.runtimes.base import LABEL_LAUNCHER_PID, LABEL_RUN_ID
    from karotte.host.runtimes.cgroup_delegation import remove_dirs

    names = runtime or [n for n in runtime_names() if n != "local"]
    engines: list[Runtime] = []
    for name in names:
        try:
            engine = get_runtime(name)
        except KarotteError as exc:
            raise fail(str(exc)) from None
        availability = engine.availability()
        if not availability.ok:
            if runtime:  # asked for explicitly: say why it cannot be cleaned
                raise fail(f"{name}: {availability.reason}\nfix: {availability.fix}")
            continue
        if name == "docker:gvisor" and any(e.name == "docker" for e in engines):
            continue  # the same engine as docker: its sandboxes are listed there already
        engines.append(engine)
    removed = 0
    problems: list[str] = []
    for engine in engines:
        found = reaper.orphans(engine, include_kept=kept)
        for sandbox in found:
            verb = "would remove" if dry_run else "removing"
            err_console.print(
                f"{verb} {escape(sandbox.name)} ({engine.name}, run "
                f"{escape(sandbox.labels.get(LABEL_RUN_ID, '?'))}, launcher pid "
                f"{escape(sandbox.labels.get(LABEL_LAUNCHER_PID, '?'))})"
            )
        if found and not dry_run:
            problems += reaper.remove_sandboxes(engine, found)
        removed += len(found)
    stale = reaper.stale_cgroup_dirs(engines)
    for run_name, dirs in sorted(stale.items()):
        err_console.print(
            f"{'would remove' if dry_run else 'removing'} student cgroup dirs of {escape(run_name)}"
        )
        if not dry_run:
            problems += [f"could not remove {d}" for d in remove_dirs(dirs, attempts=3)]
    stale_disks = reaper.stale_disks()
    for run_name, run_dir in sorted(stale_disks.items()):
        err_console.print(
            f"{'would remove' if dry_run else 'removing'} the disk quota of {escape(run_name)} "
            f"({escape(str(run_dir))})"
        )
        if not dry_run:
            problems += disk_delegation.remove_run_dir(run_dir)
    for problem in problems:
        err_console.print(f"[yellow]warning:[/] {escape(problem)}")
    what = "to remove" if dry_run else "removed"
    err_console.print(
        f"{removed} sandbox(es), {len(stale)} cgroup set(s) and {len(stale_disks)} disk "
        f"quota(s) {what} "
        f"({', '.join(e.name for e in engines) or 'no runtime available'})"
    )
    if problems:
        raise typer.Exit(1)
