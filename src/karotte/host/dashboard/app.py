"""The dashboard's web app (ASGI, starlette): two static pages, a small JSON API over
:class:`~karotte.host.dashboard.index.RunIndex`, and the run files themselves (artifacts).

What it defends against: transcripts and artifacts are written by a model that may be hostile.

* No path outside the directory is ever served: ``..``, absolute paths and symlinks that lead
  out are refused (403), checked on the resolved path.
* Transcript text is rendered as text, never as HTML (the pages set ``textContent`` only), under a
  Content-Security-Policy that allows no inline script and nothing from elsewhere.
* Artifacts are served as inert downloads or plain text; only raster images are shown as images,
  and every file response carries a sandboxing CSP, so an HTML or SVG artifact cannot run script
  in the dashboard's origin.
* Requests whose ``Host`` is not the address the dashboard listens on are refused (421), so a web
  page cannot reach it through DNS rebinding.
"""

from __future__ import annotations

import hashlib
import mimetypes
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anyio.to_thread
from pydantic import TypeAdapter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from karotte.events import Event
from karotte.host.dashboard.index import RunIndex, RunSummary

STATIC = Path(__file__).parent / "static"
_events_adapter: TypeAdapter[list[Event]] = TypeAdapter(list[Event])
_summaries_adapter: TypeAdapter[list[RunSummary]] = TypeAdapter(list[RunSummary])

PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
FILE_CSP = "sandbox; default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'"
INLINE_IMAGE_TYPES = {"image/png", "image/jpeg", "image/gif", "image/webp", "image/bmp"}
TEXT_SUFFIXES = {
    ".txt", ".log", ".md", ".json", ".jsonl", ".py", ".sh", ".csv", ".tsv", ".yaml", ".yml",
    ".toml", ".cfg", ".ini", ".diff", ".patch", ".html", ".htm", ".svg", ".xml", ".js", ".css",
    ".c", ".h", ".rs", ".go", ".java", ".ts", ".out", ".err",
}  # fmt: skip


def _loopback_names(host: str) -> set[str]:
    names = {host.lower()}
    if host in ("127.0.0.1", "localhost", "::1") or host.startswith("127."):
        names |= {"127.0.0.1", "localhost", "::1"}
    return names


class _Guard:
    """Host-header check (DNS rebinding) and security headers on every response."""

    def __init__(self, app: ASGIApp, allowed_hosts: set[str] | None) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts  # None: any (bound to a wildcard address)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.allowed_hosts is not None:
            host = _host_name(dict(scope["headers"]).get(b"host", b"").decode("latin-1"))
            if host not in self.allowed_hosts:
                response = Response(
                    f"refused: Host {host!r} is not this dashboard's address\n",
                    status_code=421,
                    media_type="text/plain",
                )
                await response(scope, receive, send)
                return
        is_file = str(scope.get("path", "")).startswith("/files/")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [
                    (b"content-security-policy", (FILE_CSP if is_file else PAGE_CSP).encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"cross-origin-resource-policy", b"same-origin"),
                ]
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _host_name(header: str) -> str:
    header = header.strip().lower()
    if header.startswith("["):  # [::1]:8000
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _json_bytes(parts: Iterable[tuple[str, bytes]]) -> bytes:
    """A JSON object from already-serialised values (avoids re-encoding big event lists)."""
    import json

    return b"{" + b",".join(json.dumps(k).encode() + b":" + v for k, v in parts) + b"}"


