"""The public API for custom tools and for acting as the student.

Write custom tools in your environment's ``environment/tools`` package (any module in it)::

    from karotte.tools import ToolContext, ToolError, tool

    @tool
    async def submit(answer: str, ctx: ToolContext) -> str:
        \"\"\"Submit your final answer.\"\"\"
        ...

and name them in ``Task.tools``. Custom tools run inside the harness **as root**: read or write
anything the student controls only through ``ctx.read_file`` / ``ctx.write_file`` /
``ctx.run_as_student`` or the demotion helpers below (see ``docs/tools.md``).
"""

from __future__ import annotations

from karotte.sandbox.confinement.demote import (
    DemotedCallCrashed,
    DemotedCallTimeout,
    DemotionError,
    FileAccessError,
    FileTooLargeError,
    Identity,
    call_as,
    current_identity,
    demote_current_process,
    demoted_env,
    is_secret_name,
    open_regular_file,
    preexec_for,
    read_file_as,
    read_regular_file,
    run_as,
    set_parent_death_signal,
    student_identity,
    write_file_as,
    write_regular_file,
)
from karotte.sandbox.tools.base import ToolResult
from karotte.sandbox.tools.custom import FunctionTool, NoOptions, ToolContext, ToolError, tool

__all__ = [
    "DemotedCallCrashed",
    "DemotedCallTimeout",
    "DemotionError",
    "FileAccessError",
    "FileTooLargeError",
    "FunctionTool",
    "Identity",
    "NoOptions",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "call_as",
    "current_identity",
    "demote_current_process",
    "demoted_env",
    "is_secret_name",
    "open_regular_file",
    "preexec_for",
    "read_file_as",
    "read_regular_file",
    "run_as",
    "set_parent_death_signal",
    "student_identity",
    "tool",
    "write_file_as",
    "write_regular_file",
]
