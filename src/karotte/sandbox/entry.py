"""Entry point of the harness: build the pieces for one run, run it, always write the transcript.

Used by ``karotte run --runtime local`` on the host (no isolation) and by
``karotte run --no-containerized`` inside a sandbox.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import TYPE_CHECKING, Literal

from karotte.config import EvaluationRunConfig
from karotte.console import EventPrinter
from karotte.discovery import fake_model_script, find_task
from karotte.errors import ConfigError, ErrorKind, KarotteError
from karotte.events import ErrorOccurred, LimitsApplied, TaskCompleted
from karotte.sandbox.agent import run_agent_step
from karotte.sandbox.harness import AgentStep, ToolBoxFactory, run_task
from karotte.sandbox.model_client import FakeModelClient, ModelClient
from karotte.sandbox.transcript import EventRecorder, EventSink, jsonl_sink

if TYPE_CHECKING:
    from karotte.sandbox.backend_client import BackendStreamer

EventFormat = Literal["rich", "jsonl", "none"]


def make_model_client(
    config: EvaluationRunConfig, backend: BackendStreamer | None = None
) -> ModelClient:
    if config.agent == "external":
        from karotte.sandbox.external_agent import ExternalAgentClient

        if backend is None:
            raise ConfigError("agent 'external' needs backend_uri: its messages come from there")
        return ExternalAgentClient(config, backend)
    if config.agent.startswith("cli:"):
        from karotte.sandbox.cli_agents.registry import get_adapter

        get_adapter(config.agent.removeprefix("cli:"))  # an unknown name fails the run early
        if config.use_fake_model:
            raise ConfigError(
                "use_fake_model does not apply to a CLI agent: its CLI calls the model"
            )
        return FakeModelClient([])  # unused: the CLI calls the model itself (docs/cli-agents.md)
    if config.agent != "builtin":
        raise ConfigError(f"unknown agent {config.agent!r} (known: builtin, external, cli:<name>)")
    if config.use_fake_model:
        return FakeModelClient(fake_model_script(config))
    from karotte.sandbox.litellm_client import LiteLLMClient

    return LiteLLMClient(config)


def run_harness(
    config: EvaluationRunConfig, events: EventFormat = "rich", sandbox: str | None = None
) -> TaskCompleted:
    """Run the configured task in this process and write ``config.transcript_file``."""
    sinks: list[EventSink] = []
    if events == "rich":
        sinks.append(EventPrinter())
    elif events == "jsonl":
        sinks.append(jsonl_sink(sys.stdout))
    recorder = EventRecorder(config.run_id, config.task_id, config.model, sinks)
    backend = None
    if config.backend_uri:
        from karotte.sandbox.backend_client import finish_backend, open_backend

        backend = open_backend(config, recorder)
    try:
        return asyncio.run(_run(config, recorder, sandbox, backend))
    finally:
        recorder.write(config.transcript_file)
        if backend is not None:  # bounded; never raises; may add warnings and write again
            finish_backend(backend, recorder, config)


async def _run(
    config: EvaluationRunConfig,
    recorder: EventRecorder,
    sandbox: str | None,
    backend: BackendStreamer | None = None,
) -> TaskCompleted:
    from karotte.sandbox.confinement.custody import collect_submission_async
    from karotte.sandbox.confinement.setup import Confinement, setup_confinement
    from karotte.sandbox.tools import open_toolbox

    try:
        task_cls = find_task(config.task_id)
        model = make_model_client(config, backend)
        config.resolved_api_key()  # fail early on an unset $VAR
    except KarotteError as exc:
        recorder.emit(ErrorOccurred(kind=exc.kind, message=str(exc)))
        from karotte.events import TokenUsage

        event = TaskCompleted(
            status="error",
            error_kind=exc.kind,
            scores=[],
            score=0.0,
            duration_s=0.0,
            usage=TokenUsage(),
        )
        recorder.emit(event)
        return event
    confinement: Confinement | None = None

    async def confine_student() -> None:
        # Limits, disk quota, firewall and the network canary, before any student code runs.
        # The in-process tool server listens on no port, so there are no harness ports to close.
        nonlocal confinement
        confinement = await asyncio.to_thread(setup_confinement, config, [])
        recorder.emit(LimitsApplied(limits=confinement.payload()))

    open_tools: ToolBoxFactory = open_toolbox
    agent_step: AgentStep = run_agent_step
    if config.agent.startswith("cli:"):  # a coding agent's CLI plays the student
        from karotte.sandbox.cli_agents.runner import open_cli_toolbox, run_cli_agent_step

        open_tools, agent_step = open_cli_toolbox, run_cli_agent_step
    try:
        return await run_task(
            config,
            task_cls,
            recorder,
            model,
            open_tools,
            collect_submission_async,
            sandbox=sandbox or os.environ.get("KAROTTE_SANDBOX"),
            before_steps=confine_student,
            agent_step=agent_step,
        )
    finally:
        if confinement is not None:
            await asyncio.to_thread(confinement.teardown)


__all__ = ["ErrorKind", "run_harness"]
