"""Claude Code (``@anthropic-ai/claude-code`` from npm), run with ``-p`` and
``--output-format stream-json``.

Its stream: ``system`` (``init``: session id, tools, MCP servers), ``assistant`` (an Anthropic
message, usually one content block per line, the same ``message.id`` for one model call),
``user`` (``tool_result`` blocks), ``result`` (how the run ended, usage, turns).
"""

from __future__ import annotations

import json
import shlex
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
    karotte_tool_name,
)
from karotte.schemas import ChatCompletionMessageToolCall, Function, Message

CLAUDE_CODE_VERSION = "2.1.332"
MCP_PREFIX = f"mcp__{MCP_SERVER_NAME}__"


def npm_install(prefix: str, package: str, version: str) -> list[str]:
    q = shlex.quote(prefix)
    return [
        f"mkdir -p {q}",
        f"npm install --prefix {q} --no-audit --no-fund --no-update-notifier --omit=dev "
        f"--foreground-scripts {shlex.quote(f'{package}@{version}')}",
    ]


def anthropic_usage(raw: dict[str, Any] | None) -> TokenUsage | None:
    if not raw:
        return None
    cached = int(raw.get("cache_read_input_tokens") or 0)
    created = int(raw.get("cache_creation_input_tokens") or 0)
    return TokenUsage(
        input_tokens=int(raw.get("input_tokens") or 0) + cached + created,
        output_tokens=int(raw.get("output_tokens") or 0),
        cached_input_tokens=cached,
    )


def tool_result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif isinstance(block, dict):
                parts.append(f"[{block.get('type', 'unknown')} content omitted]")
        return "\n".join(parts)
    return "" if content is None else json.dumps(content)


@dataclass
class ClaudeStreamParser(StreamParser):
    _pending_id: str | None = None
    _text: list[str] = field(default_factory=list)
    _thinking: list[str] = field(default_factory=list)
    _calls: list[ChatCompletionMessageToolCall] = field(default_factory=list)
    _starts: list[ToolStart] = field(default_factory=list)
    _usage: TokenUsage | None = None
    _names: dict[str, str] = field(default_factory=dict)

    def _flush(self) -> list[Item]:
        if self._pending_id is None:
            return []
        message = Message(
            role="assistant",
            content="".join(self._text) or None,
            tool_calls=list(self._calls) or None,
            reasoning_content="".join(self._thinking) or None,
        )
        items: list[Item] = [Assistant(message, self._usage), *self._starts]
        self._pending_id, self._usage = None, None
        self._text, self._thinking, self._calls, self._starts = [], [], [], []
        return items

    def feed(self, event: dict[str, Any]) -> list[Item]:
        kind = event.get("type")
        if kind == "system" and event.get("subtype") == "init":
            self.session_id = event.get("session_id") or self.session_id
            return []
        if kind == "assistant":
            message = event.get("message") or {}
            items: list[Item] = []
            if message.get("id") != self._pending_id:
                items = self._flush()
                self._pending_id = message.get("id") or f"msg{id(message)}"
            self._usage = anthropic_usage(message.get("usage")) or self._usage
            for block in message.get("content") or []:
                btype = block.get("type")
                if btype == "text":
                    self._text.append(block.get("text", ""))
                elif btype == "thinking":
                    self._thinking.append(block.get("thinking", ""))
                elif btype == "tool_use":
                    call_id = str(block.get("id"))
                    name = karotte_tool_name(str(block.get("name")), (MCP_PREFIX,))
                    arguments = block.get("input")
                    self._names[call_id] = name
                    self._calls.append(
                        ChatCompletionMessageToolCall(
                            id=call_id,
                            function=Function(name=name, arguments=json.dumps(arguments)),
                        )
                    )
                    self._starts.append(
                        ToolStart(
                            call_id,
                            name,
                            arguments if isinstance(arguments, dict) else str(arguments),
                        )
                    )
            return items
        if kind == "user":
            items = self._flush()
            content = (event.get("message") or {}).get("content")
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    call_id = str(block.get("tool_use_id"))
                    items.append(
                        ToolEnd(
                            call_id,
                            self._names.get(call_id, "unknown"),
                            tool_result_text(block.get("content")),
                            bool(block.get("is_error")),
                        )
                    )
            return items
        if kind == "result":
            items = self._flush()
            self.session_id = event.get("session_id") or self.session_id
            subtype = str(event.get("subtype") or "")
            turns = event.get("num_turns")
            if subtype == "success" and not event.get("is_error"):
                items.append(Finished("model_done", self.session_id, turns=turns))
            elif subtype == "error_max_turns":
                items.append(Finished("max_turns", self.session_id, turns=turns))
            else:
                error = event.get("result") or event.get("error") or subtype or "unknown error"
                items.append(Finished("error", self.session_id, error=str(error), turns=turns))
            return items
        return []


@dataclass
class ClaudeCodeAdapter(CliAgentAdapter):
    name: str = "claude-code"
    package: str = "@anthropic-ai/claude-code"
    version: str = CLAUDE_CODE_VERSION
    provider: str = "anthropic"  # type: ignore[assignment]
    description: str = "Claude Code"

    def install_commands(self, prefix: str) -> list[str]:
        return npm_install(prefix, self.package, self.version)

    def executable(self, install_dir: Path) -> Path:
        return install_dir / "node_modules" / ".bin" / "claude"

    def mcp_config_path(self, ctx: StepContext) -> Path:
        return ctx.config_dir / "claude-mcp.json"

    def config_files(self, ctx: StepContext) -> dict[Path, str]:
        servers = {MCP_SERVER_NAME: {"type": "http", "url": ctx.mcp_url}}
        return {self.mcp_config_path(ctx): json.dumps({"mcpServers": servers}, indent=1)}

    def argv(self, ctx: StepContext) -> list[str]:
        argv = [
            str(self.executable(ctx.install_dir)),
            "--print",
            "--output-format",
            "stream-json",
            "--verbose",
            "--model",
            ctx.model,
            "--mcp-config",
            str(self.mcp_config_path(ctx)),
            "--strict-mcp-config",
            # Karotte confines the student; Claude Code's own prompts have nobody to answer them
            "--dangerously-skip-permissions",
        ]
        if ctx.max_turns is not None:
            argv += ["--max-turns", str(ctx.max_turns)]
        if ctx.session_id:
            argv += ["--resume", ctx.session_id]
        elif ctx.system_prompt:
            argv += ["--append-system-prompt", ctx.system_prompt]
        return argv  # the prompt comes on stdin

    def env(self, ctx: StepContext) -> dict[str, str]:
        env = {
            "ANTHROPIC_BASE_URL": ctx.model_base_url,
            "ANTHROPIC_API_KEY": ctx.placeholder_key,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": ctx.model,
            "ANTHROPIC_SMALL_FAST_MODEL": ctx.model,
            "CLAUDE_CODE_SUBAGENT_MODEL": ctx.model,
            "CLAUDE_CONFIG_DIR": str(ctx.state_dir / "claude"),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "IS_SANDBOX": "1",
            # Karotte's tools in the tool list itself, not deferred behind a tool search
            "ENABLE_TOOL_SEARCH": "false",
            "MCP_TOOL_TIMEOUT": str(int(ctx.tool_timeout_s * 1000)),
        }
        if ctx.max_output_tokens is not None:
            env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(ctx.max_output_tokens)
        return {**env, **self.extra_env}

    def parser(self) -> StreamParser:
        return ClaudeStreamParser()
