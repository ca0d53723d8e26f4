"""The stream parsers, on lines shaped like those the pinned CLIs print (recorded from
Claude Code 2.1.332 and Codex 0.171.0 against the stub, trimmed), and on their failure forms."""

from __future__ import annotations

from typing import Any

from karotte.sandbox.cli_agents.base import Assistant, Finished, Item, ToolEnd, ToolStart, Usage
from karotte.sandbox.cli_agents.claude_code import ClaudeStreamParser
from karotte.sandbox.cli_agents.codex import CodexStreamParser
from karotte.sandbox.cli_agents.mistral_vibe import VibeStreamParser


def feed_all(parser: Any, events: list[dict[str, Any]]) -> list[Item]:
    out: list[Item] = []
    for event in events:
        out += parser.feed(event)
    return out


def claude_assistant(msg_id: str, *blocks: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "assistant",
        "message": {
            "id": msg_id,
            "role": "assistant",
            "content": list(blocks),
            "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 90},
        },
        "session_id": "s-1",
    }


def test_claude_tool_round_and_answer() -> None:
    parser = ClaudeStreamParser()
    items = feed_all(
        parser,
        [
            {"type": "system", "subtype": "init", "session_id": "s-1"},
            claude_assistant("m1", {"type": "thinking", "thinking": "hmm"}),
            claude_assistant("m1", {"type": "text", "text": "Let me look."}),
            claude_assistant(
                "m1",
                {
                    "type": "tool_use",
                    "id": "t1",
                    "name": "mcp__karotte__bash",
                    "input": {"command": "ls"},
                },
                {"type": "tool_use", "id": "t2", "name": "Read", "input": {"file_path": "/x"}},
            ),
            {
                "type": "user",
                "message": {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "a\nb"}],
                        },
                        {
                            "type": "tool_result",
                            "tool_use_id": "t2",
                            "content": "no",
                            "is_error": True,
                        },
                    ],
                },
            },
            claude_assistant("m2", {"type": "text", "text": "Done."}),
            {
                "type": "result",
                "subtype": "success",
                "is_error": False,
                "num_turns": 2,
                "session_id": "s-1",
            },
        ],
    )
    assert parser.session_id == "s-1"
    first, start1, start2, end1, end2, answer, finished = items
    assert isinstance(first, Assistant)
    assert first.message.text() == "Let me look." and first.message.reasoning_content == "hmm"
    assert first.message.tool_calls is not None
    assert [c.function.name for c in first.message.tool_calls] == ["bash", "Read"]
    assert first.usage is not None and first.usage.input_tokens == 100
    assert first.usage.cached_input_tokens == 90
    assert isinstance(start1, ToolStart) and (start1.name, start1.arguments) == (
        "bash",
        {"command": "ls"},
    )
    assert isinstance(start2, ToolStart) and start2.name == "Read"
    assert isinstance(end1, ToolEnd) and (end1.name, end1.output, end1.is_error) == (
        "bash",
        "a\nb",
        False,
    )
    assert isinstance(end2, ToolEnd) and end2.is_error and end2.name == "Read"
    assert isinstance(answer, Assistant) and answer.message.text() == "Done."
    assert finished == Finished("model_done", "s-1", turns=2)


def test_claude_end_states() -> None:
    turns = ClaudeStreamParser().feed(
        {"type": "result", "subtype": "error_max_turns", "is_error": True, "num_turns": 8}
    )
    assert isinstance(turns[0], Finished) and turns[0].stop_reason == "max_turns"
    failed = ClaudeStreamParser().feed(
        {"type": "result", "subtype": "success", "is_error": True, "result": "API Error: 500"}
    )
    assert isinstance(failed[0], Finished)
    assert failed[0].stop_reason == "error" and failed[0].error == "API Error: 500"
    assert ClaudeStreamParser().feed({"type": "rate_limit_event"}) == []


