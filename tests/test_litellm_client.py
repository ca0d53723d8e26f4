"""LiteLLMClient against a local stub of the Anthropic and OpenAI APIs, through the real litellm."""

from __future__ import annotations

import asyncio
import email.utils
import json
import socket
import time
from typing import Any

import pytest
from stubs.helpers import api_base, model_id
from stubs.provider_stub import ProviderStub, StubError, StubHang, StubReply, StubToolCall

from karotte.config import EvaluationRunConfig
from karotte.errors import ConfigError, ModelError
from karotte.sandbox.litellm_client import LiteLLMClient
from karotte.sandbox.model_client import ModelReply
from karotte.sandbox.retry import (
    ContextWindowExceeded,
    ModelCallFailed,
    RetryPolicy,
    call_with_retries,
    parse_retry_after,
)
from karotte.schemas import Message

PROVIDER_NAMES = ["anthropic", "openai"]
USER = [Message(role="user", content="hello")]
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
]


@pytest.fixture(params=PROVIDER_NAMES)
def provider(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make_client(
    provider: str,
    stub: ProviderStub,
    *,
    budget_s: float = 10.0,
    base_delay_s: float = 0.02,
    request_timeout_s: float = 30.0,
    **config: Any,
) -> LiteLLMClient:
    run_config = EvaluationRunConfig(
        task_id="t",
        model=config.pop("model", model_id(provider)),
        model_api_base=api_base(provider, stub.url),
        model_api_key=config.pop("model_api_key", "sk-test-key"),
        model_retry_budget_s=budget_s,
        **config,
    )
    policy = RetryPolicy(budget_s=budget_s, base_delay_s=base_delay_s, max_delay_s=0.2)
    return LiteLLMClient(run_config, retry=policy, request_timeout_s=request_timeout_s)


def complete(client: LiteLLMClient, tools: list[dict[str, Any]] | None = None) -> ModelReply:
    return asyncio.run(client.complete(list(USER), TOOLS if tools is None else tools))


# ---- retries ------------------------------------------------------------------------------------


def test_429_with_retry_after_is_retried_after_the_requested_delay(provider: str) -> None:
    with ProviderStub(
        [StubError(429, "slow down", {"retry-after": "1"}), StubReply(text="ok")]
    ) as stub:
        client = make_client(provider, stub)
        reply = complete(client)
    assert reply.message.text() == "ok"
    assert len(stub.requests) == 2
    [retry] = client.retry.records
    assert retry.failure.status == 429
    assert retry.failure.retry_after_s == 1.0
    assert retry.delay_s >= 1.0
    assert stub.requests[1].at - stub.requests[0].at >= 1.0


def test_retry_after_as_http_date_is_honoured(provider: str) -> None:
    when = email.utils.formatdate(time.time() + 2, usegmt=True)
    with ProviderStub([StubError(429, "later", {"retry-after": when}), StubReply()]) as stub:
        client = make_client(provider, stub)
        complete(client)
    [retry] = client.retry.records
    assert retry.failure.retry_after_s is not None
    # an HTTP date has one-second resolution: 2s ahead is between 1 and 2 seconds from now
    assert 0.9 <= retry.failure.retry_after_s <= 2.0
    assert stub.requests[1].at - stub.requests[0].at >= retry.failure.retry_after_s


def test_retry_after_ms_is_preferred(provider: str) -> None:
    headers = {"retry-after-ms": "300", "retry-after": "5"}
    with ProviderStub([StubError(429, "later", headers), StubReply()]) as stub:
        client = make_client(provider, stub)
        complete(client)
    [retry] = client.retry.records
    assert retry.failure.retry_after_s == pytest.approx(0.3)
    assert 0.3 <= stub.requests[1].at - stub.requests[0].at < 2.0


def test_retry_after_beyond_the_budget_fails_at_once(provider: str) -> None:
    with ProviderStub([StubError(429, "quota", {"retry-after": "30"}), StubReply()]) as stub:
        client = make_client(provider, stub, budget_s=5.0)
        with pytest.raises(ModelCallFailed) as caught:
            complete(client)
    assert client.retry.records == []  # it did not wait at all
    assert len(stub.requests) == 1
    assert caught.value.status == 429
    assert "asked to wait 30s" in str(caught.value)
    assert "quota" in str(caught.value)


def test_repeated_5xx_then_success(provider: str) -> None:
    script = [StubError(500, "boom"), StubError(502, "bad gw"), StubError(529, "overloaded")]
    with ProviderStub([*script, StubReply(text="finally")]) as stub:
        client = make_client(provider, stub)
        reply = complete(client)
    assert reply.message.text() == "finally"
    assert len(stub.requests) == 4
    assert client.retry.records[0].failure.status == 500
    assert len(client.retry.records) == 3
    delays = [r.delay_s for r in client.retry.records]
    assert delays[0] < delays[1] or delays[1] == pytest.approx(0.2 * 1.25, rel=0.3)


def test_5xx_until_the_budget_runs_out_raises_model_error(provider: str) -> None:
    with ProviderStub() as stub:
        stub.default = StubError(500, "the backend is on fire")
        client = make_client(provider, stub, budget_s=1.5, base_delay_s=0.05)
        started = time.monotonic()
        with pytest.raises(ModelError) as caught:
            complete(client)
        elapsed = time.monotonic() - started
    message = str(caught.value)
    assert "HTTP 500" in message
    assert caught.value.failure.message == "the backend is on fire"  # type: ignore[attr-defined]
    assert "retry budget" in message
    assert len(stub.requests) >= 3
    assert caught.value.attempts == len(stub.requests)  # type: ignore[attr-defined]
    assert sum(r.delay_s for r in client.retry.records) <= 1.5 + 1e-6
    assert elapsed < 30  # it gave up; it did not keep going


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_client_errors_fail_at_once(provider: str, status: int) -> None:
    with ProviderStub([StubError(status, f"nope {status}"), StubReply()]) as stub:
        client = make_client(provider, stub)
        with pytest.raises(ModelCallFailed) as caught:
            complete(client)
    assert len(stub.requests) == 1
    assert caught.value.status == status
    assert caught.value.failure.message == f"nope {status}"  # the provider's own words
    assert "not retryable" in str(caught.value)
    assert client.retry.records == []


CONTEXT_MESSAGES = {
    "anthropic": "prompt is too long: 250000 tokens > 200000 maximum",
    "openai": "This model's maximum context length is 272000 tokens. However, your messages "
    "resulted in 300000 tokens. Please reduce the length of the messages.",
}


def test_context_window_exceeded_fails_at_once(provider: str) -> None:
    with ProviderStub([StubError(400, CONTEXT_MESSAGES[provider]), StubReply()]) as stub:
        client = make_client(provider, stub)
        with pytest.raises(ContextWindowExceeded) as caught:
            complete(client)
    assert isinstance(caught.value, ModelError)
    assert len(stub.requests) == 1
    assert caught.value.failure.kind == "ContextWindowExceededError"
    assert not caught.value.failure.retryable


def test_timeout_is_retried(provider: str) -> None:
    with ProviderStub([StubHang(3.0), StubReply(text="after the hang")]) as stub:
        client = make_client(provider, stub, request_timeout_s=1.0)
        reply = complete(client)
    assert reply.message.text() == "after the hang"
    assert len(stub.requests) == 2
    [retry] = client.retry.records
    assert retry.failure.retryable
    assert "Timeout" in retry.failure.kind


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_connection_refused_is_retried_until_the_budget_runs_out(provider: str) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    run_config = EvaluationRunConfig(
        task_id="t",
        model=model_id(provider),
        model_api_base=api_base(provider, url),
        model_api_key="sk-test",
    )
    policy = RetryPolicy(budget_s=0.4, base_delay_s=0.05, max_delay_s=0.1)
    client = LiteLLMClient(run_config, retry=policy, request_timeout_s=5)
    with pytest.raises(ModelError, match="retry budget"):
        complete(client)
    assert len(policy.records) >= 2
    # litellm reports a refused connection as APIConnectionError (OpenAI) or as a 500 whose
    # message says it could not connect (Anthropic); both are retried
    assert all("connect" in r.failure.summary().lower() for r in policy.records)


# ---- the request ------------------------------------------------------------------------------


def test_request_carries_key_tools_max_tokens_and_reasoning(provider: str) -> None:
    with ProviderStub([StubReply(text="ok")]) as stub:
        client = make_client(provider, stub, reasoning_effort="max")
        complete(client)
    [request] = stub.requests
    body, headers = request.body, request.headers
    if provider == "anthropic":
        assert request.path == "/v1/messages"
        assert headers["x-api-key"] == "sk-test-key"
        assert body["max_tokens"] == 64000  # claude-sonnet-4-5's output limit in the catalog
        assert [t["name"] for t in body["tools"]] == ["add"]
        # "max" is the highest level claude-sonnet-4-5 has ("high"): extended thinking is on
        assert body["thinking"]["type"] == "enabled"
    else:
        assert request.path == "/v1/chat/completions"
        assert headers["authorization"] == "Bearer sk-test-key"
        assert body["max_completion_tokens"] == 128000  # gpt-5's output limit in the catalog
        assert [t["function"]["name"] for t in body["tools"]] == ["add"]
        assert body["reasoning_effort"] == "high"


def test_min_reasoning_maps_to_the_lowest_level() -> None:
    with ProviderStub([StubReply()]) as stub:
        client = make_client("openai", stub, reasoning_effort="min")
        complete(client)
    assert stub.requests[0].body["reasoning_effort"] == "minimal"  # gpt-5: minimal..high


def test_max_output_tokens_of_the_config_wins_and_no_reasoning_is_omitted(provider: str) -> None:
    with ProviderStub([StubReply()]) as stub:
        client = make_client(provider, stub, max_output_tokens=1234)
        complete(client, tools=[])
    body = stub.requests[0].body
    assert body.get("max_tokens", body.get("max_completion_tokens")) == 1234
    assert "reasoning_effort" not in body
    assert "thinking" not in body
    assert "tools" not in body


def test_api_key_from_an_environment_variable(
    provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAROTTE_TEST_MODEL_KEY", "sk-from-env")
    with ProviderStub([StubReply()]) as stub:
        client = make_client(provider, stub, model_api_key="$KAROTTE_TEST_MODEL_KEY")
        complete(client)
    headers = stub.requests[0].headers
    assert "sk-from-env" in (headers.get("x-api-key") or headers.get("authorization", ""))


def test_unset_key_variable_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAROTTE_UNSET_KEY", raising=False)
    config = EvaluationRunConfig(
        task_id="t", model="openai/gpt-5", model_api_key="$KAROTTE_UNSET_KEY"
    )
    with pytest.raises(ConfigError, match="KAROTTE_UNSET_KEY"):
        LiteLLMClient(config)


def test_min_max_reasoning_for_an_unknown_model_is_a_config_error() -> None:
    config = EvaluationRunConfig(
        task_id="t", model="openai/no-such-model-xyz", reasoning_effort="max"
    )
    with pytest.raises(ConfigError, match="reasoning_effort"):
        LiteLLMClient(config)


def test_unknown_model_is_allowed_without_max_tokens() -> None:
    with ProviderStub([StubReply(text="fine")]) as stub:
        client = make_client("openai", stub, model="openai/no-such-model-xyz")
        reply = complete(client)
    assert reply.message.text() == "fine"
    assert "max_tokens" not in stub.requests[0].body
    assert "max_completion_tokens" not in stub.requests[0].body


# ---- the reply --------------------------------------------------------------------------------


def test_reply_keeps_tool_calls_and_usage(provider: str) -> None:
    reply_script = StubReply(
        text="adding",
        tool_calls=[StubToolCall("call_1", "add", '{"a": 2, "b": 3}')],
        input_tokens=120,
        output_tokens=30,
        cached_tokens=100,
        reasoning_tokens=12,
    )
    with ProviderStub([reply_script]) as stub:
        reply = complete(make_client(provider, stub))
    message = reply.message
    assert message.role == "assistant"
    assert message.text() == "adding"
    assert message.tool_calls is not None
    [call] = message.tool_calls
    assert (call.id, call.function.name) == ("call_1", "add")
    assert call.function.parsed_arguments() == {"a": 2, "b": 3}
    usage = reply.usage
    assert usage is not None
    assert usage.output_tokens == 30
    assert usage.cached_input_tokens == 100
    if provider == "openai":
        assert usage.input_tokens == 120
        assert usage.reasoning_tokens == 12
    else:
        # Anthropic's input_tokens exclude cache reads; litellm adds them back, so input_tokens
        # means the same for both providers (all prompt tokens, cached ones included)
        assert usage.input_tokens == 220
    assert reply.latency_s > 0


def test_malformed_tool_arguments_are_kept(provider: str) -> None:
    with ProviderStub([StubReply(tool_calls=[StubToolCall("c1", "add", '{"a": 2,')])]) as stub:
        reply = complete(make_client(provider, stub))
    assert reply.message.tool_calls is not None
    [call] = reply.message.tool_calls
    # OpenAI sends arguments as a string, kept verbatim. Anthropic sends an input object; the
    # stub sends the broken text as a JSON string instead, which litellm encodes as one.
    expected = '{"a": 2,' if provider == "openai" else json.dumps('{"a": 2,')
    assert call.function.arguments == expected
    with pytest.raises(ValueError):
        call.function.parsed_arguments()


# ---- retry-after parsing (no HTTP) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("7", 7.0),
        ("0.5", 0.5),
        (" 3 ", 3.0),
        ("Wed, 02 Dec 2026 18:00:10 GMT", 10.0),
        ("Wed, 02 Dec 2026 17:59:00 GMT", 0.0),  # in the past: retry now
        ("-1", None),
        ("soon", None),
        ("nan", None),
    ],
)
def test_parse_retry_after(raw: str, expected: float | None) -> None:
    now = email.utils.parsedate_to_datetime("Wed, 02 Dec 2026 18:00:00 GMT").timestamp()
    assert parse_retry_after(raw, now) == expected


