"""``karotte dashboard DIR``: a local web view of the transcripts under DIR, live as runs go."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from karotte.cli import app
from karotte.cli._common import err_console, fail


def _has_display() -> bool:
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


@app.command("dashboard")
def dashboard(
    directory: Path = typer.Argument(..., help="Directory of transcripts (searched recursively)."),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on (loopback unless you mean otherwise)."
    ),
    port: int = typer.Option(8750, "--port", help="Port (0: any free port)."),
    no_browser: bool = typer.Option(False, "--no-browser", help="Do not open a browser."),
) -> None:
    """Serve a web page listing every run under DIR, with each run's conversation, tool calls,
    scores and artifacts. Runs still in progress update live."""
    import threading
    import webbrowser

    from rich.markup import escape

    from karotte.host.dashboard.server import bind, is_loopback, serve, url_of

    if not directory.is_dir():
        raise fail(f"{directory}: not a directory")
    if not 0 <= port <= 65535:
        raise fail(f"--port {port}: not a port number")
    try:
        sock = bind(host, port)
    except OSError as exc:
        hint = " (is another dashboard running? pick another --port, or 0 for any)"
        raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}{hint}") from None
    url = url_of(sock, host)
    if not is_loopback(host):
        err_console.print(
            f"[bold yellow]warning:[/] listening on {escape(host)}: anyone who can reach this "
            "address can read these transcripts (there is no login)"
        )

    def ready() -> None:
        err_console.print(f"dashboard of {escape(str(directory))} at {url} (Ctrl-C stops it)")
        if no_browser:
            return
        if not _has_display():
            # without a display, webbrowser would start a terminal browser in the foreground
            err_console.print("no display here: open the address in your browser")
            return
        threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()

    serve(directory, sock, host, on_ready=ready)
