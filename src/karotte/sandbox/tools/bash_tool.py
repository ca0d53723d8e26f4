"""The built-in ``bash`` tool: one persistent :class:`BashSession` per run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from karotte.sandbox.confinement.demote import demoted_env
from karotte.sandbox.tools.base import ToolResult
from karotte.sandbox.tools.bash import BashSession, describe
from karotte.sandbox.tools.custom import ToolArguments, ToolContext


class BashOptions(BaseModel):
    """Options of the bash tool (``configure_tools()``: ``{"bash": {...}}``)."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: float | None = Field(
        default=None, gt=0, description="Default per-command timeout (capped by tool_timeout_s)"
    )
    output_limit_chars: int | None = Field(
        default=None, ge=100, description="Output limit (capped by tool_output_limit_chars)"
    )
    cwd: str | None = Field(default=None, description="Initial working directory")
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment (secret-looking names are dropped)"
    )
    kill_all_student_processes: bool = Field(
        default=True,
        description="On restart, kill every process of the student user, not only the session's",
    )


class BashArgs(ToolArguments):
    command: Annotated[str, Field(description="The bash command to run")]
    timeout: Annotated[
        float | None,
        Field(gt=0, description="Timeout in seconds (capped by the run's tool timeout)"),
    ] = None


def _limits_preexec(ctx: ToolContext) -> Callable[[], None] | None:
    """The run's student limits (cgroup, rlimits), applied to the shell before it demotes."""
    if ctx.identity is None:
        return None
    from karotte.sandbox.confinement.limits import active_limits

    limits = active_limits()
    if limits is None or limits.identity.uid != ctx.identity.uid:
        return None
    return limits.preexec


class BashTool:
    name = "bash"
    args_model = BashArgs

    def __init__(self, ctx: ToolContext) -> None:
        self.ctx = ctx
        options = ctx.options if isinstance(ctx.options, BashOptions) else BashOptions()
        config = ctx.config
        self.max_timeout_s = config.tool_timeout_s
        self.default_timeout_s = min(options.timeout_s or config.tool_timeout_s, self.max_timeout_s)
        limit = config.tool_output_limit_chars
        if options.output_limit_chars:
            limit = min(limit, options.output_limit_chars)
        self.session = BashSession(
            ctx.identity,
            demoted_env(ctx.identity, options.env, inherit_path=ctx.identity is None),
            options.cwd or ctx.workdir,
            output_limit_chars=limit,
            kill_all_student_processes=options.kill_all_student_processes,
            before_demote=_limits_preexec(ctx),
        )
        self.description = (
            "Run a command in a persistent bash shell (cd and export persist between calls). "
            "stdout and stderr are merged; stdin is empty. Each command times out after "
            f"{self.default_timeout_s:g}s by default (at most {self.max_timeout_s:g}s); on a "
            "timeout the shell is restarted. Start servers and long jobs in the background "
            "with output to a file."
        )

    async def start(self) -> None:
        await self.session.start()

    async def call(self, args: BaseModel) -> ToolResult:
        assert isinstance(args, BashArgs)
        timeout_s = min(args.timeout or self.default_timeout_s, self.max_timeout_s)
        outcome = await self.session.run(args.command, timeout_s)
        text, is_error = describe(outcome, timeout_s)
        return ToolResult(output=text, is_error=is_error)

    async def aclose(self) -> None:
        await self.session.close()
