"""Tools served to the agent over MCP.

:func:`open_toolbox` binds the task's tools (built-in and custom, see :mod:`.registry`), serves
them with an MCP server (:mod:`.server`) and yields a :class:`~.base.ToolBox` speaking MCP to it
(:mod:`.client`). The MCP SDK is imported lazily: it is slow to import and only the harness
needs it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Literal

from karotte.sandbox.tools.base import ToolBox, ToolResult

if TYPE_CHECKING:
    from karotte.config import EvaluationRunConfig
    from karotte.task import Task

CLIENT_TIMEOUT_GRACE_S = 30.0


@asynccontextmanager
async def open_toolbox(
    config: EvaluationRunConfig, task: Task, *, transport: Literal["direct", "memory"] = "direct"
) -> AsyncIterator[ToolBox]:
    """The task's tools as a ToolBox, served over MCP in-process; closed (and killed) on exit.

    ``transport``: see :func:`karotte.sandbox.tools.client.connect_toolbox`. Raises
    :class:`~karotte.errors.TaskLoadError` for an unknown tool name or bad options.
    """
    from karotte.sandbox.tools.client import connect_toolbox
    from karotte.sandbox.tools.registry import bind_tools, close_tools
    from karotte.sandbox.tools.server import build_server

    tools = await bind_tools(config, task)
    try:
        served = build_server(tools)
        timeout = config.tool_timeout_s + CLIENT_TIMEOUT_GRACE_S
        try:
            async with connect_toolbox(served.server, timeout, transport) as toolbox:
                yield toolbox
        except BaseExceptionGroup as group:
            # The SDK's task groups wrap whatever the caller raised inside the `async with`
            # (e.g. the harness's own abort); hand it back unwrapped.
            leaf = single_exception(group)
            if leaf is None:
                raise
            raise leaf.with_traceback(leaf.__traceback__) from leaf.__cause__
    finally:
        await close_tools(tools)


def single_exception(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The only exception in (nested, single-member) exception groups, else None."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return None if isinstance(exc, BaseExceptionGroup) else exc


__all__ = ["ToolBox", "ToolResult", "open_toolbox"]
