"""The harness's side of the run backend (docs/backend.md): stream events, run state and
artifacts to a central service, without ever slowing down, failing or losing the run.

:class:`BackendStreamer` is an :class:`~karotte.sandbox.transcript.EventRecorder` sink. The sink
only queues the event; a background thread delivers the queue in seq order (batched), retrying
connection errors, 5xx and 401 (the token file may be rotated) with exponential backoff
(:meth:`karotte.sandbox.retry.RetryPolicy.backoff`) for at most ``backend_retry_budget_s`` per
outage. Meanwhile the run goes on and events keep queueing; when the backend answers again the
backlog is caught up in order. An outage longer than the budget stops delivery until the end of
the run, where :meth:`BackendStreamer.finish` tries once more (within
``backend_flush_timeout_s``), then uploads the artifacts through presigned URLs. Every delivery
problem becomes a warning, recorded in the local transcript as an ``error`` event of kind
``infra`` whose message starts with ``backend:`` (the run's status is not changed by it).

Inside a sandbox (``--network=none``) the backend is reached through a unix socket the launcher
mounts in (``KAROTTE_BACKEND_SOCKET``); the URI then only names the Host.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import logging
import os
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from karotte.backend.protocol import (
    API_PREFIX,
    MAX_EVENTS_PER_BATCH,
    ArtifactUpload,
    CreateRun,
    PresignedUpload,
    RunState,
)
from karotte.config import EvaluationRunConfig
from karotte.errors import ErrorKind, KarotteError
from karotte.events import (
    ErrorOccurred,
    Event,
    MessageAdded,
    StepStarted,
    TaskCompleted,
    TokenUsage,
)
from karotte.sandbox.retry import RetryPolicy

log = logging.getLogger(__name__)

SOCKET_ENV = "KAROTTE_BACKEND_SOCKET"
WARNING_PREFIX = "backend: "
_CONNECT_TIMEOUT_S = 5.0
_REQUEST_TIMEOUT_S = 30.0


class BackendError(KarotteError):
    """A backend request failed. ``retryable``: worth trying again (outage, 5xx, auth)."""

    kind = ErrorKind.INFRA

    def __init__(self, message: str, status: int | None = None, retryable: bool = True) -> None:
        super().__init__(message)
        self.status, self.retryable = status, retryable


class BackendConnection:
    """HTTP to the backend: base URI, bearer token re-read from its file on every request, and a
    unix-socket transport when ``KAROTTE_BACKEND_SOCKET`` (or ``socket_path``) is set."""

    def __init__(
        self, uri: str, token_file: Path | None = None, socket_path: str | None = None
    ) -> None:
        self.uri = uri.rstrip("/")
        self.token_file = token_file
        self.socket_path = socket_path if socket_path is not None else os.environ.get(SOCKET_ENV)
        timeout = httpx.Timeout(_REQUEST_TIMEOUT_S, connect=_CONNECT_TIMEOUT_S)
        transport = httpx.HTTPTransport(uds=self.socket_path) if self.socket_path else None
        self.client = httpx.Client(base_url=self.uri, timeout=timeout, transport=transport)

    @classmethod
    def from_config(cls, config: EvaluationRunConfig) -> BackendConnection:
        if not config.backend_uri:
            raise KarotteError("backend_uri is not set in the run config")
        return cls(config.backend_uri, config.backend_token_file)

    def headers(self) -> dict[str, str]:
        if self.token_file is None:
            return {}
        try:
            token = self.token_file.read_text(encoding="utf-8").strip().splitlines()
        except OSError as exc:
            raise BackendError(
                f"cannot read the backend token file {self.token_file}: {exc.strerror or exc}"
            ) from exc
        if not token or not token[0].strip():
            raise BackendError(f"the backend token file {self.token_file} is empty")
        return {"Authorization": f"Bearer {token[0].strip()}"}

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """One request; raises :class:`BackendError` (classified) unless the answer is 2xx."""
        headers = {**self.headers(), **kwargs.pop("headers", {})}
        if timeout is not None:
            kwargs["timeout"] = httpx.Timeout(timeout, connect=min(_CONNECT_TIMEOUT_S, timeout))
        try:
            response = self.client.request(method, path, json=json, headers=headers, **kwargs)
        except httpx.TransportError as exc:
            raise BackendError(f"{self.uri} unreachable: {type(exc).__name__}: {exc}") from exc
        raise_for_status(response, self)
        return response

    async def arequest(
        self, method: str, path: str, *, json: Any = None, limit_s: float = _REQUEST_TIMEOUT_S
    ) -> httpx.Response:
        """Like :meth:`request`, on the event loop (cancellable: used by long polls, so a fresh
        connection per call is cheap next to the wait, and nothing is left open)."""
        transport = httpx.AsyncHTTPTransport(uds=self.socket_path) if self.socket_path else None
        limit = httpx.Timeout(limit_s, connect=min(_CONNECT_TIMEOUT_S, limit_s))
        try:
            async with httpx.AsyncClient(base_url=self.uri, transport=transport) as client:
                response = await client.request(
                    method, path, json=json, headers=self.headers(), timeout=limit
                )
        except httpx.TransportError as exc:
            raise BackendError(f"{self.uri} unreachable: {type(exc).__name__}: {exc}") from exc
        raise_for_status(response, self)
        return response

    def close(self) -> None:
        self.client.close()


def raise_for_status(response: httpx.Response, conn: BackendConnection) -> None:
    status = response.status_code
    if status < 400:
        return
    try:
        detail = str(response.json().get("error", response.text))
    except ValueError:
        detail = response.text[:300]
    where = f"{response.request.method} {response.request.url.path}"
    if status in (401, 403):
        source = f" from {conn.token_file}" if conn.token_file else " (no token file configured)"
        message = f"{conn.uri} refused the bearer token{source} (HTTP {status}: {detail})"
        raise BackendError(message, status, retryable=True)  # the file may be rotated meanwhile
    retryable = status in (408, 429) or status >= 500
    raise BackendError(f"{where}: HTTP {status}: {detail}", status, retryable)


@dataclass
class DeliveryReport:
    """What reached the backend by the end of the run."""

    delivered_events: int = 0
    undelivered_seqs: list[int] = field(default_factory=list)
    artifacts_uploaded: list[str] = field(default_factory=list)
    artifacts_failed: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.undelivered_seqs and not self.artifacts_failed


class BackendStreamer:
    """Delivers a run's events to the backend in order, in a background thread."""

    def __init__(
        self,
        config: EvaluationRunConfig,
        connection: BackendConnection | None = None,
        policy: RetryPolicy | None = None,
    ) -> None:
        self.config = config
        self.conn = connection or BackendConnection.from_config(config)
        self.policy = policy or RetryPolicy(base_delay_s=0.5, max_delay_s=10.0)
        self.budget_s = config.backend_retry_budget_s
        self._cond = threading.Condition()
        self._pending: deque[Event] = deque()
        self._inflight = 0  # events taken from the queue but not yet acknowledged
        self._state: RunState = RunState(status="running")
        self._state_dirty = False
        self._created = False
        self._closing = False
        self._stop = threading.Event()  # set when finish() runs out of time
        self._gave_up = False
        self._outage_since: float | None = None
        self._notes: list[str] = []  # warnings not yet recorded in the transcript
        self.report = DeliveryReport()
        self._recorder: Any = None
        self.step_index = 0  # of the last step started (the external agent reports it)
        self._thread = threading.Thread(target=self._worker, name="karotte-backend", daemon=True)
        self._thread.start()

    # ---- the recorder's side (event-loop thread) -----------------------------------------
    def attach(self, recorder: Any) -> None:
        """Record delivery warnings in ``recorder`` (an EventRecorder) as the run goes on."""
        self._recorder = recorder

    def __call__(self, event: Event) -> None:
        with self._cond:
            self._pending.append(event.model_copy(deep=True))
            self._track_state(event)
            self._cond.notify_all()
        self._record_notes()

    def _track_state(self, event: Event) -> None:
        if isinstance(event, StepStarted):
            self.step_index = event.step_index
        if isinstance(event, MessageAdded) and event.usage is not None:
            self._state.usage = self._state.usage + event.usage
            self._state_dirty = True
        elif isinstance(event, TaskCompleted):
            self._state = RunState(
                status=event.status,
                error_kind=event.error_kind,
                score=event.score,
                usage=event.usage,
                warnings=self._state.warnings,
            )
            self._state_dirty = True

    def _record_notes(self) -> None:
        """Warnings from the worker become events, emitted right after the current one."""
        if self._recorder is None:
            return
        with self._cond:
            notes, self._notes = self._notes, []
        if not notes:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            with self._cond:
                self._notes = notes + self._notes  # recorded at finish()
            return
        for note in notes:
            loop.call_soon(self._recorder.emit, warning_event(note))

    def _note(self, message: str) -> None:
        log.warning("%s%s", WARNING_PREFIX, message)
        with self._cond:
            self._notes.append(message)
            self.report.warnings.append(message)
            self._state.warnings = [*self._state.warnings, message][-20:]
            self._state_dirty = True

    # ---- delivery (worker thread) --------------------------------------------------------
    def _has_work(self) -> bool:
        return bool(self._pending) or self._state_dirty or not self._created

    def _worker(self) -> None:
        retry = 0
        while not self._stop.is_set():
            with self._cond:
                while not (self._pending or self._state_dirty or self._closing):
                    self._cond.wait()
                if self._gave_up or (self._closing and not self._has_work()):
                    return
            try:
                self._deliver_once(_REQUEST_TIMEOUT_S)
            except BackendError as exc:
                if not exc.retryable:
                    self._drop_batch(exc)
                    if self._gave_up:
                        return
                    continue
                delay = self._outage(exc, retry)
                retry += 1
                if delay is None:
                    return
                self._stop.wait(delay)
                continue
            if self._outage_since is not None:
                self._note(
                    f"delivery to {self.conn.uri} resumed after "
                    f"{time.monotonic() - self._outage_since:.1f}s; the queued events were "
                    "caught up in order"
                )
                self._outage_since, retry = None, 0

    def _outage(self, exc: BackendError, retry: int) -> float | None:
        """Note the outage; the wait before the next try, or None when the budget is spent."""
        now = time.monotonic()
        if self._outage_since is None:
            self._outage_since = now
            self._note(
                f"cannot deliver events: {exc}; they are queued locally and retried for up to "
                f"{self.budget_s:g}s (backend_retry_budget_s); the run goes on"
            )
        remaining = self._outage_since + self.budget_s - now
        if remaining <= 0:
            with self._cond:
                self._gave_up = True
                first = self._pending[0].seq if self._pending else None
            self._note(
                f"gave up after {now - self._outage_since:.1f}s without reaching "
                f"{self.conn.uri} (last error: {exc}); events from seq {first} on are kept in the "
                "local transcript, one more attempt is made at the end of the run"
            )
            return None
        return min(self.policy.backoff(retry), remaining)

    def _drop_batch(self, exc: BackendError) -> None:
        """A non-retryable refusal (4xx): what was refused can never be delivered; note it and
        go on with the rest (or stop, when the run itself was refused)."""
        if not self._created:
            with self._cond:
                self._gave_up = True
            self._note(f"the backend refused to create run {self.config.run_id!r}: {exc}")
            return
        with self._cond:
            batch = [
                self._pending.popleft() for _ in range(min(self._inflight, len(self._pending)))
            ]
            self._inflight = 0
            if not batch:  # the state update was refused
                self._state_dirty = False
        self.report.undelivered_seqs += [e.seq for e in batch]
        what = f"events seq {batch[0].seq}-{batch[-1].seq}" if batch else "the run state"
        self._note(f"the backend refused {what}: {exc}")

    def _deliver_once(self, timeout: float) -> None:
        """Create the run if needed, send one batch of queued events, then the state."""
        if not self._created:
            body = CreateRun(
                run_id=self.config.run_id,
                task_id=self.config.task_id,
                model=self.config.model,
                host=socket.gethostname(),
                sandbox=os.environ.get("KAROTTE_SANDBOX"),
                agent=self.config.agent,
            )
            self.conn.request(
                "POST", f"{API_PREFIX}/runs", json=body.model_dump(mode="json"), timeout=timeout
            )
            self._created = True
        with self._cond:
            batch = list(self._pending)[:MAX_EVENTS_PER_BATCH]
            self._inflight = len(batch)
            state_dirty = self._state_dirty
            state = self._state.model_copy(deep=True)
            self._state_dirty = False
        if batch:
            payload = {"events": [e.model_dump(mode="json") for e in batch]}
            try:
                self.conn.request("POST", self._run_path("events"), json=payload, timeout=timeout)
            except BaseException:
                with self._cond:
                    self._state_dirty = self._state_dirty or state_dirty
                raise
            with self._cond:
                for _ in batch:
                    self._pending.popleft()
                self._inflight = 0
                self.report.delivered_events += len(batch)
        if state_dirty:
            try:
                self.conn.request(
                    "PUT",
                    self._run_path("state"),
                    json=state.model_dump(mode="json"),
                    timeout=timeout,
                )
            except BaseException:
                with self._cond:
                    self._state_dirty = True
                raise

    def _run_path(self, what: str) -> str:
        return f"{API_PREFIX}/runs/{self.config.run_id}/{what}"

    # ---- waiting for delivery ------------------------------------------------------------
    def flush(self, timeout: float) -> bool:
        """Wait until everything queued so far is delivered (or ``timeout``); True when it is."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending and not self._gave_up:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(min(remaining, 0.05))
            return not self._pending

    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def finish(self, artifacts_dir: Path | None = None) -> DeliveryReport:
        """End of the run: deliver the rest (within ``backend_flush_timeout_s``), one last try
        after a given-up outage, then the artifacts. Never raises; the report says what is
        missing, and its warnings not yet in the transcript are in :meth:`unrecorded_notes`."""
        deadline = time.monotonic() + self.config.backend_flush_timeout_s
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(_REQUEST_TIMEOUT_S)
        if (self._gave_up or self._has_work()) and not self._thread.is_alive():
            self._last_attempt(deadline)
        with self._cond:
            undelivered = [e.seq for e in self._pending]
        if undelivered:
            self.report.undelivered_seqs += undelivered
            self._note(
                f"{len(undelivered)} event(s) (seq {undelivered[0]}-{undelivered[-1]}) were not "
                f"delivered to {self.conn.uri}; the local transcript has them all"
            )
        elif artifacts_dir is not None and artifacts_dir.is_dir():
            self._upload_artifacts(artifacts_dir, deadline)
        with contextlib.suppress(Exception):
            self.conn.close()
        return self.report

    def _last_attempt(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                with self._cond:
                    self._state_dirty = True
                self._deliver_once(max(1.0, min(_REQUEST_TIMEOUT_S, deadline - time.monotonic())))
            except BackendError as exc:
                self._note(f"the last delivery attempt failed: {exc}")
                return
            if not self._has_work():
                if self._gave_up:
                    self._note("the backend answered again at the end of the run: caught up")
                return

    def unrecorded_notes(self) -> list[str]:
        with self._cond:
            notes, self._notes = self._notes, []
        return notes

    # ---- artifacts -----------------------------------------------------------------------
    def _upload_artifacts(self, root: Path, deadline: float) -> None:
        for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
            name = path.relative_to(root).as_posix()
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise BackendError("backend_flush_timeout_s used up")
                upload_artifact(self.conn, self.config.run_id, name, path.read_bytes(), remaining)
                self.report.artifacts_uploaded.append(name)
            except (BackendError, OSError) as exc:
                self.report.artifacts_failed.append(name)
                self._note(f"artifact {name} was not uploaded: {exc}")


def upload_artifact(
    conn: BackendConnection, run_id: str, name: str, data: bytes, timeout: float = 60.0
) -> PresignedUpload:
    """Ask for a presigned URL, then PUT the gzip-compressed bytes to it."""
    body = ArtifactUpload(name=name, size=len(data), sha256=hashlib.sha256(data).hexdigest())
    answer = conn.request(
        "POST",
        f"{API_PREFIX}/runs/{run_id}/artifacts",
        json=body.model_dump(mode="json"),
        timeout=timeout,
    )
    presigned = PresignedUpload.model_validate_json(answer.content)
    try:
        response = conn.client.put(
            presigned.upload_path,
            content=gzip.compress(data, compresslevel=6),
            headers=presigned.headers,
            timeout=timeout,
        )
    except httpx.TransportError as exc:
        raise BackendError(f"upload of {name} failed: {type(exc).__name__}: {exc}") from exc
    raise_for_status(response, conn)
    return presigned


def open_backend(config: EvaluationRunConfig, recorder: Any) -> BackendStreamer | None:
    """Start streaming ``recorder``'s events when the run config names a backend."""
    if not config.backend_uri:
        return None
    try:
        streamer = BackendStreamer(config)
    except Exception as exc:  # a malformed URI must not cost the run
        recorder.emit(warning_event(f"not streaming to {config.backend_uri}: {exc}"))
        return None
    streamer.attach(recorder)
    recorder.sinks.append(streamer)
    token = config.backend_token_file
    with contextlib.suppress(OSError):
        if token is not None and token.stat().st_mode & 0o077:
            streamer._note(f"the token file {token} is readable by others: chmod 600 it")
    return streamer


def finish_backend(streamer: BackendStreamer, recorder: Any, config: EvaluationRunConfig) -> None:
    """Deliver the rest and the artifacts (bounded); warnings not yet in the local transcript
    are added to it and the transcript is written again. Never raises."""
    try:
        streamer.finish(config.artifacts_dir)
        notes = streamer.unrecorded_notes()
        for note in notes:
            recorder.emit(warning_event(note))
        if notes:
            recorder.write(config.transcript_file)
    except Exception:  # the transcript on disk is already complete
        log.exception("finishing the backend delivery failed")


def warning_event(message: str) -> ErrorOccurred:
    """A delivery warning as recorded in the local transcript (it does not fail the run)."""
    return ErrorOccurred(kind=ErrorKind.INFRA, message=WARNING_PREFIX + message)


def usage_of(events: list[Event]) -> TokenUsage:
    total = TokenUsage()
    for event in events:
        if isinstance(event, MessageAdded) and event.usage is not None:
            total = total + event.usage
    return total
