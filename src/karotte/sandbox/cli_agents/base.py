"""What a CLI agent adapter is: how to install a coding agent's CLI, how to start it for one
step, and how to read its streamed JSON.

An adapter never sees the real API key: it gets the loopback forwarder's URL and a placeholder
key (:class:`StepContext`), and that is all it may write into the CLI's argv, environment and
config files.
"""

from __future__ import annotations

import os
import shlex
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from karotte.events import StopReason, TokenUsage
from karotte.schemas import Message

Provider = Literal["anthropic", "openai", "mistral"]

AGENTS_DIR = "/opt/karotte/agents"
AGENTS_DIR_ENV = "KAROTTE_CLI_AGENTS_DIR"  # tests install into a cache directory instead
MCP_SERVER_NAME = "karotte"


def agents_dir() -> Path:
    """Where adapters are installed (root-owned, read-only for the student)."""
    return Path(os.environ.get(AGENTS_DIR_ENV) or AGENTS_DIR)


@dataclass
class StepContext:
    """Everything an adapter needs to start its CLI for one step."""

    prompt: str
    system_prompt: str | None  # only on a fresh session (the first step)
    model: str  # the provider's own model name (the litellm prefix stripped)
    model_base_url: str  # the loopback forwarder
    placeholder_key: str
    mcp_url: str  # Karotte's tools over streamable HTTP
    install_dir: Path
    state_dir: Path  # the CLI's own state (sessions, caches): the student's, persistent per run
    config_dir: Path  # root-owned, readable by the student: config files written by the harness
    workdir: str
    session_id: str | None = None  # resume this session (later steps)
    max_turns: int | None = None
    max_output_tokens: int | None = None
    reasoning_effort: str | None = None
    tool_timeout_s: float = 180.0  # Karotte's own bound on a tool call (plus a grace)


# ---- what a parser turns the CLI's stream into -----------------------------------------------
@dataclass
class Assistant:
    """One assistant message (text and/or tool calls), with the usage of its model call."""

    message: Message
    usage: TokenUsage | None = None
    at: float = field(default_factory=time.time)  # when the CLI reported it


@dataclass
class ToolStart:
    call_id: str
    name: str
    arguments: dict[str, Any] | str
    at: float = field(default_factory=time.time)


@dataclass
class ToolEnd:
    call_id: str
    name: str
    output: str
    is_error: bool = False


@dataclass
class Usage:
    """Token usage reported apart from a message (e.g. at the end of a turn)."""

    usage: TokenUsage


@dataclass
class Finished:
    stop_reason: StopReason
    session_id: str | None = None
    error: str | None = None  # the CLI's own account of a failure
    turns: int | None = None


Item = Assistant | ToolStart | ToolEnd | Usage | Finished


class StreamParser(ABC):
    """Turns the CLI's JSON lines, one object at a time, into items. ``session_id`` is the
    session to resume in the next step, once known."""

    session_id: str | None = None
    # True when Usage items are running totals of the whole session (resumed across steps)
    cumulative_usage: bool = False

    @abstractmethod
    def feed(self, event: dict[str, Any]) -> list[Item]: ...

    def end(self, returncode: int) -> list[Item]:
        """Items once the CLI has exited (for CLIs whose stream has no final event)."""
        return []


def karotte_tool_name(name: str, prefixes: tuple[str, ...]) -> str:
    """``mcp__karotte__bash`` → ``bash``: Karotte's tools keep their own names in events."""
    for prefix in prefixes:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


@dataclass
class CliAgentAdapter(ABC):
    """One coding-agent CLI. Subclass it (or register one by the ``karotte.cli_agents`` entry
    point group) to add an agent."""

    name: str
    package: str
    version: str
    provider: Provider
    description: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)
    # Installed on the host (``karotte agents add/fetch``, into ``.karotte/agents/<name>``) and
    # copied into the image: the image build then needs no registry (like the wheelhouse). An
    # install that is not relocatable (a venv) runs inside the image build instead.
    stage_on_host: bool = True
    runtime_packages: tuple[str, ...] = ()  # Debian packages the CLI needs in the image

    # ---- image build ------------------------------------------------------------------------
    @abstractmethod
    def install_commands(self, prefix: str) -> list[str]:
        """Shell commands (run as root) that install the CLI into ``prefix``: on the host when
        ``stage_on_host``, else in the image build."""

    def containerfile_snippet(self) -> str:
        """The Containerfile lines that install this adapter into the image."""
        prefix = f"{AGENTS_DIR}/{self.name}"
        q = shlex.quote(prefix)
        title = f"# {self.description or self.name} ({self.package} {self.version}), root-owned"
        steps: list[str] = []
        if self.runtime_packages:
            wanted = " ".join(self.runtime_packages)
            steps.append(
                f"apt-get update && apt-get install -y --no-install-recommends {wanted} "
                "&& rm -rf /var/lib/apt/lists/*"
            )
        if not self.stage_on_host:
            body = " \\\n    && ".join([*steps, *self.install_commands(prefix)])
            return f"{title}\nRUN {body} \\\n    && chmod -R go-w {q}\n"
        steps.append(f"chown -R root:root {q} && chmod -R go-w {q}")
        body = " \\\n    && ".join(steps)
        return (
            f"{title}\n# (`karotte agents fetch` installs it into .karotte/agents/ here)\n"
            f"COPY .karotte/agents/{self.name}/ {prefix}/\n"
            f"RUN {body}\n"
        )

    # ---- one step -----------------------------------------------------------------------------
    @abstractmethod
    def executable(self, install_dir: Path) -> Path:
        """The CLI's entry point inside ``install_dir``."""

    @abstractmethod
    def argv(self, ctx: StepContext) -> list[str]: ...

    def env(self, ctx: StepContext) -> dict[str, str]:
        """Variables for the CLI, added to the student's clean environment (placeholder only)."""
        return dict(self.extra_env)

    def config_files(self, ctx: StepContext) -> dict[Path, str]:
        """Files to write before the CLI starts (absolute paths under ``ctx.config_dir`` or
        ``ctx.state_dir``). They may hold the placeholder, never the real key."""
        return {}

    def prompt(self, ctx: StepContext) -> str:
        """What the CLI reads on stdin: the step's instructions."""
        return ctx.prompt

    @abstractmethod
    def parser(self) -> StreamParser: ...

    def check_installed(self, install_dir: Path) -> str | None:
        """Why the CLI cannot run from ``install_dir`` (None: it can)."""
        exe = self.executable(install_dir)
        if not exe.exists():
            return (
                f"CLI agent {self.name!r} is not installed: {exe} is missing. Add it to the "
                f"environment's image with `karotte agents add {self.name}` and rebuild."
            )
        return None
