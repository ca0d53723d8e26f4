"""Running a CLI agent as the student, one process per step.

:func:`open_cli_toolbox` (the harness's tool factory for ``agent: cli:<name>``) binds the task's
tools, serves them over streamable HTTP on loopback (the CLI reaches them as MCP server
``karotte``), starts the key forwarder, and yields a :class:`CliToolBox`.
:func:`run_cli_agent_step` (the harness's step function) starts the CLI demoted to the student
with a clean environment, feeds it the step's instructions on stdin, turns its JSON lines into
the same events the builtin loop emits, and stops it at the step's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from karotte.errors import ConfigError, KarotteError, ModelError
from karotte.events import MessageAdded, StopReason, TokenUsage, ToolCallCompleted, ToolCallStarted
from karotte.events import _Event as Event
from karotte.sandbox.cli_agents import cli_agent_name
from karotte.sandbox.cli_agents.base import (
    Assistant,
    CliAgentAdapter,
    Finished,
    Item,
    StepContext,
    ToolEnd,
    ToolStart,
    Usage,
    agents_dir,
)
from karotte.sandbox.cli_agents.forwarder import KeyForwarder, serve_loopback, stop_server
from karotte.sandbox.cli_agents.registry import get_adapter
from karotte.sandbox.confinement.demote import (
    Identity,
    demoted_env,
    preexec_for,
    run_as,
    student_identity,
    write_file_as,
)
from karotte.sandbox.tools.base import ToolResult
from karotte.schemas import Message

if TYPE_CHECKING:
    from karotte.config import EvaluationRunConfig
    from karotte.sandbox.agent import StepLimits
    from karotte.sandbox.model_client import ModelClient
    from karotte.sandbox.tools.base import ToolBox
    from karotte.task import Task

STREAM_LINE_LIMIT = 64 * 1024 * 1024
STDERR_KEEP = 8000
RAW_LOG_LIMIT = 64 * 1024 * 1024  # per step
# The stream is the student's own account (the student can write to its CLI's stdout too): it
# is bounded so that it cannot fill the harness's memory. A legitimate step prints far fewer.
MAX_EVENTS_PER_STEP = 50_000
PROVIDER_DEFAULTS = {
    "anthropic": ("https://api.anthropic.com", ("ANTHROPIC_BASE_URL",), "ANTHROPIC_API_KEY"),
    "openai": (
        "https://api.openai.com/v1",
        ("OPENAI_BASE_URL", "OPENAI_API_BASE"),
        "OPENAI_API_KEY",
    ),
    "mistral": ("https://api.mistral.ai/v1", ("MISTRAL_BASE_URL",), "MISTRAL_API_KEY"),
}


def provider_model(model: str) -> str:
    """The provider's own model name: ``anthropic/claude-x`` → ``claude-x``."""
    return model.split("/", 1)[1] if "/" in model else model


def upstream_for(config: EvaluationRunConfig, provider: str) -> tuple[str, str | None]:
    """The real endpoint and key: the run config's, else the harness environment's (set by the
    launcher, e.g. the model proxy relay), else the provider's public API."""
    default, base_vars, key_var = PROVIDER_DEFAULTS[provider]
    base = config.model_api_base or next(
        (os.environ[v] for v in base_vars if os.environ.get(v)), default
    )
    key = config.resolved_api_key() or os.environ.get(key_var)
    return base, key


@dataclass
class CliAgentSession:
    """The per-run state of a CLI agent: adapter, forwarder, tool server, directories."""

    adapter: CliAgentAdapter
    config: EvaluationRunConfig
    identity: Identity | None
    forwarder: KeyForwarder
    mcp_url: str
    install_dir: Path
    state_dir: Path
    config_dir: Path
    session_id: str | None = None
    real_key: str | None = None
    usage_total: TokenUsage = field(default_factory=TokenUsage)  # for cumulative reports
    timings: list[dict[str, float]] = field(default_factory=list)

    def context(self, prompt: str, system_prompt: str | None, limits: StepLimits) -> StepContext:
        return StepContext(
            prompt=prompt,
            system_prompt=system_prompt,
            model=provider_model(self.config.model),
            model_base_url=self.forwarder.url,
            placeholder_key=self.forwarder.placeholder,
            mcp_url=self.mcp_url,
            install_dir=self.install_dir,
            state_dir=self.state_dir,
            config_dir=self.config_dir,
            workdir=workdir_of(self.identity),
            session_id=self.session_id,
            max_turns=limits.max_turns,
            max_output_tokens=self.config.max_output_tokens,
            reasoning_effort=self.config.reasoning_effort,
            tool_timeout_s=self.config.tool_timeout_s + 30,
        )