def create_app(root: Path, allowed_hosts: set[str] | None = None) -> Starlette:
    """The dashboard over ``root``. ``allowed_hosts``: the Host names accepted (None: any)."""
    index = RunIndex(root)

    async def runs(request: Request) -> Response:
        rows = await anyio.to_thread.run_sync(index.runs)
        body = _json_bytes(
            [
                ("root", _dumps(str(index.root))),
                ("runs", _summaries_adapter.dump_json(rows)),
            ]
        )
        etag = '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'
        headers = {"etag": etag, "cache-control": "no-cache"}
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        return Response(body, media_type="application/json", headers=headers)

    def _load(rel: str) -> tuple[RunSummary, list[Event], dict[str, Any], str | None]:
        summary, parsed = index.load(rel)
        if parsed.not_a_run:
            raise FileNotFoundError(f"{rel} is not a transcript or event stream")
        return summary, parsed.events, parsed.header, parsed.problem

    async def run(request: Request) -> Response:
        rel = request.query_params.get("path", "")
        try:
            summary, events, header, _problem = await anyio.to_thread.run_sync(_load, rel)
            artifacts = await anyio.to_thread.run_sync(index.artifacts, rel, summary.run_id)
        except PermissionError as exc:
            return _error(403, str(exc))
        except (FileNotFoundError, NotADirectoryError):
            return _error(404, f"no such run: {rel!r}")
        body = _json_bytes(
            [
                ("summary", summary.model_dump_json().encode()),
                ("header", _dumps(_plain_header(header))),
                ("artifacts", _dumps(artifacts)),
                ("events", _events_adapter.dump_json(events)),
            ]
        )
        return Response(body, media_type="application/json", headers={"cache-control": "no-store"})

    async def run_events(request: Request) -> Response:
        """Events from ``after`` on (for a live run). ``reset`` is true when the events the
        page already has are no longer the file's (it was rewritten): reload them all."""
        rel = request.query_params.get("path", "")
        try:
            after = max(0, int(request.query_params.get("after", "0")))
            last_ts = request.query_params.get("last")
            last = float(last_ts) if last_ts else None
        except ValueError:
            return _error(400, "after must be an integer, last a number")
        try:
            summary, events, _header, _problem = await anyio.to_thread.run_sync(_load, rel)
        except PermissionError as exc:
            return _error(403, str(exc))
        except (FileNotFoundError, NotADirectoryError):
            return _error(404, f"no such run: {rel!r}")
        reset = after > len(events) or (
            after > 0 and last is not None and events[after - 1].timestamp != last
        )
        new = events if reset else events[after:]
        body = _json_bytes(
            [
                ("summary", summary.model_dump_json().encode()),
                ("reset", b"true" if reset else b"false"),
                ("events", _events_adapter.dump_json(new)),
            ]
        )
        return Response(body, media_type="application/json", headers={"cache-control": "no-store"})

    async def files(request: Request) -> Response:
        rel = request.path_params["path"]
        try:
            path = await anyio.to_thread.run_sync(index.resolve, rel)
        except PermissionError as exc:
            return Response(f"{exc}\n", status_code=403, media_type="text/plain")
        except (FileNotFoundError, NotADirectoryError):
            return Response("not found\n", status_code=404, media_type="text/plain")
        if not path.is_file():
            return Response("not a file\n", status_code=404, media_type="text/plain")
        guessed, _ = mimetypes.guess_type(path.name)
        headers = {"cache-control": "no-cache"}
        if guessed in INLINE_IMAGE_TYPES:
            media_type = guessed
        elif path.suffix.lower() in TEXT_SUFFIXES:
            media_type = "text/plain; charset=utf-8"  # shown as text, never rendered
        else:
            media_type = "application/octet-stream"
            headers["content-disposition"] = "attachment"
        return FileResponse(path, media_type=media_type, headers=headers)

    async def page(request: Request) -> Response:
        name = "run.html" if request.url.path == "/run" else "index.html"
        return FileResponse(STATIC / name, headers={"cache-control": "no-cache"})

    app = Starlette(
        routes=[
            Route("/", page),
            Route("/run", page),
            Route("/api/runs", runs),
            Route("/api/run", run),
            Route("/api/run/events", run_events),
            Route("/files/{path:path}", files),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
    )
    app.state.index = index
    app.add_middleware(_Guard, allowed_hosts=allowed_hosts)
    return app


def _dumps(value: Any) -> bytes:
    import json

    return json.dumps(value, allow_nan=False).encode()


HEADER_KEYS = ("version", "run_id", "task_id", "model", "status", "error_kind", "score")


def _plain_header(header: dict[str, Any]) -> dict[str, Any]:
    """The transcript header's scalar fields (a broken file's header may hold anything)."""
    import math

    plain: dict[str, Any] = {}
    for key in HEADER_KEYS:
        value = header.get(key)
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        if value is None or isinstance(value, (str, int, float, bool)):
            plain[key] = value
        else:
            plain[key] = str(value)
    return plain
