"""The real model client: one chat-completion call through litellm, with retries.

Any provider litellm speaks works, with ``provider/name`` model ids (``anthropic/claude-opus-4-8``,
``openai/gpt-5.5``, ``gemini/gemini-2.5-pro``, ...). The request carries the tools as OpenAI
function specs, ``max_tokens`` (the run config's ``max_output_tokens``, else the catalog's output
limit, else the provider's default) and ``reasoning_effort`` (``min``/``max`` resolved through the
catalog). Retrying is :mod:`karotte.sandbox.retry`'s job; litellm's and the provider SDK's own
retries are turned off so that only one policy (and one budget) applies.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from types import ModuleType
from typing import Any

from karotte import catalog
from karotte.config import EvaluationRunConfig
from karotte.errors import ModelError
from karotte.events import TokenUsage
from karotte.sandbox.model_client import ModelReply
from karotte.sandbox.retry import RetryPolicy, call_with_retries
from karotte.schemas import ChatCompletionMessageToolCall, Function, Message

DEFAULT_REQUEST_TIMEOUT_S = 600.0
# providers whose API takes tool-call arguments back as any string
_VERBATIM_ARGUMENT_PROVIDERS = ("openai/", "azure/")


def import_litellm() -> ModuleType:
    """Import litellm without letting it reach the network or print banners.

    Without ``LITELLM_LOCAL_MODEL_COST_MAP`` litellm fetches its model map from GitHub at import
    time. Its SDK sends no telemetry (that is an opt-in feature of its proxy) and registers no
    callbacks by default; a spy on ``socket.getaddrinfo`` saw no lookup but the API's.
    """
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" banner on errors
    return litellm


class LiteLLMClient:
    """A :class:`~karotte.sandbox.model_client.ModelClient` backed by ``litellm.acompletion``.

    Raises :class:`~karotte.errors.ConfigError` at construction when the API key's ``$VAR`` is
    unset or ``reasoning_effort`` is ``min``/``max`` for a model without known levels.
    """

    def __init__(
        self,
        config: EvaluationRunConfig,
        *,
        retry: RetryPolicy | None = None,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> None:
        self.config = config
        self.info = catalog.lookup(config.model)
        self.api_key = config.resolved_api_key()
        self.reasoning_effort = catalog.resolve_reasoning_effort(
            config.model, config.reasoning_effort, self.info
        )
        self.max_tokens = config.max_output_tokens or (
            self.info.max_output_tokens if self.info is not None else None
        )
        self.retry = retry if retry is not None else RetryPolicy(config.model_retry_budget_s)
        self.request_timeout_s = request_timeout_s
        # Signed thinking blocks of assistant turns with tool calls, by their first call's id.
        # Anthropic refuses a tool-use turn sent back without them while thinking is on, and
        # our Message has no field for them, so the client keeps them for the run.
        self._thinking_blocks: dict[str, list[dict[str, Any]]] = {}

    def request(self, messages: list[Message], tools: list[dict[str, Any]]) -> dict[str, Any]:
        """The keyword arguments of the ``litellm.acompletion`` call."""
        kwargs: dict[str, Any] = {
            "model": self.config.model,
            "messages": [self._sendable(m) for m in messages],
            "timeout": self.request_timeout_s,
            "max_retries": 0,  # the provider SDK's own retries: off, we retry ourselves
            "num_retries": 0,  # litellm's own retries: off
        }
        if tools:
            kwargs["tools"] = tools
        if self.api_key is not None:
            kwargs["api_key"] = self.api_key
        if self.config.model_api_base:
            kwargs["api_base"] = self.config.model_api_base
        if self.max_tokens is not None:
            kwargs["max_tokens"] = self.max_tokens
        if self.reasoning_effort is not None:
            kwargs["reasoning_effort"] = self.reasoning_effort
        return kwargs

    def _sendable(self, message: Message) -> dict[str, Any]:
        """The message as litellm takes it.

        A tool call whose arguments are not a JSON object stays in our history verbatim, but
        providers other than OpenAI require an object there and would refuse the whole request
        (a 400, every turn after): for them such arguments are sent as ``{}``. The tool result
        that follows already tells the model its call was malformed.
        """
        data = message.to_litellm()
        if not message.tool_calls:
            return data
        blocks = self._thinking_blocks.get(message.tool_calls[0].id)
        if blocks and message.role == "assistant":
            data["thinking_blocks"] = blocks
        if self.config.model.startswith(_VERBATIM_ARGUMENT_PROVIDERS):
            return data
        for call in data.get("tool_calls", []):
            try:
                parsed = json.loads(call["function"].get("arguments") or "{}")
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                call["function"]["arguments"] = "{}"
        return data

    async def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> ModelReply:
        litellm = import_litellm()
        kwargs = self.request(messages, tools)
        attempt_started = time.monotonic()

        async def attempt() -> Any:
            nonlocal attempt_started
            attempt_started = time.monotonic()
            return await litellm.acompletion(**kwargs)

        response = await call_with_retries(attempt, self.retry, what=f"model {self.config.model}")
        reply = to_model_reply(response, latency_s=time.monotonic() - attempt_started)
        blocks = thinking_blocks(response)
        if blocks and reply.message.tool_calls:
            self._thinking_blocks[reply.message.tool_calls[0].id] = blocks
        return reply


def to_model_reply(response: Any, latency_s: float) -> ModelReply:
    """Convert a litellm ``ModelResponse`` into our :class:`ModelReply`.

    Tool calls are kept as the model sent them, malformed argument strings included: the agent
    loop answers those with an error tool message.
    """
    choices = getattr(response, "choices", None)
    if not choices:
        raise ModelError(f"the model API returned no choices: {str(response)[:300]}")
    raw = choices[0].message
    content = getattr(raw, "content", None)
    if content is not None and not isinstance(content, str | list):
        content = str(content)
    reasoning = getattr(raw, "reasoning_content", None)
    message = Message(
        role="assistant",
        content=content,
        tool_calls=[_tool_call(call) for call in (getattr(raw, "tool_calls", None) or [])] or None,
        reasoning_content=reasoning if isinstance(reasoning, str) and reasoning else None,
    )
    return ModelReply(
        message=message, usage=token_usage(getattr(response, "usage", None)), latency_s=latency_s
    )


def thinking_blocks(response: Any) -> list[dict[str, Any]]:
    """The provider's (signed) thinking blocks of the reply, as litellm exposes them."""
    choices = getattr(response, "choices", None) or []
    blocks = getattr(choices[0].message, "thinking_blocks", None) if choices else None
    if not isinstance(blocks, list):
        return []
    return [dict(block) for block in blocks if isinstance(block, dict)]