def usage_since(before: TokenUsage, total: TokenUsage) -> TokenUsage:
    """What a running total grew by since ``before`` (never negative)."""
    return TokenUsage(
        input_tokens=max(0, total.input_tokens - before.input_tokens),
        output_tokens=max(0, total.output_tokens - before.output_tokens),
        cached_input_tokens=max(0, total.cached_input_tokens - before.cached_input_tokens),
        reasoning_tokens=max(0, total.reasoning_tokens - before.reasoning_tokens),
    )


def workdir_of(identity: Identity | None) -> str:
    if identity is None:
        return os.getcwd()
    return "/workdir" if os.path.isdir("/workdir") else identity.home


class CliToolBox:
    """The task's tools for a CLI agent: served over HTTP to the CLI, and callable directly."""

    def __init__(self, server: Any, session: CliAgentSession) -> None:
        self._server = server
        self.session = session

    async def specs(self) -> list[dict[str, Any]]:
        return []  # the CLI lists the tools itself, over MCP

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        result: ToolResult = await self._server.call(name, arguments)
        return result

    async def aclose(self) -> None:
        return None


def _private_dir(prefix: str, owner: Identity | None, mode: int) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if owner is not None and os.geteuid() == 0:
        os.chown(path, owner.uid, owner.gid)
    path.chmod(mode)
    return path


@asynccontextmanager
async def open_cli_toolbox(config: EvaluationRunConfig, task: Task) -> AsyncIterator[CliToolBox]:
    """The harness's tool factory for a CLI agent (see the module docstring)."""
    from karotte.sandbox.tools.registry import bind_tools, close_tools
    from karotte.sandbox.tools.server import build_server

    name = cli_agent_name(config.agent)
    if name is None:
        raise ConfigError(f"agent {config.agent!r} is not a CLI agent (cli:<name>)")
    adapter = get_adapter(name)
    install_dir = agents_dir() / adapter.name
    problem = adapter.check_installed(install_dir)
    if problem:
        raise ConfigError(problem)
    identity = student_identity(config.student_user) if config.student_user else None
    base, key = upstream_for(config, adapter.provider)
    tools = await bind_tools(config, task)
    forwarder = KeyForwarder(base, key, timeout_s=config.model_retry_budget_s + 600)
    server = mcp_server = mcp_task = None
    state_dir = _private_dir("karotte-cli-state-", identity, 0o700)
    config_dir = _private_dir("karotte-cli-config-", None, 0o755)
    try:
        served = build_server(tools)
        app = served.server.streamable_http_app(stateless_http=True, json_response=True)
        mcp_server, mcp_task, port = await serve_loopback(app)
        await forwarder.start()
        session = CliAgentSession(
            adapter=adapter,
            config=config,
            identity=identity,
            forwarder=forwarder,
            mcp_url=f"http://127.0.0.1:{port}/mcp",
            install_dir=install_dir,
            state_dir=state_dir,
            config_dir=config_dir,
            real_key=key,
        )
        server = served
        yield CliToolBox(server, session)
    finally:
        await forwarder.stop()
        await stop_server(mcp_server, mcp_task)
        await close_tools(tools)
        shutil.rmtree(state_dir, ignore_errors=True)
        shutil.rmtree(config_dir, ignore_errors=True)


def open_raw_log(config: EvaluationRunConfig, step_index: int) -> BinaryIO | None:
    """The CLI's own JSON lines of one step, kept as an artifact (``cli-agent/step-N.jsonl``)."""
    try:
        directory = config.artifacts_dir / "cli-agent"
        directory.mkdir(parents=True, exist_ok=True)
        return open(directory / f"step-{step_index}.jsonl", "wb")
    except OSError as exc:
        print(f"karotte: cannot keep the CLI agent's stream: {exc}", file=sys.stderr)
        return None


def _check_no_key(
    session: CliAgentSession, argv: list[str], env: dict[str, str], files: dict[Path, str]
) -> None:
    key = session.real_key
    if not key:
        return
    blobs = [*argv, *env.values(), *files.values()]
    if any(key in blob for blob in blobs):
        raise KarotteError(
            f"CLI agent {session.adapter.name!r}: the adapter put the real API key into the "
            "student's argv, environment or files; refusing to start it"
        )


