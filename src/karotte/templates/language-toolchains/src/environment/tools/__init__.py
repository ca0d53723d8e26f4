"""Custom tools of the environment (`karotte.tools` API). `build` compiles and runs a program.

The tool runs in the harness as root, but every file access and every process of it runs as
the student: the source is read with `ctx.read_file` (refuses symlinks, FIFOs, big files), the
build directory is created and written as the student, and the compiler and the program run
demoted (see `environment.toolchains.runner`). So the tool reaches exactly the toolchain the
student reaches from bash: the one the task's `pre_hook` granted.
"""

from __future__ import annotations

from typing import Annotated

from karotte.tools import ToolContext, ToolError, tool
from pydantic import BaseModel, ConfigDict, Field

from environment.toolchains import TOOLCHAINS, ToolchainError, get_toolchain
from environment.toolchains.runner import Completed, compile_and_run

MAX_SOURCE_BYTES = 1024 * 1024


class BuildOptions(BaseModel):
    """Set by `ToolchainTask.configure_tools()`; the student cannot change them."""

    model_config = ConfigDict(extra="forbid")

    toolchain: str
    compile_timeout_s: float = Field(default=120.0, gt=0)
    run_timeout_s: float = Field(default=30.0, gt=0)
    output_limit_chars: int = Field(default=20_000, ge=200)


def _section(title: str, done: Completed | None) -> str:
    if done is None:
        return ""
    output = done.output.rstrip("\n")
    status = f"{done.describe()} ({done.seconds:.1f}s)"
    return f"$ {title}\n{output}\n{status}\n" if output else f"$ {title}\n{status}\n"


@tool(options=BuildOptions)
async def build(
    source: Annotated[str, Field(description="Path of your source file")],
    ctx: ToolContext,
    stdin: Annotated[str, Field(description="Text given to the program on stdin")] = "",
    run: Annotated[bool, Field(description="Run the program after compiling it")] = True,
) -> str:
    """Compile your program with this task's toolchain and run it; returns the compiler's
    diagnostics and the program's output (stdout and stderr), with exit codes."""
    options = ctx.options
    assert isinstance(options, BuildOptions)
    try:
        toolchain = get_toolchain(options.toolchain)
    except ToolchainError as exc:
        raise ToolError(str(exc)) from exc
    data = await ctx.read_file(source, max_bytes=MAX_SOURCE_BYTES)
    budget = max(2.0, ctx.timeout_s - 5.0)  # both steps fit in the tool call's own limit
    run_timeout = min(options.run_timeout_s, budget / 2)
    limit = min(options.output_limit_chars, ctx.config.tool_output_limit_chars)
    result, _ = await compile_and_run(
        toolchain,
        ctx.resolve_path(source),
        data,
        identity=ctx.identity,
        stdin=stdin.encode(),
        compile_timeout_s=min(options.compile_timeout_s, budget - run_timeout),
        run_timeout_s=run_timeout,
        limit_chars=limit // 2,
        run=run,
    )
    parts = [f"toolchain: {toolchain.title}\n"]
    if result.compiled is None:
        parts.append("(no separate compile step: the program is loaded when it runs)\n")
    else:
        parts.append(_section("compile: " + " ".join(result.compiled.argv), result.compiled))
    if result.ran is not None:
        parts.append(_section("run: " + " ".join(result.ran.argv), result.ran))
    elif not result.compile_ok:
        parts.append("(not run: the compilation failed)\n")
    text = "\n".join(parts)
    if not result.compile_ok or (result.ran is not None and not result.ran.ok):
        raise ToolError(text)
    return text


__all__ = ["TOOLCHAINS", "build"]
