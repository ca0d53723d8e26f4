"""The tool layer's small surface, shared by built-in tools, custom tools and the agent loop."""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict


class ToolResult(BaseModel):
    """What a tool call returns to the model: text, optional images, and whether it failed."""

    model_config = ConfigDict(extra="forbid")

    output: str
    is_error: bool = False
    images: list[dict[str, str]] = []  # [{"mime_type": "image/png", "data": "<base64>"}]


class ToolBox(Protocol):
    """The agent loop's view of the tools: specs for the model, and one call at a time."""

    async def specs(self) -> list[dict[str, Any]]:
        """OpenAI-style function specs (``{"type": "function", "function": {...}}``)."""
        ...

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one tool call. Never raises for tool failures: they come back as ``is_error``."""
        ...

    async def aclose(self) -> None: ...