def test_codex_items() -> None:
    parser = CodexStreamParser()
    mcp = {
        "id": "i1",
        "type": "mcp_tool_call",
        "server": "karotte",
        "tool": "bash",
        "arguments": {"command": "ls"},
    }
    shell = {"id": "i2", "type": "command_execution", "command": "bash -lc false"}
    items = feed_all(
        parser,
        [
            {"type": "thread.started", "thread_id": "th-1"},
            {
                "type": "item.completed",
                "item": {"id": "i0", "type": "error", "message": "metadata"},
            },
            {"type": "turn.started"},
            {"type": "item.completed", "item": {"id": "r", "type": "reasoning", "text": "think"}},
            {"type": "item.started", "item": {**mcp, "status": "in_progress"}},
            {
                "type": "item.completed",
                "item": {
                    **mcp,
                    "status": "completed",
                    "result": {"content": [{"type": "text", "text": "f"}]},
                },
            },
            {"type": "item.started", "item": {**shell, "status": "in_progress"}},
            {
                "type": "item.completed",
                "item": {**shell, "status": "failed", "aggregated_output": "", "exit_code": 1},
            },
            {"type": "item.completed", "item": {"id": "i3", "type": "agent_message", "text": "ok"}},
            {
                "type": "turn.completed",
                "usage": {"input_tokens": 7, "cached_input_tokens": 2, "output_tokens": 3},
            },
        ],
    )
    assert parser.session_id == "th-1" and parser.cumulative_usage
    call, start, end, shell_call, shell_start, shell_end, answer, usage, finished = items
    assert isinstance(call, Assistant) and call.message.reasoning_content == "think"
    assert call.message.tool_calls and call.message.tool_calls[0].function.name == "bash"
    assert isinstance(start, ToolStart) and start.arguments == {"command": "ls"}
    assert isinstance(end, ToolEnd) and end.output == "f" and not end.is_error
    assert isinstance(shell_start, ToolStart) and shell_start.name == "shell"
    assert (
        isinstance(shell_end, ToolEnd)
        and shell_end.is_error
        and "[exit code 1]" in shell_end.output
    )
    assert isinstance(answer, Assistant) and answer.message.text() == "ok"
    assert isinstance(usage, Usage) and usage.usage.input_tokens == 7
    assert isinstance(finished, Finished) and finished.stop_reason == "model_done"
    assert isinstance(shell_call, Assistant)


def test_codex_failures() -> None:
    failed = CodexStreamParser().feed(
        {"type": "turn.failed", "error": {"message": "401 Unauthorized"}}
    )
    assert failed == [Finished("error", None, error="401 Unauthorized")]
    mcp_error = CodexStreamParser().feed(
        {
            "type": "item.completed",
            "item": {
                "id": "x",
                "type": "mcp_tool_call",
                "server": "other",
                "tool": "t",
                "arguments": {},
                "error": {"message": "boom"},
                "status": "failed",
            },
        }
    )
    assert isinstance(mcp_error[1], ToolStart) and mcp_error[1].name == "other.t"
    assert (
        isinstance(mcp_error[2], ToolEnd)
        and mcp_error[2].is_error
        and mcp_error[2].output == "boom"
    )


def test_vibe_entries() -> None:
    parser = VibeStreamParser()
    effect = {
        "id": "effect-1",
        "sessionId": "vs-1",
        "type": "effect",
        "title": "file_system.bash",
        "detail": {"toolName": "file_system.bash", "kind": "shell", "input": {"command": "ls"}},
        "state": {"status": "completed", "outputText": "a\n", "display": {"success": True}},
    }
    items = feed_all(
        parser,
        [
            {"id": "u", "sessionId": "vs-1", "type": "message", "role": "user", "content": []},
            {**effect, "state": {"status": "running"}},
            effect,
            effect,  # the same entry again (updated): reported once
            {
                "id": "a",
                "sessionId": "vs-1",
                "type": "message",
                "role": "assistant",
                "content": [{"type": "text", "text": "done"}],
            },
        ],
    )
    call, start, end, answer = items
    assert isinstance(call, Assistant) and call.message.tool_calls
    assert isinstance(start, ToolStart) and start.name == "file_system.bash"
    assert start.arguments == {"command": "ls"}
    assert isinstance(end, ToolEnd) and end.output == "a\n" and not end.is_error
    assert isinstance(answer, Assistant) and answer.message.text() == "done"
    assert parser.end(0) == [Finished("model_done", "vs-1", turns=1)]
    failed = parser.end(3)[0]
    assert isinstance(failed, Finished) and failed.stop_reason == "error"
