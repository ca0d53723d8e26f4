"""Built-in file tools: ``view_lines_in_file`` and ``replace_in_file``.

Every file access happens in a forked child demoted to the student (see
:mod:`karotte.sandbox.confinement.demote`): the kernel checks the student's permissions, and only
regular files are opened (no symlink, FIFO, device), with a size cap and a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from karotte.sandbox.confinement.demote import (
    DemotedCallCrashed,
    DemotedCallTimeout,
    FileAccessError,
    call_as,
    read_file_as,
    read_regular_file,
    start_zygote,
    write_regular_file,
)
from karotte.sandbox.tools.base import ToolResult
from karotte.sandbox.tools.custom import ToolArguments, ToolContext

DEFAULT_MAX_FILE_BYTES = 10 * 1024 * 1024
FILE_TIMEOUT_S = 30.0


class FileToolOptions(BaseModel):
    """Options of the file tools (``configure_tools()``)."""

    model_config = ConfigDict(extra="forbid")

    max_file_bytes: int = Field(default=DEFAULT_MAX_FILE_BYTES, gt=0, le=1024**3)


def file_error(exc: BaseException) -> ToolResult:
    """The error result for a failed file access."""
    if isinstance(exc, DemotedCallTimeout):
        return ToolResult(output="Error: the file access timed out", is_error=True)
    if isinstance(exc, DemotedCallCrashed):
        return ToolResult(output=f"Error: the file access failed ({exc})", is_error=True)
    return ToolResult(output=f"Error: {exc}", is_error=True)


def file_timeout(ctx: ToolContext) -> float:
    """Timeout of one demoted file access: the tool call's, at most FILE_TIMEOUT_S."""
    return min(FILE_TIMEOUT_S, ctx.timeout_s)


# ---- view_lines_in_file ---------------------------------------------------------------------


class ViewLinesArgs(ToolArguments):
    path: Annotated[str, Field(description="File path (absolute, or relative to the workdir)")]
    start_line: Annotated[int, Field(ge=1, description="First line to show (1-based)")] = 1
    end_line: Annotated[
        int | None, Field(ge=1, description="Last line to show (inclusive); default: the end")
    ] = None


def _prewarm() -> None:
    """Boot the zygote now, so the first file-tool call does not wait for it."""
    with contextlib.suppress(OSError):
        start_zygote()


class _TextFileTool:
    """Shared set-up of the text-file tools: the size cap and a warm zygote."""

    def __init__(self, ctx: ToolContext) -> None:
        self.ctx = ctx
        options = ctx.options
        self.max_bytes = (
            options.max_file_bytes
            if isinstance(options, FileToolOptions)
            else DEFAULT_MAX_FILE_BYTES
        )
        _prewarm()


class ViewLinesTool(_TextFileTool):
    name = "view_lines_in_file"
    description = (
        "Show lines of a text file with their line numbers. Long output is cut; the note says "
        "which start_line to use to continue."
    )
    args_model = ViewLinesArgs

    async def call(self, args: BaseModel) -> ToolResult:
        assert isinstance(args, ViewLinesArgs)
        path = self.ctx.resolve_path(args.path)
        try:
            data = await asyncio.to_thread(
                read_file_as,
                self.ctx.identity,
                path,
                max_bytes=self.max_bytes,
                timeout_s=file_timeout(self.ctx),
            )
        except (FileAccessError, DemotedCallTimeout, DemotedCallCrashed) as exc:
            return file_error(exc)
        if b"\0" in data[:8192]:
            return ToolResult(
                output=f"Error: {path} looks like a binary file; inspect it with bash "
                "(e.g. `xxd | head`)",
                is_error=True,
            )
        lines = data.decode("utf-8", errors="replace").splitlines()
        total = len(lines)
        if total == 0:
            return ToolResult(output=f"{path} is empty")
        if args.start_line > total:
            return ToolResult(
                output=f"Error: start_line {args.start_line} is past the end ({path} has "
                f"{total} lines)",
                is_error=True,
            )
        end = min(args.end_line or total, total)
        if end < args.start_line:
            return ToolResult(output="Error: end_line is before start_line", is_error=True)
        limit = self.ctx.config.tool_output_limit_chars
        out = [f"{path} (lines {args.start_line}-{end} of {total})"]
        used = len(out[0])
        for number in range(args.start_line, end + 1):
            row = f"{number:>6}\t{lines[number - 1]}"
            if used + len(row) + 1 > limit:
                out.append(
                    f"[output cut at the limit of {limit} characters; continue with "
                    f"start_line={number}]"
                )
                break
            out.append(row)
            used += len(row) + 1
        return ToolResult(output="\n".join(out))

    async def aclose(self) -> None:
        return None


