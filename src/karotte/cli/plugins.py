"""``karotte plugins list``: which installed packages extend Karotte, and which are broken."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from karotte import plugins
from karotte.cli import app

plugins_app = typer.Typer(help="Installed plugins (entry points).", no_args_is_help=True)
app.add_typer(plugins_app, name="plugins")


@plugins_app.command("list")
def list_plugins(
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Every plugin of every group, in the order Karotte uses them, and whether it loads."""
    rows = []
    for plugin in plugins.installed():
        problem = plugins.load_problem(plugin.group, plugin.name)
        rows.append({**plugin.model_dump(), "loads": problem is None, "problem": problem})
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo("no plugins installed (see docs/plugins.md)")
        return
    table = Table("group", "name", "target", "package", "loads")
    for row in rows:
        loads = "yes" if row["loads"] else f"[red]no[/]: {escape(str(row['problem']))}"
        table.add_row(row["group"], row["name"], row["value"], row["distribution"], loads)
    Console().print(table)