# ---- the retry helper with a fake clock (no HTTP) -----------------------------------------------


class FakeTime:
    """A clock that only moves when someone sleeps; records every requested sleep."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class HTTPFailure(Exception):
    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"status {status}")
        self.status_code = status
        self.headers = headers or {}


def flaky(failures: list[Exception]) -> Any:
    calls = []

    async def call() -> str:
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return "ok"

    call.calls = calls  # type: ignore[attr-defined]
    return call


def test_backoff_doubles_with_bounded_jitter_and_stops_at_the_budget() -> None:
    fake = FakeTime()
    policy = RetryPolicy(
        budget_s=20, base_delay_s=1, max_delay_s=8, jitter=0.25, sleep=fake.sleep, clock=fake.clock
    )
    call = flaky([HTTPFailure(503) for _ in range(100)])
    with pytest.raises(ModelCallFailed, match="retry budget of 20s used up") as caught:
        asyncio.run(call_with_retries(call, policy))
    # 1, 2, 4, 8, 8 (capped) ... each with up to 25 % jitter; the last wait is cut to the budget
    bases = [1, 2, 4, 8, 8]
    for slept, base in zip(fake.sleeps, bases, strict=False):
        assert base <= slept <= base * 1.25 or slept == pytest.approx(20 - sum(fake.sleeps[:-1]))
    assert sum(fake.sleeps) == pytest.approx(20)
    assert caught.value.attempts == len(fake.sleeps) + 1
    assert caught.value.status == 503


def test_jitter_varies_the_delay() -> None:
    fake = FakeTime()
    values = iter([0.0, 1.0])
    policy = RetryPolicy(
        budget_s=60, base_delay_s=2, sleep=fake.sleep, clock=fake.clock, rand=lambda: next(values)
    )
    asyncio.run(call_with_retries(flaky([HTTPFailure(500), HTTPFailure(500)]), policy))
    assert fake.sleeps == [2.0, 4.0 * 1.25]


def test_retry_after_from_a_plain_headers_dict_is_honoured() -> None:
    fake = FakeTime()
    policy = RetryPolicy(budget_s=60, jitter=0.0, sleep=fake.sleep, clock=fake.clock)
    failures: list[Exception] = [HTTPFailure(429, {"Retry-After": "7"})]
    assert asyncio.run(call_with_retries(flaky(failures), policy)) == "ok"
    assert fake.sleeps == [7.0]


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_client_errors_are_not_retried(status: int) -> None:
    fake = FakeTime()
    policy = RetryPolicy(sleep=fake.sleep, clock=fake.clock)
    call = flaky([HTTPFailure(status)])
    with pytest.raises(ModelCallFailed, match="not retryable"):
        asyncio.run(call_with_retries(call, policy))
    assert fake.sleeps == []
    assert len(call.calls) == 1


def test_zero_budget_means_no_retry() -> None:
    fake = FakeTime()
    call = flaky([HTTPFailure(500)])
    with pytest.raises(ModelCallFailed):
        asyncio.run(call_with_retries(call, RetryPolicy(0, sleep=fake.sleep, clock=fake.clock)))
    assert len(call.calls) == 1


def test_unexpected_exceptions_become_model_errors() -> None:
    async def broken() -> None:
        raise RuntimeError("weird")

    with pytest.raises(ModelError, match="weird"):
        asyncio.run(call_with_retries(broken, RetryPolicy()))


def test_cancellation_is_not_swallowed() -> None:
    async def cancelled() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(call_with_retries(cancelled, RetryPolicy()))


def test_litellm_reaches_no_host_but_the_api(
    provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked_up: list[str] = []
    real_getaddrinfo = socket.getaddrinfo

    def spy(host: Any, *args: Any, **kwargs: Any) -> Any:
        looked_up.append(str(host))
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", spy)
    with ProviderStub([StubError(500, "once"), StubReply(text="ok")]) as stub:
        client = make_client(provider, stub)
        # a host name (not an IP literal) so that connecting to the API needs a lookup too
        client.config.model_api_base = api_base(
            provider, stub.url.replace("127.0.0.1", "localhost")
        )
        assert complete(client).message.text() == "ok"
    assert "localhost" in looked_up  # the spy does see the lookups litellm makes
    assert set(looked_up) <= {"localhost"}
