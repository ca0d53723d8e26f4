"""``karotte backend serve|export``: the reference run backend (docs/backend.md)."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

import typer
from rich.markup import escape

from karotte.cli import app
from karotte.cli._common import err_console, fail, friendly_errors

backend_app = typer.Typer(
    help="The reference run backend: collects runs streamed by harnesses (docs/backend.md).",
    no_args_is_help=True,
)
app.add_typer(backend_app, name="backend")

DEFAULT_DB = Path("karotte-backend.sqlite3")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@backend_app.command("serve")
def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (loopback)."),
    port: int = typer.Option(8765, "--port", help="TCP port."),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="SQLite database file (created if absent)."),
    token_file: Path | None = typer.Option(
        None,
        "--token-file",
        help="Bearer tokens, one per line, re-read on every request. Required off loopback.",
    ),
    upload_ttl: float = typer.Option(300.0, "--upload-ttl", help="Presigned URL lifetime (s)."),
) -> None:
    """Serve the run backend (an ASGI app over SQLite) with uvicorn."""
    import uvicorn

    from karotte.backend.server import create_app

    if token_file is None and not _is_loopback(host):
        raise fail(f"--host {host} is not loopback: pass --token-file so that runs need a token")
    if token_file is not None:
        try:
            mode = token_file.stat().st_mode
        except OSError as exc:
            raise fail(f"--token-file {token_file}: {exc.strerror}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            err_console.print(
                f"[yellow]warning:[/] {escape(str(token_file))} is readable by others; chmod 600 it"
            )
    else:
        err_console.print("[yellow]warning:[/] no --token-file: anyone on this machine can write")
    with friendly_errors():
        application = create_app(db, token_file, upload_ttl_s=upload_ttl)
    err_console.print(f"karotte backend on http://{host}:{port} (database {escape(str(db))})")
    uvicorn.run(application, host=host, port=port, log_level="warning")


@backend_app.command("export")
def export(
    out_dir: Path = typer.Argument(..., help="Directory for <run_id>.json and artifacts."),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="The backend's SQLite database."),
    run: list[str] = typer.Option([], "--run", help="Only these run ids (default: all)."),
) -> None:
    """Write runs as transcript files the dashboard lists (`karotte dashboard DIR`)."""
    from karotte.backend.export import export_runs

    with friendly_errors():
        result = export_runs(db, out_dir, run or None)
    for problem in result.skipped:
        err_console.print(f"[yellow]skipped:[/] {escape(problem)}")
    err_console.print(
        f"wrote {len(result.transcripts)} transcript(s) and {len(result.artifacts)} artifact(s) "
        f"to {escape(str(out_dir))}"
    )
