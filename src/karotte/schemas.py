"""Chat message types, shaped like the OpenAI chat API that litellm speaks.

These are part of the public contract: environments build scripted fake-model messages from them.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Function(BaseModel):
    """The function part of a tool call: a tool name and its JSON-encoded arguments."""

    model_config = ConfigDict(extra="ignore")

    name: str
    arguments: str = "{}"

    def parsed_arguments(self) -> dict[str, Any]:
        """Arguments as a dict. Raises ``ValueError`` with a readable message when malformed."""
        try:
            value = json.loads(self.arguments or "{}")
        except json.JSONDecodeError as exc:
            raise ValueError(f"tool arguments are not valid JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise ValueError(f"tool arguments must be a JSON object, got {type(value).__name__}")
        return value


class ChatCompletionMessageToolCall(BaseModel):
    """A tool call requested by the model."""

    model_config = ConfigDict(extra="ignore")

    id: str
    type: Literal["function"] = "function"
    function: Function


class Message(BaseModel):
    """One chat message. ``role`` is ``system``, ``user``, ``assistant`` or ``tool``."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ChatCompletionMessageToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = Field(default=None, description="Model reasoning, if any.")

    def text(self) -> str:
        """The message's text content (text parts joined for multi-part content)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(
            str(part.get("text", "")) for part in self.content if part.get("type") == "text"
        )

    def to_litellm(self) -> dict[str, Any]:
        """The dict litellm expects (None fields dropped)."""
        return self.model_dump(exclude_none=True, exclude={"reasoning_content"})


def assistant(
    content: str | None = None, tool_calls: list[ChatCompletionMessageToolCall] | None = None
) -> Message:
    """Shorthand for an assistant message (handy in fake-model scripts)."""
    return Message(role="assistant", content=content, tool_calls=tool_calls)


def tool_call(call_id: str, name: str, **arguments: Any) -> ChatCompletionMessageToolCall:
    """Shorthand for a tool call with keyword arguments (handy in fake-model scripts)."""
    return ChatCompletionMessageToolCall(
        id=call_id, function=Function(name=name, arguments=json.dumps(arguments))
    )
