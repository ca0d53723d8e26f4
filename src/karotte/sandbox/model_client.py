"""Model clients: what the agent loop calls to get the next assistant message.

:class:`FakeModelClient` replays scripted messages (``environment.fake_model.get_messages``) so runs
are reproducible offline. The litellm client lives in :mod:`karotte.sandbox.litellm_client`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from karotte.events import TokenUsage
from karotte.schemas import Message


class ModelReply(BaseModel):
    model_config = ConfigDict(extra="forbid")

    message: Message
    usage: TokenUsage | None = None
    latency_s: float = 0.0


class ModelClient(Protocol):
    async def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> ModelReply:
        """The next assistant message. Raises :class:`karotte.errors.ModelError` on failure."""
        ...


class FakeModelClient:
    """Replays a script of assistant messages, one per model call, across all steps.

    When the script runs out it answers with a plain text message, which ends the step.
    """

    def __init__(self, script: Iterable[Message]) -> None:
        self._script = [m if isinstance(m, Message) else Message.model_validate(m) for m in script]
        for index, message in enumerate(self._script):
            if message.role != "assistant":
                raise ValueError(
                    f"fake model script entry {index} has role {message.role!r}; "
                    "only assistant messages can be scripted"
                )
        self._position = 0

    async def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> ModelReply:
        if self._position >= len(self._script):
            return ModelReply(
                message=Message(role="assistant", content="(fake model: script done)")
            )
        message = self._script[self._position]
        self._position += 1
        return ModelReply(message=message.model_copy(deep=True), usage=TokenUsage())