def _write_config_files(files: dict[Path, str], session: CliAgentSession) -> None:
    """Write the adapter's files. The state directory belongs to the student, who may have
    planted symlinks in it: files there are written *as the student* (never through a final
    symlink, with the student's own permissions for the rest), never by root. The config
    directory is root's and only readable by the student."""
    for path, text in files.items():
        inside_state = session.state_dir in path.parents
        if not inside_state and session.config_dir not in path.parents:
            raise KarotteError(f"adapter wrote outside its directories: {path}")
        if inside_state:
            run_as(session.identity, os.makedirs, str(path.parent), 0o700, exist_ok=True)
            write_file_as(session.identity, str(path), text.encode(), mode=0o600)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        path.chmod(0o644)


@dataclass
class _Emitter:
    """Emits parsed items as transcript events, holding one assistant message back so usage
    reported after it (end of a turn) lands on it. Also builds the step's messages."""

    step_index: int
    emit: Callable[[Event], None]
    messages: list[Message]
    pending: Assistant | None = None
    started: dict[str, float] = field(default_factory=dict)
    turns: int = 0
    lines: int = 0
    finished: Finished | None = None
    extra_usage: TokenUsage = field(default_factory=TokenUsage)

    def flush(self) -> None:
        if self.pending is not None:
            self.messages.append(self.pending.message)
            self.emit(
                MessageAdded(
                    step_index=self.step_index,
                    message=self.pending.message,
                    usage=self.pending.usage,
                    timestamp=self.pending.at,
                )
            )
            self.turns += 1
            self.pending = None

    def handle(self, item: Item) -> None:
        if isinstance(item, Usage):
            if self.pending is not None:
                self.pending.usage = (self.pending.usage or TokenUsage()) + item.usage
            else:
                self.extra_usage = self.extra_usage + item.usage
            return
        self.flush()
        if isinstance(item, Assistant):
            self.pending = item
        elif isinstance(item, ToolStart):
            self.started[item.call_id] = item.at
            self.emit(
                ToolCallStarted(
                    step_index=self.step_index,
                    call_id=item.call_id,
                    name=item.name,
                    arguments=item.arguments,
                    timestamp=item.at,
                )
            )
        elif isinstance(item, ToolEnd):
            began = self.started.pop(item.call_id, time.time())
            self.emit(
                ToolCallCompleted(
                    step_index=self.step_index,
                    call_id=item.call_id,
                    name=item.name,
                    output=item.output,
                    is_error=item.is_error,
                    duration_s=max(0.0, time.time() - began),
                )
            )
            self.messages.append(
                Message(role="tool", tool_call_id=item.call_id, name=item.name, content=item.output)
            )
        elif isinstance(item, Finished):
            self.finished = item


async def _read_line(stream: asyncio.StreamReader) -> bytes:
    """The next line; an over-long line (beyond STREAM_LINE_LIMIT) is skipped, not fatal."""
    while True:
        try:
            return await stream.readline()
        except ValueError:  # asyncio: "chunk exceed the limit"; the buffer was cleared
            continue


async def _drain(stream: asyncio.StreamReader, keep: bytearray) -> None:
    while chunk := await stream.read(65536):
        keep.extend(chunk)
        if len(keep) > 2 * STDERR_KEEP:
            del keep[: len(keep) - STDERR_KEEP]


EXIT_GRACE_S = 1.0


async def _lines(proc: asyncio.subprocess.Process) -> AsyncGenerator[bytes, None]:
    """The CLI's stdout lines until EOF, or until it has exited and its last output is read:
    a background process of the student holding the pipe open cannot stall the step."""
    assert proc.stdout is not None
    exited = asyncio.ensure_future(_exited(proc))
    try:
        while True:
            if exited.done():
                try:
                    line = await asyncio.wait_for(_read_line(proc.stdout), EXIT_GRACE_S)
                except TimeoutError:
                    return
            else:
                read = asyncio.ensure_future(_read_line(proc.stdout))
                await asyncio.wait({read, exited}, return_when=asyncio.FIRST_COMPLETED)
                if not read.done():
                    read.cancel()
                    continue  # exited: read on with the grace bound
                line = read.result()
            if not line:
                return
            yield line
    finally:
        exited.cancel()


