"""Retrying model API calls: which failures to retry, how long to wait, and when to give up.

Retried: HTTP 408, 429 and 5xx (including Anthropic's 529 "overloaded"), timeouts and connection
errors. Not retried: every other 4xx (bad request, auth, permission, not found) and "context window
exceeded", which fail at once. The wait is exponential backoff with jitter, except that a
``retry-after`` (or ``retry-after-ms``) header from the provider is honoured: we never retry
earlier than it asks. All retrying happens within one total budget (the run config's
``model_retry_budget_s``), counted from the first failure; when it is used up, or a requested
``retry-after`` would not fit in what is left of it, the call fails with
:class:`ModelCallFailed`, a :class:`~karotte.errors.ModelError` naming the HTTP status and the
provider's message.

litellm keeps the provider's response headers on its exceptions as ``litellm_response_headers``
(an ``httpx.Headers``); ``exc.response.headers`` is deliberately emptied by litellm for some
errors, so both are consulted.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from karotte.errors import ModelError

T = TypeVar("T")

log = logging.getLogger(__name__)

_RETRYABLE_KINDS = frozenset(
    {
        # litellm / openai SDK / httpx / builtin names of timeouts and connection failures
        "Timeout",
        "APITimeoutError",
        "APIConnectionError",
        "TimeoutError",
        "TimeoutException",
        "TransportError",
        "ConnectionError",
        "ServiceUnavailableError",
        "InternalServerError",
        "BadGatewayError",
        "RateLimitError",
    }
)
_NEVER_RETRY_KINDS = frozenset({"ContextWindowExceededError", "ContentPolicyViolationError"})
_MESSAGE_LIMIT = 600
# "litellm.RateLimitError: RateLimitError: OpenAIException - <the provider's message>"
_LITELLM_PREFIX = re.compile(r"^litellm\.\w+: (?:\w+: )?(?:\w+Exception - )?")


@dataclass(frozen=True)
class Failure:
    """One failed attempt, classified."""

    retryable: bool
    status: int | None
    kind: str
    message: str
    retry_after_s: float | None = None
    context_window: bool = False  # the request did not fit the model's context window

    def summary(self) -> str:
        status = f"HTTP {self.status} " if self.status is not None else ""
        return f"{status}{self.kind}: {self.message}"


@dataclass(frozen=True)
class RetryRecord:
    """A retry that was made: after which failure, and how long we waited before it."""

    attempt: int
    failure: Failure
    delay_s: float


class ModelCallFailed(ModelError):
    """A model API call failed for good (not retryable, or the retry budget ran out)."""

    def __init__(self, message: str, failure: Failure, attempts: int) -> None:
        super().__init__(message)
        self.failure = failure
        self.status = failure.status
        self.attempts = attempts


class ContextWindowExceeded(ModelCallFailed):
    """The conversation no longer fits the model's context window (never retried).

    Raised separately so that the agent loop can end the step on its context limit instead of
    treating it as an infrastructure failure.
    """


@dataclass
class RetryPolicy:
    """How to retry. ``sleep``, ``clock`` and ``rand`` are injectable for tests."""

    budget_s: float = 600.0
    base_delay_s: float = 1.0
    max_delay_s: float = 60.0
    jitter: float = 0.25  # fraction of the delay added at random
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    clock: Callable[[], float] = time.monotonic
    rand: Callable[[], float] = random.random
    records: list[RetryRecord] = field(default_factory=list)  # every retry made, in order

    def backoff(self, retry_index: int) -> float:
        """Exponential backoff with jitter for the ``retry_index``-th retry (0 = first)."""
        delay = min(self.max_delay_s, self.base_delay_s * (2.0**retry_index))
        return delay * (1.0 + self.jitter * self.rand())

    def honoured(self, retry_after_s: float) -> float:
        """The wait for a provider's ``retry-after``: never shorter than asked."""
        return retry_after_s * (1.0 + self.jitter * self.rand())


