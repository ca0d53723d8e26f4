"""The builtin agent loop: the whole of it fits on one screen.

Robustness lives in named helpers: retries in the model client, limits in :class:`StepLimits`,
argument checking in :func:`parse_tool_call`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from karotte.events import MessageAdded, StopReason, ToolCallCompleted, ToolCallStarted
from karotte.events import _Event as Event
from karotte.sandbox.model_client import ModelClient
from karotte.sandbox.tools.base import ToolBox, ToolResult
from karotte.schemas import ChatCompletionMessageToolCall, Message

NUDGE = (
    "Your last reply was empty (no text and no tool call). Continue working on the task; "
    "call a tool, or answer in text when you are done."
)


@dataclass
class StepLimits:
    """Turn, time and context limits of one step. ``exceeded`` names the one that fired."""

    max_turns: int
    deadline: float  # time.monotonic() value
    max_context_tokens: int | None = None
    max_empty_turns: int = 3

    def exceeded(self, turns: int, context_tokens: int) -> StopReason | None:
        if turns >= self.max_turns:
            return "max_turns"
        if time.monotonic() >= self.deadline:
            return "time_limit"
        if self.max_context_tokens is not None and context_tokens >= self.max_context_tokens:
            return "context_limit"
        return None


def parse_tool_call(call: ChatCompletionMessageToolCall) -> dict[str, Any] | ToolResult:
    """The call's arguments, or an error result to hand back to the model."""
    try:
        return call.function.parsed_arguments()
    except ValueError as exc:
        return ToolResult(
            output=f"Error: {exc}. Call the tool again with valid JSON.", is_error=True
        )


def is_empty(message: Message) -> bool:
    return not message.text().strip() and not message.tool_calls


async def run_agent_step(
    model: ModelClient,
    tools: ToolBox,
    messages: list[Message],
    limits: StepLimits,
    step_index: int,
    emit: Callable[[Event], None],
) -> tuple[StopReason, int]:
    """Drive the model until it answers without tool calls or a limit fires.

    ``messages`` is extended in place. Returns the stop reason and the number of turns taken.
    """
    specs = await tools.specs()
    turns, empty_turns, context_tokens = 0, 0, 0
    while (reason := limits.exceeded(turns, context_tokens)) is None:
        reply = await model.complete(messages, specs)
        turns += 1
        messages.append(reply.message)
        context_tokens = reply.usage.input_tokens + reply.usage.output_tokens if reply.usage else 0
        emit(
            MessageAdded(
                step_index=step_index,
                message=reply.message,
                usage=reply.usage,
                model_latency_s=reply.latency_s,
            )
        )
        if is_empty(reply.message):
            empty_turns += 1
            if empty_turns > limits.max_empty_turns:
                return "empty_turns", turns
            messages.append(Message(role="user", content=NUDGE))
            emit(MessageAdded(step_index=step_index, message=messages[-1]))
            continue
        if not reply.message.tool_calls:
            return "model_done", turns
        for call in reply.message.tool_calls:
            messages.append(await execute_tool_call(tools, call, step_index, emit))
    return reason, turns


async def execute_tool_call(
    tools: ToolBox,
    call: ChatCompletionMessageToolCall,
    step_index: int,
    emit: Callable[[Event], None],
) -> Message:
    """Run one tool call, emitting started/completed events; returns the tool message."""
    arguments = parse_tool_call(call)
    emit(
        ToolCallStarted(
            step_index=step_index,
            call_id=call.id,
            name=call.function.name,
            arguments=arguments if isinstance(arguments, dict) else call.function.arguments,
        )
    )
    started = time.monotonic()
    result = (
        arguments
        if isinstance(arguments, ToolResult)
        else await tools.call(call.function.name, arguments)
    )
    emit(
        ToolCallCompleted(
            step_index=step_index,
            call_id=call.id,
            name=call.function.name,
            output=result.output,
            is_error=result.is_error,
            duration_s=time.monotonic() - started,
        )
    )
    content: str | list[dict[str, Any]] = result.output
    if result.images:
        content = [{"type": "text", "text": result.output}] + [
            {"type": "image_url", "image_url": {"url": f"data:{i['mime_type']};base64,{i['data']}"}}
            for i in result.images
        ]
    return Message(role="tool", tool_call_id=call.id, name=call.function.name, content=content)
