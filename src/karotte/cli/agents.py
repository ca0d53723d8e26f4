"""``karotte agents list/add/remove``: the coding-agent CLIs an environment's image installs
(for runs with ``agent: cli:<name>``; see docs/cli-agents.md)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from karotte.cli import app
from karotte.cli._common import err_console, friendly_errors

agents_app = typer.Typer(
    help="Coding-agent CLIs (Claude Code, Codex, ...) installed into an environment's image.",
    no_args_is_help=True,
)
app.add_typer(agents_app, name="agents")

ENV_OPTION = typer.Option(
    Path("."), "--env", "-e", help="The environment directory (default: the current one)."
)


@agents_app.command("list")
def list_agents(
    env: Path = ENV_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Every known adapter (built-in and plugins), and which the environment installs."""
    from karotte.sandbox.cli_agents.containerfile import CONTAINERFILE, agents_in_env
    from karotte.sandbox.cli_agents.registry import all_adapters

    with friendly_errors():
        adapters = all_adapters()
        in_env = (
            {s.name: s.version for s in agents_in_env(env)}
            if (env / CONTAINERFILE).is_file()
            else None
        )
    rows = [
        {
            "name": a.name,
            "agent": f"cli:{a.name}",
            "package": a.package,
            "version": a.version,
            "provider": a.provider,
            "in_environment": None if in_env is None else in_env.get(a.name),
        }
        for a in adapters.values()
    ]
    unknown = sorted(set(in_env or {}) - set(adapters))
    if as_json:
        typer.echo(json.dumps({"agents": rows, "unknown_in_environment": unknown}, indent=2))
        return
    table = Table("agent", "package", "pinned", "provider", "in this environment")
    for row in rows:
        installed = row["in_environment"]
        shown = "-" if in_env is None else (f"yes ({installed})" if installed else "no")
        table.add_row(row["agent"], row["package"], row["version"], row["provider"], escape(shown))
    Console().print(table)
    for name in unknown:
        err_console.print(
            f"[yellow]warning:[/] the Containerfile installs {escape(name)!r}, which no "
            "installed adapter knows"
        )


@agents_app.command("add")
def add_agents_command(
    names: list[str] = typer.Argument(..., help="Adapter names, e.g. claude-code codex."),
    env: Path = ENV_OPTION,
    no_fetch: bool = typer.Option(
        False, "--no-fetch", help="Only edit the Containerfile; run `karotte agents fetch` later."
    ),
) -> None:
    """Add (or upgrade to the pinned version) agents: install them into .karotte/agents/ on this
    machine and add the step that copies them into the image to the Containerfile."""
    from karotte.sandbox.cli_agents.containerfile import add_agents
    from karotte.sandbox.cli_agents.registry import get_adapter

    with friendly_errors():
        adapters = [get_adapter(n) for n in names]
        add_agents(env, adapters, fetch=not no_fetch)
    for adapter in adapters:
        err_console.print(
            f"[green]added[/] {adapter.name} ({adapter.package} {adapter.version}); rebuild the "
            f"image (`karotte build`) and run with agent 'cli:{adapter.name}'"
        )


@agents_app.command("remove")
def remove_agents_command(
    names: list[str] = typer.Argument(..., help="Adapter names to remove."),
    env: Path = ENV_OPTION,
) -> None:
    """Remove agents' install steps from the Containerfile."""
    from karotte.sandbox.cli_agents.containerfile import remove_agents

    with friendly_errors():
        remove_agents(env, names)
    err_console.print(f"[green]removed[/] {', '.join(names)}; rebuild the image")


@agents_app.command("fetch")
def fetch_agents_command(env: Path = ENV_OPTION) -> None:
    """Install the environment's agents into .karotte/agents/ on this machine (after a fresh
    clone, or to repair it); the image build copies them from there."""
    from karotte.sandbox.cli_agents.containerfile import agents_in_env, stage_agent
    from karotte.sandbox.cli_agents.registry import get_adapter

    with friendly_errors():
        for section in agents_in_env(env):
            adapter = get_adapter(section.name)
            if adapter.version != section.version:
                err_console.print(
                    f"[yellow]warning:[/] the Containerfile pins {escape(section.name)} "
                    f"{escape(section.version)}, the adapter {escape(adapter.version)}; run "
                    f"`karotte agents add {escape(section.name)}` to update the section"
                )
            fetched = stage_agent(env, adapter)
            state = "installed" if fetched else "up to date"
            err_console.print(f"[green]{state}[/] {escape(adapter.name)} {escape(adapter.version)}")
