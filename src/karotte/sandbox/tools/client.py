"""The agent loop's :class:`~karotte.sandbox.tools.base.ToolBox`, speaking MCP to the tool server.

In-process, the SDK's ``Client`` connects to the server object: ``"direct"`` (default) uses the
SDK's in-process dispatch (no JSON-RPC framing, fastest); ``"memory"`` uses the SDK's
``InMemoryTransport`` (``mode="legacy"``: JSON-RPC messages over memory streams, with the
initialize handshake, like a real transport). The tool
server is the same one an external agent would reach over streamable HTTP.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import mcp_types as types
from mcp import Client
from mcp.server import Server

from karotte.sandbox.tools.base import ToolResult


def openai_spec(tool: types.Tool) -> dict[str, Any]:
    """An MCP tool listing entry as an OpenAI-style function spec."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description or "",
            "parameters": tool.input_schema,
        },
    }


def from_call_result(result: types.CallToolResult) -> ToolResult:
    texts: list[str] = []
    images: list[dict[str, str]] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            texts.append(block.text)
        elif isinstance(block, types.ImageContent):
            images.append({"mime_type": block.mime_type, "data": block.data})
        else:
            texts.append(f"[{block.type} content omitted]")
    return ToolResult(output="\n".join(texts), is_error=result.is_error, images=images)


class McpToolBox:
    """A ToolBox over a connected MCP client session."""

    def __init__(self, client: Client, call_timeout_s: float) -> None:
        self._client = client
        self._call_timeout_s = call_timeout_s
        self._specs: list[dict[str, Any]] | None = None

    async def specs(self) -> list[dict[str, Any]]:
        if self._specs is None:
            listing = await self._client.list_tools()
            self._specs = [openai_spec(tool) for tool in listing.tools]
        return [dict(spec) for spec in self._specs]

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        try:
            result = await self._client.call_tool(
                name, arguments, read_timeout_seconds=self._call_timeout_s
            )
        except Exception as exc:
            return ToolResult(
                output=f"Error: the tool call failed ({type(exc).__name__}: {exc})", is_error=True
            )
        return from_call_result(result)

    async def aclose(self) -> None:
        return None


Transport = Literal["direct", "memory"]


@asynccontextmanager
async def connect_toolbox(
    server: Server[Any], call_timeout_s: float, transport: Transport = "direct"
) -> AsyncIterator[McpToolBox]:
    """Connect an MCP client to ``server`` in-process and yield it as a ToolBox."""
    # mode="legacy" makes the SDK serve an in-process Server through its InMemoryTransport
    mode = "legacy" if transport == "memory" else "auto"
    async with Client(server, read_timeout_seconds=call_timeout_s, cache=None, mode=mode) as client:
        yield McpToolBox(client, call_timeout_s)
