"""The ``karotte`` command line. Each sub-module registers its commands on :data:`app`."""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

import typer

from karotte._version import __version__

# litellm fetches a model price map from the internet at import time unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

app = typer.Typer(
    name="karotte",
    help="Build robust RL environments for LLM agents, and run them in real sandboxes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"karotte {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Karotte."""


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM is handled like Ctrl-C, so `finally` blocks and teardown code run.
    raise KeyboardInterrupt


def _register() -> None:
    from karotte.cli import (  # noqa: F401
        agents,
        backend,
        check,
        clean,
        dashboard,
        doctor,
        env,
        models,
        plugins,
        run,
        runtime,
        tasks,
    )


def _builtin_names() -> set[str]:
    names = {c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands}
    names |= {g.name or "" for g in app.registered_groups}
    return {n.replace("_", "-") for n in names if n} | {n for n in names if n}


def main() -> None:
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    _register()
    from karotte.plugins import add_cli_plugins

    add_cli_plugins(app, _builtin_names())
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
