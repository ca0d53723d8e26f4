"""The run backend's wire format: every request and response body as a pydantic model.

Paths (all under ``/v1``; every one except ``/v1/health`` and the presigned upload needs
``Authorization: Bearer <token>``):

===========================================  ====================  ============================
request                                      body                  answer
===========================================  ====================  ============================
``POST /v1/runs``                            :class:`CreateRun`    :class:`RunRecord` (201/200)
``GET  /v1/runs``                                                  :class:`RunList`
``GET  /v1/runs/{run_id}``                                         :class:`RunRecord`
``PUT  /v1/runs/{run_id}/state``             :class:`RunState`     :class:`RunRecord`
``POST /v1/runs/{run_id}/events``            :class:`EventBatch`   :class:`EventBatchResult`
``GET  /v1/runs/{run_id}/events``                                  :class:`EventPage`
``GET  /v1/runs/{run_id}/transcript``                              ``Transcript`` (as on disk)
``POST /v1/runs/{run_id}/artifacts``         :class:`ArtifactUpload`  :class:`PresignedUpload`
``PUT  /v1/upload/{run_id}/{name}?sig=…``    gzip bytes            :class:`ArtifactInfo`
``GET  /v1/runs/{run_id}/artifacts``                               :class:`ArtifactList`
``GET  /v1/runs/{run_id}/artifacts/{name}``                        gzip bytes
``POST /v1/runs/{run_id}/agent/messages``    :class:`AgentMessage` :class:`AgentMessageResult`
``POST /v1/runs/{run_id}/agent/next``        :class:`NextMessageRequest`  :class:`AgentMessage`/204
``GET  /v1/runs/{run_id}/agent``                                   :class:`AgentState`
===========================================  ====================  ============================

Errors are ``{"error": "<what went wrong>"}`` (:class:`ErrorBody`) with a 4xx/5xx status.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from karotte.errors import ErrorKind
from karotte.events import Event, TokenUsage
from karotte.schemas import Message

API_PREFIX = "/v1"
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
ARTIFACT_NAME = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.+@=-]*(/[A-Za-z0-9_.][A-Za-z0-9_.+@=-]*)*$")
MAX_ARTIFACT_NAME = 255
MAX_EVENTS_PER_BATCH = 500
MAX_WAIT_S = 60.0  # the longest a long-poll is held by the server

RunPhase = Literal["running", "passed", "failed", "error"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorBody(_Model):
    error: str


class CreateRun(_Model):
    """Create (or re-open: the same ``run_id`` again is idempotent) a run's transcript."""

    run_id: str = Field(pattern=RUN_ID_PATTERN)
    task_id: str = Field(min_length=1)
    model: str
    host: str | None = Field(default=None, description="machine the harness runs on")
    sandbox: str | None = None
    agent: str = "builtin"


class RunState(_Model):
    """The run's state as the harness knows it: sent when it changes (a full replacement)."""

    status: RunPhase
    error_kind: ErrorKind | None = None
    score: float | None = None
    usage: TokenUsage = Field(default_factory=TokenUsage)
    warnings: list[str] = Field(default_factory=list)


class RunRecord(_Model):
    run_id: str
    task_id: str
    model: str
    host: str | None = None
    sandbox: str | None = None
    agent: str = "builtin"
    status: RunPhase = "running"
    error_kind: ErrorKind | None = None
    score: float | None = None
    usage: TokenUsage = Field(default_factory=TokenUsage)
    warnings: list[str] = Field(default_factory=list)
    created_at: float
    updated_at: float
    event_count: int = 0
    last_seq: int = -1  # highest seq stored
    contiguous_seq: int = -1  # every seq 0..contiguous_seq is stored (no gap)


class RunList(_Model):
    runs: list[RunRecord]


class EventBatch(_Model):
    """Events in any order; each is stored under its ``seq``, replacing one already there."""

    events: list[Event] = Field(max_length=MAX_EVENTS_PER_BATCH)


class EventBatchResult(_Model):
    stored: int
    event_count: int
    contiguous_seq: int


class EventPage(_Model):
    """``GET …/events?after=SEQ&wait_s=S&limit=N``: events with seq > after, in seq order."""

    events: list[Event]
    last_seq: int  # pass as ``after`` to continue
    complete: bool  # the run's task_completed event is stored


class ArtifactUpload(_Model):
    """Ask for a presigned URL to upload one artifact (gzip-compressed)."""

    name: str = Field(min_length=1, max_length=MAX_ARTIFACT_NAME)
    size: int = Field(ge=0, description="uncompressed size in bytes")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="of the uncompressed content")

    @field_validator("name")
    @classmethod
    def _relative_path(cls, value: str) -> str:
        if not ARTIFACT_NAME.match(value) or any(p in (".", "..") for p in value.split("/")):
            raise ValueError("must be a relative path of [A-Za-z0-9_.+@=-] parts, without . or ..")
        return value


class PresignedUpload(_Model):
    """``PUT`` the gzip-compressed bytes to ``upload_path`` (relative to the backend's root URL;
    ``upload_url`` is the same as the server sees itself) with ``headers``, before
    ``expires_at``. No bearer token: the signature is the credential, for this one artifact
    (name, size and digest) and one upload."""

    method: Literal["PUT"] = "PUT"
    upload_path: str
    upload_url: str
    expires_at: float
    headers: dict[str, str]


class ArtifactInfo(_Model):
    name: str
    size: int
    sha256: str
    compressed_size: int
    uploaded_at: float


class ArtifactList(_Model):
    artifacts: list[ArtifactInfo]


class AgentMessage(_Model):
    """The external agent's assistant message for one turn (0, 1, 2, … over the whole run).

    The trainer posts it; the harness takes it with ``agent/next``. Posting a turn again before
    the harness took it replaces it; after, it is refused (409)."""

    turn: int = Field(ge=0)
    message: Message
    usage: TokenUsage | None = None

    @field_validator("message")
    @classmethod
    def _assistant(cls, value: Message) -> Message:
        if value.role != "assistant":
            raise ValueError(f"must be an assistant message, not {value.role!r}")
        return value


class AgentMessageResult(_Model):
    turn: int
    replaced: bool


class NextMessageRequest(_Model):
    """The harness waits (long-poll, at most ``wait_s``) for the message of ``turn``. Asking
    again for the same turn returns the same message (a lost answer is simply asked again)."""

    turn: int = Field(ge=0)
    step_index: int = Field(ge=0)
    wait_s: float = Field(default=20.0, ge=0, le=MAX_WAIT_S)
    tools: list[dict[str, Any]] | None = Field(
        default=None, description="the tool specs offered to the agent (sent with each turn)"
    )


class AgentState(_Model):
    """``GET …/agent?wait_turn=K&wait_s=S`` (waits until the harness awaits turn ≥ K)."""

    awaiting_turn: int | None = None  # the turn the harness is waiting for now
    awaiting_step: int | None = None
    awaiting_since: float | None = None
    delivered_turns: list[int] = Field(default_factory=list)
    queued_turns: list[int] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None


def events_path(run_id: str) -> str:
    return f"{API_PREFIX}/runs/{run_id}/events"
