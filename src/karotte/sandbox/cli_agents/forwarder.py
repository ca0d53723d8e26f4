"""The loopback key forwarder: the student's CLI talks to it with a placeholder key, and it
talks to the real model endpoint with the real key.

It runs inside the root harness on ``127.0.0.1`` (a random port). It forwards every request to
one fixed upstream base URL (the provider, the model proxy, or the in-sandbox proxy relay) and
never anywhere else, so the student can use the model through it but never read the key: the key
lives only in this process's memory. A request that does not carry the placeholder is refused
(401). Error responses (status >= 400) are read whole and any occurrence of the real key is
replaced by the placeholder before they reach the CLI (providers echo parts of bad keys).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

PLACEHOLDER_PREFIX = "karotte-placeholder-"
# headers that belong to one connection, not to the request (RFC 9110 7.6.1), plus ours to redo
_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
}
_KEY_HEADERS = ("authorization", "x-api-key", "api-key", "x-goog-api-key")


def new_placeholder() -> str:
    """A fresh placeholder key: random, so a placeholder from another run is refused too."""
    return PLACEHOLDER_PREFIX + secrets.token_hex(16)


@dataclass
class ForwarderStats:
    requests: int = 0
    refused: int = 0
    upstream_errors: int = 0
    paths: list[str] = field(default_factory=list)


class KeyForwarder:
    """An HTTP reverse proxy ``http://127.0.0.1:<port>/<path>`` → ``<upstream>/<path>``."""

    def __init__(
        self,
        upstream: str,
        real_key: str | None,
        placeholder: str | None = None,
        *,
        timeout_s: float = 600.0,
    ) -> None:
        if not upstream.startswith(("http://", "https://")):
            raise ValueError(f"model endpoint {upstream!r} must be an http(s) URL")
        self.upstream = upstream.rstrip("/")
        self.real_key = real_key or None
        self.placeholder = placeholder or new_placeholder()
        self.stats = ForwarderStats()
        self._timeout = httpx.Timeout(timeout_s, connect=30.0)
        self._client: httpx.AsyncClient | None = None
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---- the swap ----------------------------------------------------------------------------
    def swap_headers(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]] | None:
        """Request headers for upstream, or None when the placeholder is missing."""
        out: list[tuple[str, str]] = []
        seen = False
        for name, value in headers:
            lower = name.lower()
            if lower in _HOP or lower.startswith("x-forwarded-"):
                continue
            if lower in _KEY_HEADERS:
                if self.placeholder not in value:
                    continue  # any other credential is dropped, never forwarded
                seen = True
                if self.real_key is None:
                    continue  # the upstream (a proxy) authenticates by itself
                value = value.replace(self.placeholder, self.real_key)
            out.append((name, value))
        return out if seen else None

    def scrub(self, data: bytes) -> bytes:
        if not self.real_key:
            return data
        key = self.real_key.encode()
        data = data.replace(key, self.placeholder.encode())
        # providers echo masked keys ("sk-abc...wxyz"): drop long enough heads and tails as well
        if len(key) >= 16:
            data = data.replace(key[:8], b"********").replace(key[-6:], b"******")
        return data

    # ---- ASGI -----------------------------------------------------------------------------------
    async def _handle(self, request: Request) -> Response:
        self.stats.requests += 1
        headers = self.swap_headers(list(request.headers.items()))
        if headers is None:
            self.stats.refused += 1
            return JSONResponse(
                {"error": {"message": "karotte forwarder: the request lacks the run's key"}},
                status_code=401,
            )
        path = request.url.path
        self.stats.paths.append(path)
        target = self.upstream + path + (f"?{request.url.query}" if request.url.query else "")
        assert self._client is not None
        body = await request.body()
        upstream_request = self._client.build_request(
            request.method, target, headers=headers, content=body
        )
        try:
            response = await self._client.send(upstream_request, stream=True)
        except httpx.HTTPError as exc:
            self.stats.upstream_errors += 1
            return JSONResponse(
                {
                    "error": {
                        "message": f"karotte forwarder: upstream unreachable ({type(exc).__name__})"
                    }
                },
                status_code=502,
            )
        out_headers = {k: v for k, v in response.headers.items() if k.lower() not in _HOP}
        if response.status_code >= 400:
            data = self.scrub(await response.aread())
            await response.aclose()
            out_headers.pop("content-encoding", None)
            return Response(data, status_code=response.status_code, headers=out_headers)
        out_headers.pop("content-encoding", None)  # httpx decodes; we send it decoded

        async def body_iter() -> AsyncIterator[bytes]:
            async for chunk in response.aiter_bytes():
                yield chunk

        return StreamingResponse(
            body_iter(),
            status_code=response.status_code,
            headers=out_headers,
            background=BackgroundTask(response.aclose),
        )

    def app(self) -> Starlette:
        methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
        return Starlette(routes=[Route("/{path:path}", self._handle, methods=methods)])

    # ---- life cycle ---------------------------------------------------------------------------
    async def start(self) -> KeyForwarder:
        self._client = httpx.AsyncClient(timeout=self._timeout, follow_redirects=False)
        self._server, self._task, self.port = await serve_loopback(self.app())
        return self

    async def stop(self) -> None:
        await stop_server(self._server, self._task)
        if self._client is not None:
            await self._client.aclose()


class _InLoopServer(uvicorn.Server):
    """uvicorn inside the harness's loop: the harness keeps its own signal handling."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_loopback(app: Any) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    """Serve an ASGI app with uvicorn on a fresh ``127.0.0.1`` port in this event loop."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="auto", access_log=False)
    server = _InLoopServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(500):
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    if task.done():
        await task
    if not server.started:
        server.should_exit = True
        raise RuntimeError("loopback server did not start within 5 s")
    return server, task, port


async def stop_server(server: uvicorn.Server | None, task: asyncio.Task[None] | None) -> None:
    if server is None or task is None:
        return
    server.should_exit = True
    try:
        await asyncio.wait_for(asyncio.shield(task), 5)
    except TimeoutError:
        server.force_exit = True
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