async def call_with_retries(
    call: Callable[[], Awaitable[T]], policy: RetryPolicy, *, what: str = "model call"
) -> T:
    """Run ``call`` until it succeeds, retrying retryable failures within ``policy.budget_s``."""
    started = policy.clock()
    deadline: float | None = None  # the budget counts from the first failure
    attempt = 0
    while True:
        attempt += 1
        try:
            return await call()
        except Exception as exc:
            failure = classify(exc)
            now = policy.clock()
            elapsed = now - started
            if deadline is None:
                deadline = now + policy.budget_s
            if not failure.retryable:
                error = ContextWindowExceeded if failure.context_window else ModelCallFailed
                raise error(
                    f"{what} failed (not retryable) after {attempt} attempt(s): "
                    f"{failure.summary()}",
                    failure,
                    attempt,
                ) from exc
            remaining = deadline - now
            if remaining <= 0:
                raise ModelCallFailed(
                    f"{what} failed after {attempt} attempt(s) in {elapsed:.1f}s, "
                    f"retry budget of {policy.budget_s:g}s used up; last error: "
                    f"{failure.summary()}",
                    failure,
                    attempt,
                ) from exc
            if failure.retry_after_s is None:
                delay = min(policy.backoff(attempt - 1), remaining)
            elif failure.retry_after_s <= remaining:
                delay = min(policy.honoured(failure.retry_after_s), remaining)
            else:
                raise ModelCallFailed(
                    f"{what} failed after {attempt} attempt(s) in {elapsed:.1f}s: "
                    f"{failure.summary()} (the provider asked to wait "
                    f"{failure.retry_after_s:g}s, more than the {remaining:.1f}s left of the "
                    f"{policy.budget_s:g}s retry budget)",
                    failure,
                    attempt,
                ) from exc
            policy.records.append(RetryRecord(attempt=attempt, failure=failure, delay_s=delay))
            log.warning(
                "%s attempt %d failed (%s); retrying in %.2fs",
                what,
                attempt,
                failure.summary(),
                delay,
            )
            await policy.sleep(delay)


def classify(exc: BaseException) -> Failure:
    """Decide whether ``exc`` (raised by litellm, the provider SDK or httpx) is worth retrying."""
    kinds = {cls.__name__ for cls in type(exc).__mro__}
    kind = type(exc).__name__
    status = _status_of(exc)
    message = provider_message(exc)
    if kinds & _NEVER_RETRY_KINDS:
        return Failure(
            False, status, kind, message, context_window="ContextWindowExceededError" in kinds
        )
    if status is None:
        retryable = bool(kinds & _RETRYABLE_KINDS)
    else:
        retryable = status in (408, 429) or status >= 500
    retry_after = retry_after_seconds(exc) if retryable else None
    return Failure(retryable, status, kind, message, retry_after)


def _status_of(exc: BaseException) -> int | None:
    for name in ("status_code", "status"):
        value = getattr(exc, name, None)
        if isinstance(value, int) and 100 <= value <= 599:
            return value
    response = getattr(exc, "response", None)
    value = getattr(response, "status_code", None)
    return value if isinstance(value, int) and 100 <= value <= 599 else None


def _header_sources(exc: BaseException) -> list[Mapping[str, Any]]:
    sources: list[Mapping[str, Any]] = []
    for candidate in (
        getattr(exc, "litellm_response_headers", None),
        getattr(exc, "headers", None),
        getattr(getattr(exc, "response", None), "headers", None),
    ):
        if candidate is not None and hasattr(candidate, "get"):
            sources.append(candidate)
    return sources


def retry_after_seconds(exc: BaseException, now: float | None = None) -> float | None:
    """The wait the provider asked for, from ``retry-after-ms`` or ``retry-after``.

    ``retry-after`` may be a number of seconds or an HTTP date. ``None`` when absent or invalid.
    """
    for headers in _header_sources(exc):
        millis = _get_header(headers, "retry-after-ms")
        if millis is not None:
            try:
                value = float(millis) / 1000.0
            except ValueError:
                value = -1.0
            if value >= 0:
                return value
        raw = _get_header(headers, "retry-after")
        if raw is not None:
            parsed = parse_retry_after(raw, now)
            if parsed is not None:
                return parsed
    return None


def parse_retry_after(raw: str, now: float | None = None) -> float | None:
    """Seconds to wait for a ``retry-after`` value (delta-seconds or an HTTP date)."""
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
        return max(seconds, 0.0)
    return seconds if seconds >= 0 and seconds == seconds else None


def _get_header(headers: Mapping[str, Any], name: str) -> str | None:
    value = headers.get(name)
    if value is None:  # a plain dict is case-sensitive
        for key, candidate in headers.items():
            if str(key).lower() == name:
                value = candidate
                break
    return None if value is None else str(value)


def provider_message(exc: BaseException) -> str:
    """The provider's own error message when it can be dug out, else the exception text."""
    found = _message_in(getattr(exc, "body", None))
    if found:
        return found[:_MESSAGE_LIMIT]
    text = str(getattr(exc, "message", None) or exc) or type(exc).__name__
    start = text.find("{")
    if start != -1:
        try:  # the provider's JSON error body, often followed by litellm's advice
            body, _ = json.JSONDecoder().raw_decode(text, start)
        except ValueError:
            body = None
        found = _message_in(body)
        if found:
            return found[:_MESSAGE_LIMIT]
    return _LITELLM_PREFIX.sub("", text, count=1)[:_MESSAGE_LIMIT]


def _message_in(body: object) -> str | None:
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return None
