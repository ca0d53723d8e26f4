"""The agent loop driving the real litellm client against a local Anthropic/OpenAI API stub."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from stubs.helpers import api_base, model_id
from stubs.provider_stub import (
    ProviderStub,
    RecordedRequest,
    StubError,
    StubReply,
    StubToolCall,
)

from karotte.config import EvaluationRunConfig
from karotte.events import MessageAdded, StopReason, TokenUsage, ToolCallCompleted, Transcript
from karotte.events import _Event as Event
from karotte.sandbox.agent import NUDGE, StepLimits, run_agent_step
from karotte.sandbox.entry import run_harness
from karotte.sandbox.litellm_client import LiteLLMClient
from karotte.sandbox.retry import RetryPolicy
from karotte.sandbox.tools.base import ToolResult
from karotte.schemas import Message


class AddToolBox:
    """One tool, ``add(a, b)``; records every call it gets."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def specs(self) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": "add",
                    "description": "Add two integers.",
                    "parameters": {
                        "type": "object",
                        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                        "required": ["a", "b"],
                    },
                },
            }
        ]

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        self.calls.append({"name": name, **arguments})
        if name != "add":
            return ToolResult(output=f"Error: no tool named {name}", is_error=True)
        return ToolResult(output=str(int(arguments["a"]) + int(arguments["b"])))

    async def aclose(self) -> None:
        pass