# ---- replace_in_file ------------------------------------------------------------------------


class ReplaceArgs(ToolArguments):
    path: Annotated[str, Field(description="File path (absolute, or relative to the workdir)")]
    old: Annotated[
        str, Field(description="Exact text to replace; must occur exactly once in the file")
    ]
    new: Annotated[str, Field(description="Replacement text")]


class ReplaceError(Exception):
    """A replacement that cannot be made; the message is for the model."""


def _line_numbers(text: str, needle: str, limit: int = 10) -> list[int]:
    numbers: list[int] = []
    start = 0
    while len(numbers) < limit and (index := text.find(needle, start)) != -1:
        numbers.append(text.count("\n", 0, index) + 1)
        start = index + 1
    return numbers


def replace_once(path: str, old: str, new: str, max_bytes: int) -> str:
    """Replace the single occurrence of ``old`` in ``path``; return a unified diff.

    Runs inside :func:`call_as` (as the student). Raises :class:`ReplaceError` or
    :class:`FileAccessError` with a message for the model.
    """
    data = read_regular_file(path, max_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ReplaceError(f"{path} is not UTF-8 text; edit it with bash instead") from None
    count = text.count(old)
    if count == 0:
        raise ReplaceError(
            f"`old` was not found in {path}. It must match the file exactly, including "
            "whitespace and indentation; view the lines first and copy them."
        )
    if count > 1:
        lines = ", ".join(str(n) for n in _line_numbers(text, old))
        raise ReplaceError(
            f"`old` occurs {count} times in {path} (at lines {lines}); include more "
            "surrounding text so that it matches exactly once."
        )
    updated = text.replace(old, new, 1)
    write_regular_file(path, updated.encode("utf-8"), create=False)
    diff = difflib.unified_diff(
        text.splitlines(keepends=True),
        updated.splitlines(keepends=True),
        fromfile=f"a{path}" if path.startswith("/") else f"a/{path}",
        tofile=f"b{path}" if path.startswith("/") else f"b/{path}",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in diff)


class ReplaceTool(_TextFileTool):
    name = "replace_in_file"
    description = (
        "Replace one exact occurrence of `old` with `new` in a text file and show the diff. "
        "Fails without changing the file when `old` occurs zero or several times."
    )
    args_model = ReplaceArgs

    async def call(self, args: BaseModel) -> ToolResult:
        assert isinstance(args, ReplaceArgs)
        if not args.old:
            return ToolResult(output="Error: `old` must not be empty", is_error=True)
        if args.old == args.new:
            return ToolResult(output="Error: `old` and `new` are identical", is_error=True)
        path = self.ctx.resolve_path(args.path)
        try:
            diff = await asyncio.to_thread(
                call_as,
                self.ctx.identity,
                replace_once,
                path,
                args.old,
                args.new,
                self.max_bytes,
                timeout_s=file_timeout(self.ctx),
            )
        except ReplaceError as exc:
            return ToolResult(output=f"Error: {exc}", is_error=True)
        except (FileAccessError, DemotedCallTimeout, DemotedCallCrashed) as exc:
            return file_error(exc)
        limit = self.ctx.config.tool_output_limit_chars
        if len(diff) > limit:
            diff = diff[:limit] + f"\n[diff cut at {limit} characters; the edit was made]"
        return ToolResult(output=diff or "(no change)")

    async def aclose(self) -> None:
        return None
