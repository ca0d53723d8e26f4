"""``karotte models list`` (the model catalog)."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from karotte import catalog
from karotte.cli import app
from karotte.cli._common import fail

models_app = typer.Typer(
    help="The model catalog (limits and reasoning levels).", no_args_is_help=True
)
app.add_typer(models_app, name="models")


def _tokens(value: int | None) -> str:
    if value is None:
        return "-"
    if value % 1_000_000 == 0:
        return f"{value // 1_000_000}M"
    if value % 1000 == 0:
        return f"{value // 1000}k"
    return f"{value:,}"


@models_app.command("list")
def list_models(
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    provider: str | None = typer.Option(None, "--provider", "-p", help="Only this provider."),
    check: bool = typer.Option(
        False, "--check", help="Compare the limits with litellm's bundled model map."
    ),
) -> None:
    """List the curated models: ids as litellm takes them, limits and reasoning levels."""
    data = catalog.load_catalog()
    models = [m for m in data.models if provider is None or m.provider == provider]
    if provider is not None and not models:
        providers = sorted({m.provider for m in data.models})
        raise fail(f"no models of provider {provider!r}; known: {', '.join(providers)}")
    differences = {m.id: catalog.litellm_differences(m) for m in models} if check else {}
    if as_json:
        rows = []
        for info in models:
            row = info.model_dump(mode="json")
            if check:
                row["litellm_differences"] = differences[info.id]
            rows.append(row)
        typer.echo(json.dumps({"snapshot": data.snapshot, "models": rows}, indent=2))
        return
    table = Table()
    table.add_column("id", no_wrap=True)
    for header in ("context", "max output", "reasoning levels", "off?"):
        table.add_column(header)
    if check:
        table.add_column("vs litellm")
    for info in models:
        cells = [
            info.id,
            _tokens(info.context_window),
            _tokens(info.max_output_tokens),
            ", ".join(info.reasoning_levels) or "-",
            "yes" if info.supports_no_reasoning else "no",
        ]
        if check:
            cells.append("; ".join(differences[info.id]) or "same")
        table.add_row(*cells)
    out = Console(highlight=False)
    out.print(table)
    out.print(
        f"Snapshot of {data.snapshot}. Any other litellm model id works too "
        "(limits then come from litellm's model map, or the provider's defaults). "
        "reasoning_effort 'min'/'max' pick the first/last level; 'off?' = whether 'none' "
        "turns reasoning off."
    )
