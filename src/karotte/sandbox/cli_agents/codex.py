"""Codex (``@openai/codex`` from npm), run as ``codex exec --json``; resumed with
``codex exec resume <thread id>`` in later steps.

Its stream: ``thread.started`` (thread id), ``turn.started``, ``item.started`` /
``item.updated`` / ``item.completed`` (``agent_message``, ``reasoning``, ``command_execution``,
``mcp_tool_call``, ``file_change``, ``web_search``, ``todo_list``, ``error``),
``turn.completed`` (usage) or ``turn.failed``, and ``error``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from karotte.events import TokenUsage
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
    Usage,
)
from karotte.sandbox.cli_agents.claude_code import npm_install
from karotte.schemas import ChatCompletionMessageToolCall, Function, Message

CODEX_VERSION = "0.171.0"
KEY_ENV = "OPENAI_API_KEY"


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def mcp_result_text(result: Any) -> str:
    if not isinstance(result, dict):
        return "" if result is None else str(result)
    parts = []
    for block in result.get("content") or []:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif isinstance(block, dict):
            parts.append(f"[{block.get('type', 'unknown')} content omitted]")
    if not parts and result.get("structured_content") is not None:
        parts.append(json.dumps(result["structured_content"]))
    return "\n".join(parts)


def _tool_view(item: dict[str, Any]) -> tuple[str, dict[str, Any] | str] | None:
    """(name, arguments) of a tool-like item; None for messages and reasoning."""
    kind = item.get("type")
    if kind == "mcp_tool_call":
        server, tool = item.get("server"), str(item.get("tool"))
        name = tool if server == MCP_SERVER_NAME else f"{server}.{tool}"
        args = item.get("arguments")
        return name, args if isinstance(args, dict) else json.dumps(args)
    if kind == "command_execution":
        return "shell", {"command": item.get("command", "")}
    if kind == "file_change":
        return "apply_patch", {"changes": item.get("changes") or []}
    if kind == "web_search":
        return "web_search", {"query": item.get("query", "")}
    return None


def _tool_output(item: dict[str, Any]) -> tuple[str, bool]:
    kind, status = item.get("type"), item.get("status")
    if kind == "mcp_tool_call":
        error = item.get("error")
        if error:
            message = error.get("message") if isinstance(error, dict) else str(error)
            return str(message), True
        result = item.get("result")
        is_error = (
            bool(result.get("is_error") or result.get("isError"))
            if isinstance(result, dict)
            else False
        )
        return mcp_result_text(result), is_error or status == "failed"
    if kind == "command_execution":
        output = str(item.get("aggregated_output") or "")
        code = item.get("exit_code")
        if code not in (0, None):
            output += f"\n[exit code {code}]"
        return output, status == "failed" or code not in (0, None)
    if kind == "file_change":
        changes = item.get("changes") or []
        text = "\n".join(
            f"{c.get('kind', '?')} {c.get('path', '?')}" for c in changes if isinstance(c, dict)
        )
        return text, status == "failed"
    return json.dumps(item), status == "failed"


@dataclass
class CodexStreamParser(StreamParser):
    cumulative_usage: bool = True  # turn.completed reports the thread's totals
    _reasoning: list[str] = field(default_factory=list)
    _started: set[str] = field(default_factory=set)
    _turns: int = 0

    def _assistant(
        self, content: str | None, call: ChatCompletionMessageToolCall | None
    ) -> Assistant:
        message = Message(
            role="assistant",
            content=content,
            tool_calls=[call] if call else None,
            reasoning_content="\n".join(self._reasoning) or None,
        )
        self._reasoning = []
        return Assistant(message)

    def _start(self, item: dict[str, Any]) -> list[Item]:
        view = _tool_view(item)
        item_id = str(item.get("id"))
        if view is None or item_id in self._started:
            return []
        self._started.add(item_id)
        name, args = view
        arguments = args if isinstance(args, str) else json.dumps(args)
        call = ChatCompletionMessageToolCall(
            id=item_id, function=Function(name=name, arguments=arguments)
        )
        return [self._assistant(None, call), ToolStart(item_id, name, args)]

    def feed(self, event: dict[str, Any]) -> list[Item]:
        kind = event.get("type")
        item = event.get("item") if isinstance(event.get("item"), dict) else {}
        assert isinstance(item, dict)
        if kind == "thread.started":
            self.session_id = event.get("thread_id") or self.session_id
            return []
        if kind == "item.started":
            return self._start(item)
        if kind == "item.completed":
            itype = item.get("type")
            if itype == "agent_message":
                self._turns += 1
                return [self._assistant(str(item.get("text", "")), None)]
            if itype == "reasoning":
                self._reasoning.append(str(item.get("text", "")))
                return []
            if itype == "error":
                return []  # a non-fatal notice
            if _tool_view(item) is None:
                return []
            items = self._start(item)  # completed without a started event
            output, is_error = _tool_output(item)
            name = _tool_view(item)
            return [
                *items,
                ToolEnd(str(item.get("id")), name[0] if name else "tool", output, is_error),
            ]
        if kind == "turn.completed":
            raw = event.get("usage") or {}
            usage = TokenUsage(
                input_tokens=int(raw.get("input_tokens") or 0),
                output_tokens=int(raw.get("output_tokens") or 0),
                cached_input_tokens=int(raw.get("cached_input_tokens") or 0),
                reasoning_tokens=int(raw.get("reasoning_output_tokens") or 0),
            )
            return [Usage(usage), Finished("model_done", self.session_id, turns=self._turns)]
        if kind == "turn.failed":
            error = event.get("error")
            message = error.get("message") if isinstance(error, dict) else str(error)
            return [Finished("error", self.session_id, error=str(message))]
        if kind == "error":
            return [Finished("error", self.session_id, error=str(event.get("message")))]
        return []


@dataclass
class CodexAdapter(CliAgentAdapter):
    name: str = "codex"
    package: str = "@openai/codex"
    version: str = CODEX_VERSION
    provider: str = "openai"  # type: ignore[assignment]
    description: str = "OpenAI Codex CLI"
    runtime_packages: tuple[str, ...] = ("nodejs",)  # its launcher is a node script

    def install_commands(self, prefix: str) -> list[str]:
        return npm_install(prefix, self.package, self.version)

    def executable(self, install_dir: Path) -> Path:
        return install_dir / "node_modules" / ".bin" / "codex"

    def codex_home(self, ctx: StepContext) -> Path:
        return ctx.state_dir / "codex"

    def config_files(self, ctx: StepContext) -> dict[Path, str]:
        lines = [
            f"model = {_toml(ctx.model)}",
            'model_provider = "karotte"',
            'approval_policy = "never"',
            'sandbox_mode = "danger-full-access"',
            "check_for_update_on_startup = false",
        ]
        if ctx.reasoning_effort in ("minimal", "low", "medium", "high"):
            lines.append(f"model_reasoning_effort = {_toml(ctx.reasoning_effort)}")
        if ctx.system_prompt:
            lines.append(f"developer_instructions = {_toml(ctx.system_prompt)}")
        lines += [
            "",
            "[model_providers.karotte]",
            'name = "karotte"',
            f"base_url = {_toml(ctx.model_base_url)}",
            f'env_key = "{KEY_ENV}"',
            'wire_api = "responses"',
            "request_max_retries = 2",
            "stream_max_retries = 2",
            "",
            f"[mcp_servers.{MCP_SERVER_NAME}]",
            f"url = {_toml(ctx.mcp_url)}",
            "tool_timeout_sec = 3600",
            "",
            "[analytics]",
            "enabled = false",
            "",
        ]
        return {self.codex_home(ctx) / "config.toml": "\n".join(lines)}

    def argv(self, ctx: StepContext) -> list[str]:
        argv = [str(self.executable(ctx.install_dir)), "exec"]
        if ctx.session_id:
            argv.append("resume")
        argv += ["--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
        if ctx.session_id:
            return [*argv, ctx.session_id, "-"]
        return [*argv, "-C", ctx.workdir, "-"]  # the prompt comes on stdin

    def env(self, ctx: StepContext) -> dict[str, str]:
        return {
            "CODEX_HOME": str(self.codex_home(ctx)),
            KEY_ENV: ctx.placeholder_key,
            "NO_COLOR": "1",
            **self.extra_env,
        }

    def parser(self) -> StreamParser:
        return CodexStreamParser()