async def _exited(proc: asyncio.subprocess.Process, poll_s: float = 0.02) -> int:
    """The exit status, without waiting for the pipes to close (``Process.wait`` does, and a
    background process of the student may hold them open)."""
    while proc.returncode is None:  # noqa: ASYNC110 (asyncio has no exit event apart from wait)
        await asyncio.sleep(poll_s)
    return proc.returncode


async def _reap(proc: asyncio.subprocess.Process) -> None:
    """After the kill: wait (bounded) for the exit, then drop our ends of the pipes."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(_exited(proc), 10)
    transport = getattr(proc, "_transport", None)  # asyncio keeps it private
    if transport is not None:
        transport.close()


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def run_cli_agent_step(
    model: ModelClient,
    tools: ToolBox,
    messages: list[Message],
    limits: StepLimits,
    step_index: int,
    emit: Callable[[Event], None],
) -> tuple[StopReason, int]:
    """One step of a CLI agent (the harness's step function; ``model`` is unused)."""
    if not isinstance(tools, CliToolBox):
        raise ConfigError("a CLI agent needs the tools from open_cli_toolbox")
    session = tools.session
    first = session.session_id is None
    system_prompt = (
        messages[0].text() if first and messages and messages[0].role == "system" else None
    )
    ctx = session.context(messages[-1].text(), system_prompt, limits)
    adapter = session.adapter
    argv, files = adapter.argv(ctx), adapter.config_files(ctx)
    env = {
        **demoted_env(session.identity, inherit_path=session.identity is None),
        **adapter.env(ctx),
    }
    _check_no_key(session, argv, env, files)
    _write_config_files(files, session)
    emitter = _Emitter(step_index, emit, messages)
    parser = adapter.parser()
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=ctx.workdir,
        preexec_fn=preexec_for(session.identity) if session.identity is not None else None,
        start_new_session=True,
        limit=STREAM_LINE_LIMIT,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stderr = bytearray()
    drain = asyncio.create_task(_drain(proc.stderr, stderr))
    first_event_at: float | None = None
    stop: StopReason | None = None
    raw_log = open_raw_log(session.config, step_index)
    logged = 0
    try:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(adapter.prompt(ctx).encode())
            await proc.stdin.drain()
            proc.stdin.close()
        async with asyncio.timeout(max(0.0, limits.deadline - time.monotonic())):
            async with contextlib.aclosing(_lines(proc)) as lines:
                async for line in lines:
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue  # a log line
                    if not isinstance(event, dict):
                        continue
                    first_event_at = first_event_at or time.monotonic()
                    emitter.lines += 1
                    if emitter.lines > MAX_EVENTS_PER_STEP:
                        print(
                            f"karotte: CLI agent {adapter.name!r} printed more than "
                            f"{MAX_EVENTS_PER_STEP} events in one step; stopped",
                            file=sys.stderr,
                        )
                        stop = "error"
                        break
                    if raw_log is not None and logged < RAW_LOG_LIMIT:
                        raw_log.write(line)
                        logged += len(line)
                    for item in parser.feed(event):
                        if isinstance(item, Usage) and parser.cumulative_usage:
                            item = Usage(usage_since(session.usage_total, item.usage))
                            session.usage_total = session.usage_total + item.usage
                        emitter.handle(item)
            if stop is None:
                await _exited(proc)
                for item in parser.end(proc.returncode if proc.returncode is not None else -1):
                    emitter.handle(item)
    except TimeoutError:
        stop = "time_limit"
    finally:
        _kill_group(proc)
        await _reap(proc)
        drain.cancel()
        with contextlib.suppress(BaseException):
            await drain
        emitter.flush()
        if raw_log is not None:
            raw_log.close()
    session.session_id = parser.session_id or session.session_id
    session.timings.append(
        {
            "first_event_s": (first_event_at or time.monotonic()) - started,
            "step_s": time.monotonic() - started,
        }
    )
    if stop is not None:
        return stop, emitter.turns
    finished = emitter.finished
    tail = stderr.decode(errors="replace")[-2000:].strip()
    if finished is None:
        raise KarotteError(
            f"CLI agent {adapter.name!r} exited with status {proc.returncode} before finishing "
            f"the step{': ' + tail if tail else ''}"
        )
    if finished.stop_reason == "error":
        print(
            f"karotte: CLI agent {adapter.name!r} failed: {finished.error}\n{tail}", file=sys.stderr
        )
        raise ModelError(f"CLI agent {adapter.name!r} failed: {finished.error}")
    return finished.stop_reason, finished.turns if finished.turns is not None else emitter.turns
