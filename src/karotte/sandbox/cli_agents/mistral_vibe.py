"""Mistral Vibe (PyPI ``mistral-vibe``): a Rust front end plus a Python app server.

Its wheels need **Python >= 3.12**. Karotte's images are Debian bookworm (Python 3.11), so the
install step looks for ``python3.13`` / ``python3.12`` / a ``python3`` that is new enough and
otherwise fails the image build with a message saying so. Debian trixie's ``python3`` (3.13) is
not a way out on a bookworm image: installing it pulls trixie's libc6 and half the base system.
Use a base image with Python >= 3.12 (``BASE_IMAGE`` build argument, e.g. a trixie-based one).
The step runs ``vibe --prompt ... --output streaming`` (JSON lines); see :class:`VibeStreamParser`.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from karotte.sandbox.cli_agents.base import (
    MCP_SERVER_NAME,
    Assistant,
    CliAgentAdapter,
    Item,
    StepContext,
    StreamParser,
    ToolEnd,
    ToolStart,
    karotte_tool_name,
)
from karotte.schemas import ChatCompletionMessageToolCall, Function, Message

MISTRAL_VIBE_VERSION = "3.0.3"
MIN_PYTHON = (3, 12)
PYTHON_TOO_OLD = (
    "mistral-vibe needs Python >= 3.12 and this image has none (Debian bookworm ships 3.11); "
    "build the environment on a base image with Python >= 3.12"
)


def find_python_script() -> str:
    """A shell snippet setting ``$py`` to a Python >= 3.12, or failing with the reason."""
    want = ".".join(map(str, MIN_PYTHON))
    return (
        "py=; for c in python3.14 python3.13 python3.12 python3; do "
        'if command -v "$c" >/dev/null 2>&1 && "$c" -c '
        f"'import sys; sys.exit(sys.version_info < ({MIN_PYTHON[0]}, {MIN_PYTHON[1]}))'"
        ' 2>/dev/null; then py="$(command -v "$c")"; break; fi; done; '
        f'if [ -z "$py" ]; then echo "karotte: {PYTHON_TOO_OLD} (want >= {want})" >&2; exit 1; fi'
    )


@dataclass
class VibeStreamParser(StreamParser):
    """Vibe's ``--output streaming``: one JSON message per line (``role`` = ``assistant`` with
    ``content`` and ``tool_calls``, ``tool`` with ``tool_call_id`` and ``content``), OpenAI-chat
    shaped; the process exit status tells success."""

    _names: dict[str, str] = field(default_factory=dict)
    _turns: int = 0

    def feed(self, event: dict[str, Any]) -> list[Item]:
        role = event.get("role")
        if role == "assistant":
            self._turns += 1
            calls, starts = [], []
            for raw in event.get("tool_calls") or []:
                fn = raw.get("function") or {}
                call_id = str(raw.get("id"))
                name = karotte_tool_name(
                    str(fn.get("name")), (f"{MCP_SERVER_NAME}_", f"{MCP_SERVER_NAME}__")
                )
                arguments = fn.get("arguments") or "{}"
                self._names[call_id] = name
                calls.append(
                    ChatCompletionMessageToolCall(
                        id=call_id, function=Function(name=name, arguments=arguments)
                    )
                )
                try:
                    parsed: dict[str, Any] | str = json.loads(arguments)
                except ValueError:
                    parsed = arguments
                starts.append(
                    ToolStart(call_id, name, parsed if isinstance(parsed, dict) else arguments)
                )
            content = event.get("content")
            message = Message(
                role="assistant",
                content=content if isinstance(content, str) and content else None,
                tool_calls=calls or None,
                reasoning_content=event.get("reasoning_content") or None,
            )
            return [Assistant(message), *starts]
        if role == "tool":
            call_id = str(event.get("tool_call_id"))
            return [
                ToolEnd(
                    call_id,
                    self._names.get(call_id, str(event.get("name"))),
                    str(event.get("content") or ""),
                )
            ]
        return []


@dataclass
class MistralVibeAdapter(CliAgentAdapter):
    name: str = "mistral-vibe"
    package: str = "mistral-vibe"
    version: str = MISTRAL_VIBE_VERSION
    provider: str = "mistral"  # type: ignore[assignment]
    description: str = "Mistral Vibe"

    def install_commands(self, prefix: str) -> list[str]:
        q = shlex.quote(prefix)
        return [
            find_python_script(),
            f'"$py" -m venv {q}',
            f"{q}/bin/pip install --no-cache-dir {shlex.quote(f'{self.package}=={self.version}')}",
        ]

    def executable(self, install_dir: Path) -> Path:
        return install_dir / "bin" / "vibe"

    def check_installed(self, install_dir: Path) -> str | None:
        problem = super().check_installed(install_dir)
        if problem:
            return f"{problem} Note: {PYTHON_TOO_OLD}."
        return None

    def vibe_home(self, ctx: StepContext) -> Path:
        return ctx.state_dir / "vibe"

    def config_files(self, ctx: StepContext) -> dict[Path, str]:
        toml = json.dumps
        text = "\n".join(
            [
                f"active_model = {toml(ctx.model)}",
                "",
                "[[providers]]",
                'name = "karotte"',
                f"api_base = {toml(ctx.model_base_url)}",
                'api_key_env_var = "MISTRAL_API_KEY"',
                "",
                "[[models]]",
                f"name = {toml(ctx.model)}",
                'provider = "karotte"',
                f"alias = {toml(ctx.model)}",
                "",
                "[[mcp_servers]]",
                f"name = {toml(MCP_SERVER_NAME)}",
                'transport = "streamable-http"',
                f"url = {toml(ctx.mcp_url)}",
                "",
            ]
        )
        return {self.vibe_home(ctx) / "config.toml": text}

    def argv(self, ctx: StepContext) -> list[str]:
        argv = [
            str(self.executable(ctx.install_dir)),
            "--output",
            "streaming",
            "--auto-approve",
            "--trust",
        ]
        argv += ["--workdir", ctx.workdir]
        if ctx.max_turns is not None:
            argv += ["--max-turns", str(ctx.max_turns)]
        if ctx.session_id:
            argv += ["--resume", ctx.session_id]
        return [*argv, "--prompt", ctx.prompt]

    def env(self, ctx: StepContext) -> dict[str, str]:
        return {
            "VIBE_HOME": str(self.vibe_home(ctx)),
            "MISTRAL_API_KEY": ctx.placeholder_key,
            **self.extra_env,
        }

    def parser(self) -> StreamParser:
        return VibeStreamParser()
