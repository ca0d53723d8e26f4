"""Helpers shared by CLI commands: error display and exit codes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.markup import escape

from karotte.errors import KarotteError

err_console = Console(stderr=True, highlight=False)


def fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {escape(message)}")
    return typer.Exit(code)


@contextmanager
def friendly_errors() -> Iterator[None]:
    """Show Karotte's own errors as a clear message and exit code 2, without a traceback."""
    try:
        yield
    except KarotteError as exc:
        raise fail(str(exc)) from None
