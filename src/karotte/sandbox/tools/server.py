"""The MCP server that serves the bound tools (official ``mcp`` SDK, low-level ``Server``).

The same :func:`build_server` object is served in-process to the builtin agent loop (see
:mod:`karotte.sandbox.tools.client`); ``server.streamable_http_app()`` exposes it over
streamable HTTP for external agents. Calls are serialized: one tool call at a time, whatever
the transport.
"""

from __future__ import annotations

import asyncio
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from pydantic import ValidationError

from karotte._version import __version__
from karotte.sandbox.tools.base import ToolResult
from karotte.sandbox.tools.registry import BoundTool

SERVER_NAME = "karotte-tools"


def _optional_branch(node: dict[str, Any]) -> dict[str, Any] | None:
    """For ``{"anyOf": [T, {"type": "null"}], "default": None}`` (``x: T | None = None``): T."""
    branches = node.get("anyOf")
    if not isinstance(branches, list) or len(branches) != 2 or node.get("default", 0) is not None:
        return None
    others = [b for b in branches if b != {"type": "null"}]
    return others[0] if len(others) == 1 and isinstance(others[0], dict) else None


def compact_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema without pydantic's ``title`` keys (property names are kept) and with
    optional arguments (``T | None = None``) shown as plain, non-required ``T``."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            branch = _optional_branch(node)
            if branch is not None:
                extra = {k: v for k, v in node.items() if k not in ("anyOf", "default")}
                node = {**branch, **extra}
            out = {}
            for key, value in node.items():
                if key == "title" and isinstance(value, str):
                    continue
                if key in ("properties", "$defs") and isinstance(value, dict):
                    out[key] = {name: strip(sub) for name, sub in value.items()}
                else:
                    out[key] = strip(value)
            return out
        if isinstance(node, list):
            return [strip(item) for item in node]
        return node

    result = strip(schema)
    assert isinstance(result, dict)
    return result


def validation_message(name: str, exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(arguments)"
        msg = "unknown argument" if err["type"] == "extra_forbidden" else err["msg"]
        problems.append(f"{where}: {msg}")
    return f"Error: invalid arguments for {name}: " + "; ".join(problems)


def to_call_result(result: ToolResult) -> types.CallToolResult:
    content: list[types.ContentBlock] = [types.TextContent(text=result.output)]
    for image in result.images:
        content.append(types.ImageContent(data=image["data"], mime_type=image["mime_type"]))
    return types.CallToolResult(content=content, is_error=result.is_error)


class ToolServer:
    """The bound tools behind one MCP ``Server``; one call at a time."""

    def __init__(self, tools: Sequence[BoundTool]) -> None:
        self.tools = {tool.name: tool for tool in tools}
        # asyncio's lock: its uncontended acquire does not yield (anyio's costs ~0.1 ms a call)
        self._lock = asyncio.Lock()
        self._listing = [
            types.Tool(
                name=tool.name,
                description=tool.description,
                input_schema=compact_schema(tool.args_model.model_json_schema()),
            )
            for tool in tools
        ]
        self.server: Server[Any] = Server(
            SERVER_NAME,
            version=__version__,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        # The SDK's default OpenTelemetry middleware is a no-op without an exporter but still
        # costs ~0.07 ms per call; we record our own events.
        self.server.middleware = []

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=list(self._listing))

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return to_call_result(await self.call(params.name, params.arguments or {}))

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Validate and run one call; tool failures come back as ``is_error`` results."""
        tool = self.tools.get(name)
        if tool is None:
            known = ", ".join(self.tools) or "(none)"
            return ToolResult(
                output=f"Error: no tool named {name!r}; tools: {known}", is_error=True
            )
        try:
            args = tool.args_model.model_validate(arguments)
        except ValidationError as exc:
            return ToolResult(output=validation_message(name, exc), is_error=True)
        async with self._lock:
            try:
                return await tool.call(args)
            except Exception as exc:
                print(f"karotte: tool {name!r} crashed:\n{traceback.format_exc()}", file=sys.stderr)
                return ToolResult(
                    output=f"Error: the tool failed internally ({type(exc).__name__}: {exc})",
                    is_error=True,
                )


def build_server(tools: Sequence[BoundTool]) -> ToolServer:
    return ToolServer(tools)
