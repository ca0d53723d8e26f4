"""``agent: external``: the student's messages come from the run backend, so that a training
system drives the sandbox turn by turn (docs/backend.md).

For each model call of the agent loop (turn 0, 1, 2, … over the whole run), the harness first
waits until the events so far (the tool results of the last turn) are delivered, then long-polls
``POST /v1/runs/{run_id}/agent/next`` for the trainer's assistant message of that turn and
returns it as the model's reply. Waiting is bounded by ``external_agent_timeout_s`` (and the
step's time limit); a trainer or backend that never answers ends the run as an ``infra`` error,
with the local transcript kept.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from karotte.backend.protocol import API_PREFIX, AgentMessage, NextMessageRequest
from karotte.config import EvaluationRunConfig
from karotte.errors import ErrorKind, KarotteError
from karotte.events import TokenUsage
from karotte.sandbox.backend_client import BackendConnection, BackendError, BackendStreamer
from karotte.sandbox.model_client import ModelReply
from karotte.sandbox.retry import RetryPolicy
from karotte.schemas import Message

POLL_S = 20.0  # one long poll; the server holds it at most 60 s


class ExternalAgentError(KarotteError):
    """The trainer's message did not come (in time), or the backend refused to give it."""

    kind = ErrorKind.INFRA


class ExternalAgentClient:
    """A :class:`~karotte.sandbox.model_client.ModelClient` whose replies come from the backend."""

    def __init__(
        self,
        config: EvaluationRunConfig,
        streamer: BackendStreamer,
        connection: BackendConnection | None = None,
        policy: RetryPolicy | None = None,
    ) -> None:
        self.config = config
        self.streamer = streamer
        self.conn = connection or BackendConnection.from_config(config)
        self.policy = policy or RetryPolicy(base_delay_s=0.5, max_delay_s=5.0)
        self.timeout_s = min(config.external_agent_timeout_s, config.step_time_limit_s)
        self.turn = 0

    async def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> ModelReply:
        started = time.monotonic()
        deadline = started + self.timeout_s
        # the trainer sees the last turn's tool results before it is asked for the next turn
        await asyncio.to_thread(self.streamer.flush, self.timeout_s)
        answer = await self._wait_for_turn(self.turn, tools, deadline)
        self.turn += 1
        return ModelReply(
            message=answer.message,
            usage=answer.usage or TokenUsage(),
            latency_s=time.monotonic() - started,
        )

    async def _wait_for_turn(
        self, turn: int, tools: list[dict[str, Any]], deadline: float
    ) -> AgentMessage:
        path = f"{API_PREFIX}/runs/{self.config.run_id}/agent/next"
        retry, last_error = 0, ""
        while (remaining := deadline - time.monotonic()) > 0:
            ask = NextMessageRequest(
                turn=turn,
                step_index=self.streamer.step_index,
                wait_s=min(POLL_S, remaining),
                tools=tools,
            )
            try:
                response = await self.conn.arequest(
                    "POST", path, json=ask.model_dump(mode="json"), limit_s=ask.wait_s + 10
                )
            except BackendError as exc:
                if not exc.retryable:
                    raise ExternalAgentError(f"external agent, turn {turn}: {exc}") from exc
                last_error = f"; last error: {exc}"
                await asyncio.sleep(max(0.0, min(self.policy.backoff(retry), remaining)))
                retry += 1
                continue
            retry = 0
            if response.status_code == 200:
                try:
                    answer = AgentMessage.model_validate_json(response.content)
                except ValueError as exc:
                    raise ExternalAgentError(
                        f"external agent, turn {turn}: malformed message from the backend: {exc}"
                    ) from exc
                if answer.turn != turn:
                    raise ExternalAgentError(
                        f"external agent: asked for turn {turn}, got turn {answer.turn}"
                    )
                return answer
        raise ExternalAgentError(
            f"external agent: no assistant message for turn {turn} within {self.timeout_s:g}s "
            f"from {self.conn.uri} (external_agent_timeout_s){last_error}"
        )
