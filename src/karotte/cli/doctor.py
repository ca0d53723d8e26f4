"""``karotte doctor``: which sandbox runtimes work on this machine, how strongly each isolates,
and the exact fix for each missing piece (``--json`` for scripts)."""

from __future__ import annotations

import json
import time
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from karotte.cli import app

# how strongly a runtime isolates the student from the host, weakest first
ISOLATION: dict[str, tuple[int, str, str]] = {
    "none": (0, "none", "runs in the karotte process itself: no isolation at all"),
    "runc": (
        1,
        "container",
        "shares the host kernel (namespaces, cgroups, seccomp, dropped capabilities)",
    ),
    "gvisor": (
        2,
        "user-space kernel",
        "gVisor's kernel in user space answers the student's syscalls; the host kernel sees few",
    ),
    "firecracker": (3, "VM", "its own guest kernel in a Firecracker microVM (KVM)"),
    "qemu": (3, "VM", "its own guest kernel in a QEMU microvm (KVM or the TCG software CPU)"),
    "apple-container": (
        3,
        "VM",
        "its own guest kernel: Apple's Virtualization framework, one VM per container",
    ),
}


def _isolation(kind: str) -> tuple[int, str, str]:
    return ISOLATION.get(kind, (-1, "unknown", f"sandbox kind {kind!r}"))


def runtime_report() -> list[dict[str, Any]]:
    """One entry per registered runtime: works?, why not, the fix, isolation, and (where the
    runtime can say) each piece it needs."""
    from karotte.host.runtimes import get_runtime, runtime_names

    rows: list[dict[str, Any]] = []
    for name in runtime_names():
        started = time.monotonic()
        runtime = get_runtime(name)
        try:
            availability = runtime.availability()
            works, reason, fix = availability.ok, availability.reason, availability.fix
        except Exception as exc:  # a probe that crashes is a finding, not a doctor crash
            works, reason, fix = False, f"availability check failed: {exc}", ""
        strength, level, detail = _isolation(runtime.sandbox_kind)
        row: dict[str, Any] = {
            "runtime": name,
            "works": works,
            "reason": reason,
            "fix": fix,  # a working runtime may carry a warning and its fix
            "sandbox_kind": runtime.sandbox_kind,
            "isolation": level,
            "isolation_strength": strength,
            "isolation_detail": detail,
            "check_ms": round((time.monotonic() - started) * 1000, 1),
        }
        diagnose = getattr(runtime, "diagnose", None)
        if callable(diagnose):
            row["pieces"] = diagnose()
        rows.append(row)
    return rows


def doctor_report(refresh_probe: bool = False) -> dict[str, Any]:
    from karotte.host.boot_probe import firecracker_boot_probe
    from karotte.host.runtimes.selection import select_default_runtime

    probe = firecracker_boot_probe(refresh=refresh_probe)
    runtimes = runtime_report()
    default, why = select_default_runtime()
    default_row = next((row for row in runtimes if row["runtime"] == default), None)
    return {
        "default_runtime": {
            "runtime": default,
            "why": why,
            "works": bool(default_row and default_row["works"]),
        },
        "runtimes": runtimes,
        "firecracker_boot_probe": probe.model_dump(),
    }


@app.command("doctor")
def doctor_command(
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    refresh: bool = typer.Option(
        False, "--refresh", help="Run the Firecracker boot probe again instead of its cache."
    ),
) -> None:
    """Which sandbox runtimes work here, how strongly they isolate, and how to fix the rest."""
    report = doctor_report(refresh_probe=refresh)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        _print(report)
    raise typer.Exit(0 if report["default_runtime"]["works"] else 1)


def _print(report: dict[str, Any]) -> None:
    console = Console(highlight=False, soft_wrap=True)
    rows = sorted(report["runtimes"], key=lambda r: (-r["isolation_strength"], r["runtime"]))
    table = Table(title="sandbox runtimes on this machine", title_justify="left")
    table.add_column("runtime", style="bold", no_wrap=True)
    table.add_column("works here", no_wrap=True)
    table.add_column("isolation", no_wrap=True)
    for row in rows:
        works = "[green]yes[/]" if row["works"] else "[red]no[/]"
        table.add_row(row["runtime"], works, f"{row['isolation_strength']} {row['isolation']}")
    console.print(table)
    console.print("isolation: 3 VM (own kernel) > 2 user-space kernel > 1 container > 0 none\n")
    for row in rows:
        head = "[green]works[/]" if row["works"] else "[red]does not work here[/]"
        console.print(
            f"[bold]{escape(row['runtime'])}[/] {head}; {escape(row['isolation_detail'])}"
        )
        if row["reason"] and not row.get("pieces"):
            console.print(f"  {escape(row['reason'])}")
        if row["fix"] and not row.get("pieces"):
            console.print(f"  [bold]fix:[/] {escape(row['fix'])}")
        for piece in row.get("pieces", []):
            mark = "[green]ok[/]     " if piece["ok"] else "[red]missing[/]"
            console.print(f"  {mark} {escape(piece['piece'])}: {escape(piece['detail'])}")
            if not piece["ok"] and piece.get("fix"):
                console.print(f"          [bold]fix:[/] {escape(piece['fix'])}")
    default = report["default_runtime"]
    state = "[green]works[/]" if default["works"] else "[red]does not work here[/]"
    console.print(
        f"\ndefault runtime: [bold]{escape(default['runtime'])}[/] ({state}): "
        f"{escape(default['why'])}"
    )
    probe = report["firecracker_boot_probe"]
    cached = ", cached" if probe.get("cached") else ""
    console.print(
        f"firecracker boot probe: {'[green]boots[/]' if probe['ok'] else '[red]no[/]'} "
        f"({probe['stage']}{cached}, {probe['duration_s']:.1f} s); "
        "`karotte doctor --refresh` probes again"
    )
