"""Transcript events: the output half of the host↔sandbox protocol.

Every event is a pydantic model with a ``type`` discriminator, a sequence number ``seq`` and a
wall-clock ``timestamp``. The harness streams them (one JSON object per line when
``--events jsonl``) and writes them all to ``transcript_file`` at the end.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from karotte.errors import ErrorKind
from karotte.schemas import Message

TRANSCRIPT_VERSION = 1

RunStatus = Literal["passed", "failed", "error"]
StopReason = Literal[
    "model_done",  # the model answered without tool calls
    "max_turns",
    "time_limit",
    "context_limit",
    "empty_turns",  # the model kept answering with nothing
    "error",
]


class TokenUsage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_input_tokens=self.cached_input_tokens + other.cached_input_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
        )


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seq: int = 0
    timestamp: float = Field(default_factory=time.time)


class TaskStarted(_Event):
    type: Literal["task_started"] = "task_started"
    run_id: str
    task_id: str
    model: str
    karotte_version: str
    system_prompt: str
    tools: list[str]
    step_count: int
    config: dict[str, Any]
    sandbox: str | None = None


class HookCompleted(_Event):
    """A task or step hook ran; ``result`` is the dict it returned."""

    type: Literal["hook_completed"] = "hook_completed"
    hook: Literal["pre_hook", "pre_scoring_hook", "post_hook"]
    step_index: int | None = None
    result: dict[str, Any] | None = None


class LimitsApplied(_Event):
    """Which mechanism enforces each resource limit for the student (from confinement)."""

    type: Literal["limits_applied"] = "limits_applied"
    limits: dict[str, Any]


class StepStarted(_Event):
    type: Literal["step_started"] = "step_started"
    step_index: int
    instructions: str


class MessageAdded(_Event):
    type: Literal["message_added"] = "message_added"
    step_index: int
    message: Message
    usage: TokenUsage | None = None
    model_latency_s: float | None = None


class ToolCallStarted(_Event):
    type: Literal["tool_call_started"] = "tool_call_started"
    step_index: int
    call_id: str
    name: str
    arguments: dict[str, Any] | str


class ToolCallCompleted(_Event):
    type: Literal["tool_call_completed"] = "tool_call_completed"
    step_index: int
    call_id: str
    name: str
    output: str
    is_error: bool = False
    duration_s: float


class ScoringCompleted(_Event):
    type: Literal["scoring"] = "scoring"
    step_index: int
    score: float
    metadata: dict[str, Any]
    continue_task: bool
    duration_s: float


class StepCompleted(_Event):
    type: Literal["step_completed"] = "step_completed"
    step_index: int
    stop_reason: StopReason
    score: float | None
    turns: int
    duration_s: float


class ErrorOccurred(_Event):
    type: Literal["error"] = "error"
    kind: ErrorKind
    message: str
    step_index: int | None = None
    traceback: str | None = None


class TaskCompleted(_Event):
    type: Literal["task_completed"] = "task_completed"
    status: RunStatus
    error_kind: ErrorKind | None = None
    scores: list[float | None]
    score: float
    duration_s: float
    usage: TokenUsage


Event = Annotated[
    TaskStarted
    | HookCompleted
    | LimitsApplied
    | StepStarted
    | MessageAdded
    | ToolCallStarted
    | ToolCallCompleted
    | ScoringCompleted
    | StepCompleted
    | ErrorOccurred
    | TaskCompleted,
    Field(discriminator="type"),
]

event_adapter: TypeAdapter[Event] = TypeAdapter(Event)


class Transcript(BaseModel):
    """The file written to ``transcript_file``: a header and every event of the run."""

    model_config = ConfigDict(extra="forbid")

    version: int = TRANSCRIPT_VERSION
    run_id: str
    task_id: str
    model: str
    status: RunStatus | None = None
    error_kind: ErrorKind | None = None
    score: float | None = None
    events: list[Event] = Field(default_factory=list)

    def completed(self) -> TaskCompleted | None:
        for event in reversed(self.events):
            if isinstance(event, TaskCompleted):
                return event
        return None


def parse_event(line: str | bytes) -> Event:
    """Parse one JSON-lines event."""
    return event_adapter.validate_json(line)
