"""The reference run backend: an ASGI app (starlette) over :class:`~karotte.backend.store.Store`.

``karotte backend serve`` runs it with uvicorn, on loopback by default. It implements the whole
protocol of :mod:`karotte.backend.protocol`; see docs/backend.md.

* **Auth** — ``Authorization: Bearer <token>``; the token file is re-read on every request and
  every non-empty line of it is a valid token (rotate by adding the new line, moving clients over,
  then dropping the old one). Without a token file, auth is off and only loopback ``Host`` names
  are accepted (a web page cannot reach the service through DNS rebinding).
* **Presigned uploads** — ``POST …/artifacts`` answers with a URL signed (HMAC-SHA256 with a
  secret kept in the database) over method, run, artifact name, size, digest, expiry and a
  nonce; the upload is refused when the signature does not match, when it expired, when the
  nonce was used already, or when the gunzipped bytes do not match the declared size and digest.
* **Long polls** — ``agent/next``, ``GET …/events?wait_s=`` and ``GET …/agent?wait_s=`` hold the
  request until something changes (or ``wait_s``, at most 60 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import re
import secrets
import time
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from karotte.backend.protocol import (
    API_PREFIX,
    MAX_WAIT_S,
    RUN_ID_PATTERN,
    AgentMessage,
    AgentMessageResult,
    ArtifactList,
    ArtifactUpload,
    CreateRun,
    EventBatch,
    EventBatchResult,
    EventPage,
    NextMessageRequest,
    PresignedUpload,
    RunList,
    RunState,
)
from karotte.backend.store import Conflict, Store

M = TypeVar("M", bound=BaseModel)

DEFAULT_PORT = 8765
DEFAULT_UPLOAD_TTL_S = 300.0
DEFAULT_MAX_ARTIFACT_BYTES = 256 * 1024 * 1024
_LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}
_RUN_ID = re.compile(RUN_ID_PATTERN)


class HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class Changes:
    """Wakes long polls when anything is stored (one event loop: uvicorn's)."""

    def __init__(self) -> None:
        self.version = 0
        self._cond: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    async def changed(self) -> None:
        self.version += 1
        cond = self._condition()
        async with cond:
            cond.notify_all()

    async def wait_until(self, check: Callable[[], Any], wait_s: float) -> Any:
        """``check()`` until it gives something truthy or ``wait_s`` passed; its last value."""
        deadline = time.monotonic() + min(wait_s, MAX_WAIT_S)
        cond = self._condition()
        while True:
            seen = self.version
            value = check()
            remaining = deadline - time.monotonic()
            if value or remaining <= 0:
                return value
            async with cond:
                if self.version == seen:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(cond.wait(), remaining)


def _tokens(token_file: Path) -> set[str]:
    try:
        text = token_file.read_text(encoding="utf-8")
    except OSError as exc:
        raise HTTPError(503, f"the backend cannot read its token file: {exc.strerror}") from exc
    return {line.strip() for line in text.splitlines() if line.strip()}


def _sign(secret: bytes, *parts: object) -> str:
    message = "\n".join(str(p) for p in parts).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def create_app(
    db: Path | str,
    token_file: Path | None = None,
    *,
    upload_ttl_s: float = DEFAULT_UPLOAD_TTL_S,
    max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES,
    clock: Callable[[], float] = time.time,
) -> Starlette:
    """The backend as an ASGI app. ``clock`` (wall time) is injectable for expiry tests."""
    store = Store(db)
    secret = store.upload_secret()
    changes = Changes()

    def authorize(request: Request) -> None:
        if token_file is None:
            host = (request.headers.get("host") or "").rsplit(":", 1)[0]
            if host not in _LOOPBACK_HOSTS and not host.endswith(".localhost"):
                raise HTTPError(403, f"Host {host!r} refused: no token file, loopback names only")
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise HTTPError(401, "missing bearer token (Authorization: Bearer <token>)")
        valid = _tokens(token_file)
        if not any(hmac.compare_digest(token.strip(), t) for t in valid):
            raise HTTPError(401, "invalid bearer token")

    def run_id_of(request: Request) -> str:
        run_id = str(request.path_params["run_id"])
        if not _RUN_ID.match(run_id):
            raise HTTPError(400, f"malformed run id {run_id!r}")
        return run_id

    def existing(run_id: str) -> None:
        if store.run(run_id) is None:
            raise HTTPError(404, f"no run {run_id!r} (create it with POST {API_PREFIX}/runs)")

    async def body_as(request: Request, model: type[M]) -> M:
        raw = await request.body()
        try:
            return model.model_validate_json(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(body)'}: {e['msg']}"
                for e in exc.errors()[:5]
            )
            raise HTTPError(422, f"malformed {model.__name__}: {problems}") from exc

    def float_param(request: Request, name: str, default: float) -> float:
        try:
            return float(request.query_params.get(name, default))
        except ValueError as exc:
            raise HTTPError(400, f"query parameter {name!r} must be a number") from exc

    def ok(model: BaseModel, status: int = 200) -> Response:
        return Response(model.model_dump_json(), status_code=status, media_type="application/json")

    def endpoint(fn: Callable[[Request], Any], auth: bool = True) -> Callable[[Request], Any]:
        async def handle(request: Request) -> Response:
            try:
                if auth:
                    authorize(request)
                response: Response = await fn(request)
                return response
            except HTTPError as exc:
                return JSONResponse({"error": exc.message}, status_code=exc.status)
            except Conflict as exc:
                return JSONResponse({"error": str(exc)}, status_code=409)

        return handle

    # ---- runs and events -----------------------------------------------------------------
    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def create_run(request: Request) -> Response:
        body = await body_as(request, CreateRun)
        record, created = store.create_run(body)
        await changes.changed()
        return ok(record, 201 if created else 200)

    async def list_runs(request: Request) -> Response:
        return ok(RunList(runs=store.runs()))

    async def get_run(request: Request) -> Response:
        record = store.run(run_id_of(request))
        if record is None:
            raise HTTPError(404, "no such run")
        return ok(record)

    async def put_state(request: Request) -> Response:
        run_id = run_id_of(request)
        existing(run_id)
        body = await body_as(request, RunState)
        record = store.set_state(run_id, body)
        await changes.changed()
        assert record is not None
        return ok(record)

    async def post_events(request: Request) -> Response:
        run_id = run_id_of(request)
        existing(run_id)
        batch = await body_as(request, EventBatch)
        stored = store.put_events(run_id, batch.events)
        await changes.changed()
        record = store.run(run_id)
        assert record is not None
        return ok(
            EventBatchResult(
                stored=stored, event_count=record.event_count, contiguous_seq=record.contiguous_seq
            )
        )

    async def get_events(request: Request) -> Response:
        run_id = run_id_of(request)
        existing(run_id)
        after = int(float_param(request, "after", -1))
        limit = max(1, min(int(float_param(request, "limit", 1000)), 10_000))
        wait_s = float_param(request, "wait_s", 0.0)
        events = await changes.wait_until(lambda: store.events(run_id, after, limit), wait_s)
        last = events[-1].seq if events else after
        return ok(EventPage(events=events, last_seq=last, complete=store.has_completed(run_id)))

    async def get_transcript(request: Request) -> Response:
        transcript = store.transcript(run_id_of(request))
        if transcript is None:
            raise HTTPError(404, "no such run")
        return ok(transcript)

    # ---- artifacts -----------------------------------------------------------------------
    async def presign(request: Request) -> Response:
        run_id = run_id_of(request)
        existing(run_id)
        body = await body_as(request, ArtifactUpload)
        if body.size > max_artifact_bytes:
            raise HTTPError(413, f"artifact larger than {max_artifact_bytes} bytes")
        expires = int(clock() + upload_ttl_s)
        nonce = secrets.token_hex(16)
        sig = _sign(secret, "PUT", run_id, body.name, body.size, body.sha256, expires, nonce)
        query = urlencode(
            {
                "size": body.size,
                "sha256": body.sha256,
                "expires": expires,
                "nonce": nonce,
                "sig": sig,
            }
        )
        path = f"{API_PREFIX}/upload/{run_id}/{body.name}?{query}"
        return ok(
            PresignedUpload(
                upload_path=path,
                upload_url=str(request.base_url).rstrip("/") + path,
                expires_at=expires,
                headers={"Content-Encoding": "gzip", "Content-Type": "application/octet-stream"},
            )
        )

    async def upload(request: Request) -> Response:
        run_id = run_id_of(request)
        name = str(request.path_params["name"])
        q = request.query_params
        try:
            size, sha256, expires = int(q["size"]), q["sha256"], int(q["expires"])
            nonce, sig = q["nonce"], q["sig"]
        except (KeyError, ValueError) as exc:
            raise HTTPError(403, "not a presigned upload URL (parameters missing)") from exc
        expected = _sign(secret, "PUT", run_id, name, size, sha256, expires, nonce)
        if not hmac.compare_digest(expected, sig):
            raise HTTPError(403, "upload URL signature does not match")
        if clock() > expires:
            raise HTTPError(403, "upload URL expired; ask for a new one")
        if request.headers.get("content-encoding", "").lower() != "gzip":
            raise HTTPError(415, "send the artifact gzip-compressed (Content-Encoding: gzip)")
        gz = await _read_limited(request, max_artifact_bytes)
        data = _gunzip_limited(gz, size)
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
            raise HTTPError(422, "artifact does not match the size and sha256 it was signed for")
        existing(run_id)
        if not store.use_nonce(nonce):
            raise HTTPError(409, "this upload URL was used already")
        store.put_artifact(run_id, name, size, sha256, gz)
        info = next(a for a in store.artifacts(run_id) if a.name == name)
        return ok(info, 201)

    async def list_artifacts(request: Request) -> Response:
        run_id = run_id_of(request)
        existing(run_id)
        return ok(ArtifactList(artifacts=store.artifacts(run_id)))

    async def get_artifact(request: Request) -> Response:
        data = store.artifact(run_id_of(request), str(request.path_params["name"]))
        if data is None:
            raise HTTPError(404, "no such artifact")
        return Response(
            data,
            media_type="application/octet-stream",
            headers={"Content-Encoding": "gzip"},
        )

    # ---- the external agent --------------------------------------------------------------
    async def post_agent_message(request: Request) -> Response:
        run_id = run_id_of(request)
        body = await body_as(request, AgentMessage)
        replaced = store.post_agent_message(run_id, body)
        await changes.changed()
        return ok(AgentMessageResult(turn=body.turn, replaced=replaced), 201)

    async def next_agent_message(request: Request) -> Response:
        run_id = run_id_of(request)
        body = await body_as(request, NextMessageRequest)
        store.set_agent_wait(run_id, body.turn, body.step_index, body.tools)
        await changes.changed()
        message = await changes.wait_until(
            lambda: store.take_agent_message(run_id, body.turn), body.wait_s
        )
        if message is None:
            return Response(status_code=204)
        await changes.changed()
        return ok(message)

    async def agent_state(request: Request) -> Response:
        run_id = run_id_of(request)
        wait_turn = request.query_params.get("wait_turn")
        wait_s = float_param(request, "wait_s", 0.0)

        def check() -> Any:
            state = store.agent_state(run_id)
            if wait_turn is None:
                return state
            ready = state.awaiting_turn is not None and state.awaiting_turn >= int(wait_turn)
            return state if ready else None

        state = await changes.wait_until(check, wait_s if wait_turn is not None else 0.0)
        return ok(state or store.agent_state(run_id))

    runs = f"{API_PREFIX}/runs"
    routes = [
        Route(f"{API_PREFIX}/health", health, methods=["GET"]),
        Route(runs, endpoint(create_run), methods=["POST"]),
        Route(runs, endpoint(list_runs), methods=["GET"]),
        Route(runs + "/{run_id}", endpoint(get_run), methods=["GET"]),
        Route(runs + "/{run_id}/state", endpoint(put_state), methods=["PUT"]),
        Route(runs + "/{run_id}/events", endpoint(post_events), methods=["POST"]),
        Route(runs + "/{run_id}/events", endpoint(get_events), methods=["GET"]),
        Route(runs + "/{run_id}/transcript", endpoint(get_transcript), methods=["GET"]),
        Route(runs + "/{run_id}/artifacts", endpoint(presign), methods=["POST"]),
        Route(runs + "/{run_id}/artifacts", endpoint(list_artifacts), methods=["GET"]),
        Route(runs + "/{run_id}/artifacts/{name:path}", endpoint(get_artifact), methods=["GET"]),
        Route(runs + "/{run_id}/agent/messages", endpoint(post_agent_message), methods=["POST"]),
        Route(runs + "/{run_id}/agent/next", endpoint(next_agent_message), methods=["POST"]),
        Route(runs + "/{run_id}/agent", endpoint(agent_state), methods=["GET"]),
        Route(
            f"{API_PREFIX}/upload/{{run_id}}/{{name:path}}",
            endpoint(upload, auth=False),
            methods=["PUT"],
        ),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        store.close()

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.store = store
    return app


async def _read_limited(request: Request, limit: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise HTTPError(413, f"upload larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _gunzip_limited(gz: bytes, size: int) -> bytes:
    """Decompress, refusing more than ``size`` bytes (a gzip bomb stops at the declared size)."""
    decoder = zlib.decompressobj(wbits=31)
    try:
        data = decoder.decompress(gz, size + 1)
    except zlib.error as exc:
        raise HTTPError(422, f"body is not valid gzip: {exc}") from exc
    if len(data) > size or not decoder.eof:
        raise HTTPError(422, "artifact does not match the size it was signed for")
    return data
