"""The harness: runs one task end to end and always leaves a transcript.

Order of a run: task started → pre_hook → (per step: step started → agent loop → custody of
submissions → pre_scoring_hook → judge → post_hook → step completed) → task completed.
Every failure is classified (:class:`karotte.errors.ErrorKind`); the transcript is written even
when the run is interrupted.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from karotte._version import __version__
from karotte.config import EvaluationRunConfig
from karotte.errors import ErrorKind, KarotteError, StudentMisbehaviorError
from karotte.events import (
    ErrorOccurred,
    HookCompleted,
    RunStatus,
    ScoringCompleted,
    StepCompleted,
    StepStarted,
    StopReason,
    TaskCompleted,
    TaskStarted,
    TokenUsage,
)
from karotte.judges.base import JudgeContext, Scoring
from karotte.sandbox.agent import StepLimits, run_agent_step
from karotte.sandbox.model_client import ModelClient
from karotte.sandbox.tools.base import ToolBox
from karotte.sandbox.transcript import EventRecorder
from karotte.schemas import Message
from karotte.task import Step, Task, effective_instructions, effective_system_prompt

ToolBoxFactory = Callable[[EvaluationRunConfig, Task], AbstractAsyncContextManager[ToolBox]]
Custody = Callable[[EvaluationRunConfig, list[str]], Awaitable[dict[str, Any]]]
# one step of the student: the builtin loop (agent.run_agent_step) or a CLI agent
# (cli_agents.runner.run_cli_agent_step); same arguments, same events, same result
AgentStep = Callable[
    [ModelClient, ToolBox, list[Message], StepLimits, int, Callable[[Any], None]],
    Awaitable[tuple[StopReason, int]],
]


class RunAborted(Exception):
    """Internal: stops the run with a classified error."""

    def __init__(self, kind: ErrorKind, message: str, step_index: int | None = None) -> None:
        super().__init__(message)
        self.kind, self.message, self.step_index = kind, message, step_index


def _classify(exc: BaseException, default: ErrorKind) -> ErrorKind:
    return exc.kind if isinstance(exc, KarotteError) else default


async def _call_hook(
    recorder: EventRecorder,
    hook: str,
    fn: Callable[[], dict[str, Any] | None],
    step_index: int | None,
) -> None:
    try:
        result = await asyncio.to_thread(fn)
    except StudentMisbehaviorError:
        raise
    except Exception as exc:
        raise RunAborted(
            _classify(exc, ErrorKind.TASK), f"{hook} raised {type(exc).__name__}: {exc}", step_index
        ) from exc
    if result is not None and not isinstance(result, dict):
        raise RunAborted(
            ErrorKind.TASK,
            f"{hook} must return a dict or None, got {type(result).__name__}",
            step_index,
        )
    recorder.emit(HookCompleted(hook=hook, step_index=step_index, result=result))  # type: ignore[arg-type]


async def score_step(
    config: EvaluationRunConfig,
    step: Step,
    index: int,
    messages: list[Message],
    recorder: EventRecorder,
    custody: Custody,
) -> Scoring:
    """Custody → pre-scoring hook → judge. Misbehaviour anywhere gives 0 with the reason."""
    started = time.monotonic()
    try:
        paths = list(step.submission_paths)
        submissions = await custody(config, paths) if paths else {}
        await _call_hook(recorder, "pre_scoring_hook", step.pre_scoring_hook, index)
        judge = step.judge
        context = JudgeContext(
            config=config, step_index=index, messages=messages, submissions=submissions
        )
        # The judge has its own timeouts (e.g. ExecutableJudge); this is the backstop.
        scoring = await asyncio.wait_for(judge.score(context), config.judge_timeout_s + 30)
    except StudentMisbehaviorError as exc:
        scoring = Scoring.misbehavior(exc.reason)
    except RunAborted:
        raise
    except TimeoutError as exc:
        raise RunAborted(
            ErrorKind.JUDGE, f"judge timed out after {config.judge_timeout_s:g}s", index
        ) from exc
    except Exception as exc:
        raise RunAborted(
            _classify(exc, ErrorKind.JUDGE), f"scoring failed: {type(exc).__name__}: {exc}", index
        ) from exc
    recorder.emit(
        ScoringCompleted(
            step_index=index,
            score=scoring.score,
            metadata=scoring.metadata,
            continue_task=scoring.continue_task,
            duration_s=time.monotonic() - started,
        )
    )
    return scoring


async def run_task(
    config: EvaluationRunConfig,
    task_cls: type[Task],
    recorder: EventRecorder,
    model: ModelClient,
    open_tools: ToolBoxFactory,
    custody: Custody,
    sandbox: str | None = None,
    before_steps: Callable[[], Awaitable[None]] | None = None,
    agent_step: AgentStep = run_agent_step,
) -> TaskCompleted:
    """Run every step of the task. Always emits exactly one TaskCompleted, even on errors."""
    started = time.monotonic()
    scores: list[float | None] = []
    usage = TokenUsage()
    error: tuple[ErrorKind, str] | None = None
    misbehaved = False

    def emit_and_count(event: Any) -> None:
        nonlocal usage
        if getattr(event, "usage", None) is not None and event.type == "message_added":
            usage = usage + event.usage
        recorder.emit(event)

    try:
        async with asyncio.timeout(config.task_time_limit_s):
            try:
                task = task_cls(config)
                steps = list(task.steps)
                system_prompt = effective_system_prompt(task)
                tool_names = list(task.tools)
            except Exception as exc:
                raise RunAborted(
                    ErrorKind.TASK,
                    f"loading task {config.task_id!r} failed: {type(exc).__name__}: {exc}",
                ) from exc
            scores = [None] * len(steps)
            recorder.emit(
                TaskStarted(
                    run_id=config.run_id,
                    task_id=config.task_id,
                    model=config.model,
                    karotte_version=__version__,
                    system_prompt=system_prompt,
                    tools=tool_names,
                    step_count=len(steps),
                    config=config.redacted(),
                    sandbox=sandbox,
                )
            )
            if before_steps is not None:
                await before_steps()
            await _call_hook(recorder, "pre_hook", task.pre_hook, None)
            messages = [Message(role="system", content=system_prompt)]
            async with open_tools(config, task) as tools:
                for index, step in enumerate(steps):
                    scoring = await _run_step(
                        config,
                        step,
                        index,
                        messages,
                        tools,
                        model,
                        recorder,
                        custody,
                        emit_and_count,
                        agent_step,
                    )
                    scores[index] = scoring.score
                    misbehaved = misbehaved or "misbehavior" in scoring.metadata
                    if not scoring.continue_task:
                        break
    except RunAborted as exc:
        error = (exc.kind, exc.message)
        recorder.emit(
            ErrorOccurred(
                kind=exc.kind,
                message=exc.message,
                step_index=exc.step_index,
                traceback=traceback.format_exc(),
            )
        )
    except TimeoutError:
        error = (ErrorKind.TIMEOUT, f"run exceeded task_time_limit_s={config.task_time_limit_s:g}")
        recorder.emit(ErrorOccurred(kind=ErrorKind.TIMEOUT, message=error[1]))
    except (asyncio.CancelledError, KeyboardInterrupt):
        error = (ErrorKind.INFRA, "run interrupted (Ctrl-C or SIGTERM)")
        recorder.emit(ErrorOccurred(kind=ErrorKind.INFRA, message=error[1]))
        _complete(recorder, config, scores, error, misbehaved, started, usage)
        raise
    except Exception as exc:
        kind = _classify(exc, ErrorKind.INFRA)
        error = (kind, f"{type(exc).__name__}: {exc}")
        recorder.emit(ErrorOccurred(kind=kind, message=error[1], traceback=traceback.format_exc()))
    return _complete(recorder, config, scores, error, misbehaved, started, usage)


async def _run_step(
    config: EvaluationRunConfig,
    step: Step,
    index: int,
    messages: list[Message],
    tools: ToolBox,
    model: ModelClient,
    recorder: EventRecorder,
    custody: Custody,
    emit: Callable[[Any], None],
    agent_step: AgentStep = run_agent_step,
) -> Scoring:
    step_started = time.monotonic()
    try:
        instructions = effective_instructions(step, index)
    except Exception as exc:
        raise RunAborted(
            ErrorKind.TASK, f"step {index} instructions raised {type(exc).__name__}: {exc}", index
        ) from exc
    recorder.emit(StepStarted(step_index=index, instructions=instructions))
    messages.append(Message(role="user", content=instructions))
    step_messages_from = len(messages) - 1
    limits = StepLimits(
        max_turns=config.max_turns,
        deadline=time.monotonic() + config.step_time_limit_s,
        max_context_tokens=config.max_context_tokens,
        max_empty_turns=config.max_empty_turns,
    )
    try:
        # backstop: one tool call or model call can overrun the deadline by its own timeout
        grace = config.tool_timeout_s + 60
        async with asyncio.timeout(config.step_time_limit_s + grace):
            stop_reason, turns = await agent_step(model, tools, messages, limits, index, emit)
    except TimeoutError:
        stop_reason, turns = "time_limit", -1
    except KarotteError as exc:
        raise RunAborted(exc.kind, str(exc), index) from exc
    scoring = await score_step(
        config, step, index, messages[step_messages_from:], recorder, custody
    )
    await _call_hook(recorder, "post_hook", step.post_hook, index)
    recorder.emit(
        StepCompleted(
            step_index=index,
            stop_reason=stop_reason,
            score=scoring.score,
            turns=turns,
            duration_s=time.monotonic() - step_started,
        )
    )
    return scoring


def _complete(
    recorder: EventRecorder,
    config: EvaluationRunConfig,
    scores: list[float | None],
    error: tuple[ErrorKind, str] | None,
    misbehaved: bool,
    started: float,
    usage: TokenUsage,
) -> TaskCompleted:
    ran = [s for s in scores if s is not None]
    total = sum(ran) / len(scores) if scores else 0.0
    status: RunStatus
    if error is not None:
        status, kind = "error", error[0]
    elif misbehaved:
        status, kind = "failed", ErrorKind.MISBEHAVIOR
    else:
        passed = bool(scores) and all(s is not None and s >= config.pass_threshold for s in scores)
        status, kind = ("passed" if passed else "failed"), None
    event = TaskCompleted(
        status=status,
        error_kind=kind,
        scores=scores,
        score=total,
        duration_s=time.monotonic() - started,
        usage=usage,
    )
    recorder.emit(event)
    return event
