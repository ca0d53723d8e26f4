"""Mistral Vibe (PyPI ``mistral-vibe``): a Rust front end plus a Python app server, run as
``vibe --output streaming -p`` (the prompt on stdin), resumed with ``--resume <session id>``.

Its wheels need **Python >= 3.12**. Karotte's images are Debian bookworm (Python 3.11), so the
install step looks for ``$KAROTTE_PYTHON`` / ``python3.14`` / ``python3.13`` / ``python3.12`` /
a ``python3`` that is new enough and otherwise fails the image build saying so. Debian trixie's
``python3`` (3.13) is no way out on a bookworm image: installing it pulls trixie's libc6 and
much of the base system. Build such environments on a base image with Python >= 3.12.

Pinned 3.0.2: 3.0.3 pins ``certifi==2026.10.19``, which the package index does not serve (only
``2026.10.19.post1``), so 3.0.3 cannot be installed.

Its stream (JSON lines, one session entry each): ``message`` entries (``role`` ``user`` or
``assistant``, ``content`` blocks) and ``effect`` entries (a finished tool call: ``detail``
with ``toolName`` and ``input``, ``state`` with ``status`` and ``outputText``). There is no final
entry: the exit status says how the run ended. Usage is not in the stream.

Vibe 3 offers MCP servers' tools to the model as "connectors" called from TypeScript inside its
``run_typescript`` tool (found through ``search_tool_functions``), not as plain tool calls: a call
of Karotte's ``bash`` shows up as a ``run_typescript`` effect.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from karotte.sandbox.cli_agents.base import (
    MCP_SERVER_NAME,
    Assistant,
    CliAgentAdapter,
    Finished,
    Item,
    StepContext,
    StreamParser,
    ToolEnd,
    ToolStart,
    karotte_tool_name,
)
from karotte.schemas import ChatCompletionMessageToolCall, Function, Message

MISTRAL_VIBE_VERSION = "3.0.2"
MIN_PYTHON = (3, 12)
PYTHON_TOO_OLD = (
    "mistral-vibe needs Python >= 3.12 and this image has none (Debian bookworm ships 3.11); "
    "build the environment on a base image with Python >= 3.12"
)


def find_python_script() -> str:
    """A shell snippet setting ``$py`` to a Python >= 3.12, or failing with the reason."""
    check = f"'import sys; sys.exit(sys.version_info < ({MIN_PYTHON[0]}, {MIN_PYTHON[1]}))'"
    return (
        "py=; for c in ${KAROTTE_PYTHON:-} python3.14 python3.13 python3.12 python3; do "
        f'if command -v "$c" >/dev/null 2>&1 && "$c" -c {check} 2>/dev/null; '
        'then py="$(command -v "$c")"; break; fi; done; '
        f'if [ -z "$py" ]; then echo "karotte: {PYTHON_TOO_OLD}" >&2; exit 1; fi'
    )


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(b.get("text", ""))
            for b in content
            if isinstance(b, dict) and b.get("type") == "text"
        )
    return ""


class VibeStreamParser(StreamParser):
    def __init__(self) -> None:
        self._turns = 0
        self._seen: set[str] = set()

    def feed(self, event: dict[str, Any]) -> list[Item]:
        self.session_id = event.get("sessionId") or self.session_id
        kind = event.get("type")
        if kind == "message" and event.get("role") == "assistant":
            text = _text(event.get("content"))
            if not text:
                return []
            self._turns += 1
            return [Assistant(Message(role="assistant", content=text))]
        if kind != "effect":
            return []
        state = event.get("state") or {}
        status = state.get("status")
        entry_id = str(event.get("id"))
        if status not in ("completed", "failed", "error", "rejected") or entry_id in self._seen:
            return []
        self._seen.add(entry_id)
        detail = event.get("detail") or {}
        name = karotte_tool_name(
            str(detail.get("toolName") or event.get("title") or "tool"), (f"{MCP_SERVER_NAME}.",)
        )
        arguments = detail.get("input")
        args: dict[str, Any] | str = (
            arguments if isinstance(arguments, dict) else json.dumps(arguments)
        )
        call = ChatCompletionMessageToolCall(
            id=entry_id,
            function=Function(
                name=name, arguments=args if isinstance(args, str) else json.dumps(args)
            ),
        )
        success = (state.get("display") or {}).get("success")
        is_error = status != "completed" or success is False
        output = state.get("outputText")
        if output is None:
            output = json.dumps(state.get("output")) if state.get("output") is not None else ""
        return [
            Assistant(Message(role="assistant", tool_calls=[call])),
            ToolStart(entry_id, name, args),
            ToolEnd(entry_id, name, str(output), is_error),
        ]

    def end(self, returncode: int) -> list[Item]:
        if returncode == 0:
            return [Finished("model_done", self.session_id, turns=self._turns)]
        return [Finished("error", self.session_id, error=f"vibe exited with status {returncode}")]


@dataclass
class MistralVibeAdapter(CliAgentAdapter):
    name: str = "mistral-vibe"
    package: str = "mistral-vibe"
    version: str = MISTRAL_VIBE_VERSION
    provider: str = "mistral"  # type: ignore[assignment]
    description: str = "Mistral Vibe"
    stage_on_host: bool = False  # a venv is not relocatable: pip installs it in the image

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
        toml = json.dumps  # a JSON string is a valid TOML basic string
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
                f"tool_timeout_sec = {int(ctx.tool_timeout_s)}",
                "",
            ]
        )
        return {self.vibe_home(ctx) / "config.toml": text}

    def argv(self, ctx: StepContext) -> list[str]:
        argv = [str(self.executable(ctx.install_dir)), "--output", "streaming"]
        argv += ["--auto-approve", "--trust", "--workdir", ctx.workdir]
        if ctx.max_turns is not None:
            argv += ["--max-turns", str(ctx.max_turns)]
        if ctx.session_id:
            argv += ["--resume", ctx.session_id]
        return [*argv, "-p"]  # the prompt comes on stdin

    def prompt(self, ctx: StepContext) -> str:
        return ctx.prompt if not ctx.system_prompt else f"{ctx.system_prompt}\n\n{ctx.prompt}"

    def env(self, ctx: StepContext) -> dict[str, str]:
        return {
            "VIBE_HOME": str(self.vibe_home(ctx)),
            "MISTRAL_API_KEY": ctx.placeholder_key,
            **self.extra_env,
        }

    def parser(self) -> StreamParser:
        return VibeStreamParser()