@pytest.fixture(params=["anthropic", "openai"])
def provider(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def run_step(
    provider: str, stub: ProviderStub, max_empty_turns: int = 3, max_turns: int = 10
) -> tuple[StopReason, int, list[Message], list[Event], AddToolBox]:
    config = EvaluationRunConfig(
        task_id="t",
        model=model_id(provider),
        model_api_base=api_base(provider, stub.url),
        model_api_key="sk-test",
        max_empty_turns=max_empty_turns,
    )
    client = LiteLLMClient(config, retry=RetryPolicy(budget_s=5, base_delay_s=0.01))
    tools = AddToolBox()
    messages = [
        Message(role="system", content="You add numbers."),
        Message(role="user", content="What is 2 + 3?"),
    ]
    events: list[Event] = []
    limits = StepLimits(
        max_turns=max_turns, deadline=time.monotonic() + 60, max_empty_turns=max_empty_turns
    )
    reason, turns = asyncio.run(run_agent_step(client, tools, messages, limits, 0, events.append))
    return reason, turns, messages, events, tools


def tool_results_sent(provider: str, request: RecordedRequest) -> list[tuple[str, str]]:
    """(call id, content) of every tool result in a request body, in the provider's format."""
    found: list[tuple[str, str]] = []
    for message in request.body["messages"]:
        if provider == "openai" and message["role"] == "tool":
            found.append((message["tool_call_id"], str(message["content"])))
        if provider == "anthropic" and isinstance(message.get("content"), list):
            for block in message["content"]:
                if block.get("type") == "tool_result":
                    content = block["content"]
                    if isinstance(content, list):
                        content = "".join(part.get("text", "") for part in content)
                    found.append((block["tool_use_id"], str(content)))
    return found


def user_texts_sent(request: RecordedRequest) -> list[str]:
    texts: list[str] = []
    for message in request.body["messages"]:
        if message["role"] != "user":
            continue
        content = message["content"]
        if isinstance(content, str):
            texts.append(content)
        else:
            texts.extend(b.get("text", "") for b in content if b.get("type") == "text")
    return texts


def test_tool_call_round_trip(provider: str) -> None:
    script = [
        StubReply(text="Let me add.", tool_calls=[StubToolCall("call_a1", "add", '{"a":2,"b":3}')]),
        StubReply(text="2 + 3 = 5"),
    ]
    with ProviderStub(script) as stub:
        reason, turns, messages, events, tools = run_step(provider, stub)
    assert (reason, turns) == ("model_done", 2)
    assert tools.calls == [{"name": "add", "a": 2, "b": 3}]
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[-1].text() == "2 + 3 = 5"
    # the second request carried the tool's result back, under the model's call id
    assert tool_results_sent(provider, stub.requests[1]) == [("call_a1", "5")]
    completed = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert [(e.call_id, e.output, e.is_error) for e in completed] == [("call_a1", "5", False)]


def test_empty_turns_are_nudged_and_the_loop_continues(provider: str) -> None:
    with ProviderStub([StubReply(), StubReply(), StubReply(text="5")]) as stub:
        reason, turns, messages, _, _ = run_step(provider, stub, max_empty_turns=3)
    assert (reason, turns) == ("model_done", 3)
    assert messages[-1].text() == "5"
    assert len(stub.requests) == 3
    # each request after an empty turn ends with the nudge
    assert user_texts_sent(stub.requests[1])[-1] == NUDGE
    assert user_texts_sent(stub.requests[2]).count(NUDGE) == 2


def test_too_many_empty_turns_stop_the_step(provider: str) -> None:
    with ProviderStub() as stub:
        stub.default = StubReply()  # always empty
        reason, turns, _, _, tools = run_step(provider, stub, max_empty_turns=2)
    assert (reason, turns) == ("empty_turns", 3)
    assert len(stub.requests) == 3
    assert tools.calls == []


def test_malformed_tool_call_gets_an_error_result_and_the_loop_continues(provider: str) -> None:
    script = [
        StubReply(tool_calls=[StubToolCall("call_bad", "add", '{"a": 2, "b":')]),
        StubReply(tool_calls=[StubToolCall("call_ok", "add", '{"a": 2, "b": 3}')]),
        StubReply(text="5"),
    ]
    with ProviderStub(script) as stub:
        reason, turns, _, events, tools = run_step(provider, stub)
    assert (reason, turns) == ("model_done", 3)
    assert tools.calls == [{"name": "add", "a": 2, "b": 3}]  # the broken call never ran
    [(call_id, error)] = tool_results_sent(provider, stub.requests[1])
    assert call_id == "call_bad"
    assert error.startswith("Error:") and "valid JSON" in error
    completed = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert [(e.call_id, e.is_error) for e in completed] == [("call_bad", True), ("call_ok", False)]
    # the history sent back keeps the call; Anthropic needs an object as its input, so the
    # broken arguments go back as {} there (and verbatim to OpenAI)
    sent = [m for m in stub.requests[1].body["messages"] if m["role"] == "assistant"]
    if provider == "anthropic":
        [block] = [b for b in sent[0]["content"] if b["type"] == "tool_use"]
        assert (block["id"], block["input"]) == ("call_bad", {})
    else:
        assert sent[0]["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b":'


def test_token_usage_is_recorded_per_turn(provider: str) -> None:
    script = [
        StubReply(
            tool_calls=[StubToolCall("c1", "add", '{"a":1,"b":1}')],
            input_tokens=100,
            output_tokens=20,
        ),
        StubReply(text="2", input_tokens=150, output_tokens=5),
    ]
    with ProviderStub(script) as stub:
        _, _, _, events, _ = run_step(provider, stub)
    usages = [
        e.usage for e in events if isinstance(e, MessageAdded) and e.message.role == "assistant"
    ]
    assert usages == [
        TokenUsage(input_tokens=100, output_tokens=20),
        TokenUsage(input_tokens=150, output_tokens=5),
    ]
    latencies = [e.model_latency_s for e in events if isinstance(e, MessageAdded) and e.usage]
    assert all(latency is not None and latency > 0 for latency in latencies)


def test_reasoning_is_kept_and_signed_thinking_goes_back_with_the_tool_call(provider: str) -> None:
    script = [
        StubReply(
            thinking="2 plus 3, use the tool.",
            tool_calls=[StubToolCall("c1", "add", '{"a":2,"b":3}')],
        ),
        StubReply(text="5"),
    ]
    with ProviderStub(script) as stub:
        _, _, messages, _, _ = run_step(provider, stub)
    assert messages[2].reasoning_content == "2 plus 3, use the tool."
    if provider == "anthropic":
        # with extended thinking on, Anthropic refuses a tool-use turn sent back without its
        # signed thinking block: it must come back first in that assistant message
        [sent] = [m for m in stub.requests[1].body["messages"] if m["role"] == "assistant"]
        first = sent["content"][0]
        assert first["type"] == "thinking"
        assert first["thinking"] == "2 plus 3, use the tool."
        assert first["signature"].startswith("sig-")
        assert sent["content"][1]["type"] == "tool_use"


# ---- a whole run through the harness ------------------------------------------------------------

FIXTURE_ENV = Path(__file__).parent / "fixtures" / "envs" / "basic"


def harness_config(provider: str, stub: ProviderStub, tmp_path: Path, **extra: Any) -> Any:
    return EvaluationRunConfig(
        run_id="http",
        task_id="two-steps",
        model=model_id(provider),
        model_api_base=api_base(provider, stub.url),
        model_api_key="sk-test",
        transcript_file=tmp_path / "out" / "transcript.json",
        extra_config={"answer_path": str(tmp_path / "answer.txt")},
        **extra,
    )


def test_a_whole_run_through_the_harness(
    provider: str, tmp_path: Path, use_environment: Any
) -> None:
    use_environment(FIXTURE_ENV)
    command = json.dumps({"command": f"echo hello > {tmp_path / 'answer.txt'}"})
    script = [
        StubReply(text="The answer is 42.", input_tokens=50, output_tokens=5),
        StubReply(tool_calls=[StubToolCall("call_w", "bash", command)], input_tokens=60),
        StubReply(text="Done.", input_tokens=70, output_tokens=3),
    ]
    with ProviderStub(script) as stub:
        completed = run_harness(harness_config(provider, stub, tmp_path), events="none")
    assert completed.status == "passed", completed
    assert completed.scores == [1.0, 1.0]
    assert completed.usage.input_tokens == 50 + 60 + 70
    assert completed.usage.output_tokens == 5 + 7 + 3
    transcript = Transcript.model_validate_json((tmp_path / "out" / "transcript.json").read_text())
    assert transcript.model == model_id(provider)
    assert len(stub.requests) == 3


def test_a_model_api_that_keeps_failing_ends_the_run_as_a_model_error(
    provider: str, tmp_path: Path, use_environment: Any
) -> None:
    use_environment(FIXTURE_ENV)
    with ProviderStub() as stub:
        stub.default = StubError(503, "upstream overloaded")
        config = harness_config(provider, stub, tmp_path, model_retry_budget_s=0.3)
        completed = run_harness(config, events="none")
    assert completed.status == "error"
    assert completed.error_kind == "model"
    assert completed.score == 0.0
    transcript = Transcript.model_validate_json((tmp_path / "out" / "transcript.json").read_text())
    errors = [e for e in transcript.events if e.type == "error"]
    assert errors and "HTTP 503" in errors[0].message  # type: ignore[union-attr]
    assert "upstream overloaded" in errors[0].message  # type: ignore[union-attr]
    assert len(stub.requests) >= 2