def _tool_call(raw: Any) -> ChatCompletionMessageToolCall:
    function = getattr(raw, "function", None)
    arguments = getattr(function, "arguments", None)
    if arguments is None:
        arguments = ""
    elif not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    call_id = getattr(raw, "id", None) or f"call_{uuid.uuid4().hex[:12]}"
    return ChatCompletionMessageToolCall(
        id=str(call_id),
        function=Function(name=str(getattr(function, "name", None) or ""), arguments=arguments),
    )


def token_usage(usage: Any) -> TokenUsage | None:
    """Input, output, cached-input and reasoning tokens of a litellm ``Usage`` (when present)."""
    if usage is None:
        return None
    prompt_details = getattr(usage, "prompt_tokens_details", None)
    completion_details = getattr(usage, "completion_tokens_details", None)
    cached = _count(getattr(prompt_details, "cached_tokens", None)) or _count(
        getattr(usage, "cache_read_input_tokens", None)
    )
    return TokenUsage(
        input_tokens=_count(getattr(usage, "prompt_tokens", None)),
        output_tokens=_count(getattr(usage, "completion_tokens", None)),
        cached_input_tokens=cached,
        reasoning_tokens=_count(getattr(completion_details, "reasoning_tokens", None)),
    )


def _count(value: object) -> int:
    return value if isinstance(value, int) and value > 0 else 0
