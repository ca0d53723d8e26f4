"""The harness's step loop, scoring and error classification, with in-test tools and custody.

The full stack (real tools, real custody, the CLI) is covered by test_run_local.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from karotte import EvaluationRunConfig, Step, StudentMisbehaviorError, Task
from karotte.errors import TaskDefinitionError
from karotte.events import TaskCompleted
from karotte.judges import AlwaysPassJudge, Judge, JudgeContext, RegexJudge, Scoring
from karotte.sandbox.harness import run_task
from karotte.sandbox.model_client import FakeModelClient
from karotte.sandbox.tools.base import ToolResult
from karotte.sandbox.transcript import EventRecorder
from karotte.schemas import Message, assistant, tool_call


class EchoTools:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def specs(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": "echo", "parameters": {}}}]

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        self.calls.append((name, arguments))
        return ToolResult(output=str(arguments.get("text", "")))

    async def aclose(self) -> None:
        pass


def make_open_tools(tools: EchoTools) -> Any:
    @asynccontextmanager
    async def open_tools(config: EvaluationRunConfig, task: Task) -> AsyncIterator[EchoTools]:
        yield tools

    return open_tools


async def no_custody(config: EvaluationRunConfig, paths: list[str]) -> dict[str, Any]:
    return {p: Path(p) for p in paths}


class Raising(Judge):
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    async def score(self, context: JudgeContext) -> Scoring:
        raise self.exc


def task_with(judges: list[Judge], **task_attrs: Any) -> type[Task]:
    def make_step(judge: Judge) -> type[Step]:
        class S(Step):
            @property
            def instructions(self) -> str:
                return "do it"

            @property
            def judge(self) -> Judge:
                return judge

        return S

    step_classes = [make_step(j) for j in judges]

    class T(Task):
        id = "t"

        @property
        def system_prompt(self) -> str:
            return "sys"

        @property
        def steps(self) -> list[Step]:
            return [cls(config=self.config) for cls in step_classes]

    for name, value in task_attrs.items():
        setattr(T, name, value)
    return T


def run(
    task_cls: type[Task], script: list[Message], **config: Any
) -> tuple[TaskCompleted, EventRecorder, EchoTools]:
    cfg = EvaluationRunConfig(task_id="t", **config)
    recorder = EventRecorder(cfg.run_id, cfg.task_id, cfg.model)
    tools = EchoTools()
    done = asyncio.run(
        run_task(
            cfg, task_cls, recorder, FakeModelClient(script), make_open_tools(tools), no_custody
        )
    )
    return done, recorder, tools


def types(recorder: EventRecorder) -> list[str]:
    return [e.type for e in recorder.events]


def test_two_steps_pass_and_events_are_ordered() -> None:
    script = [
        assistant(None, [tool_call("c1", "echo", text="hi")]),
        assistant("42"),
        assistant("done"),
    ]
    done, recorder, tools = run(task_with([RegexJudge("42"), AlwaysPassJudge()]), script)
    assert done.status == "passed" and done.scores == [1.0, 1.0] and done.error_kind is None
    assert tools.calls == [("echo", {"text": "hi"})]
    assert types(recorder) == [
        "task_started",
        "hook_completed",
        "step_started",
        "message_added",
        "tool_call_started",
        "tool_call_completed",
        "message_added",
        "hook_completed",
        "scoring",
        "hook_completed",
        "step_completed",
        "step_started",
        "message_added",
        "hook_completed",
        "scoring",
        "hook_completed",
        "step_completed",
        "task_completed",
    ]
    assert [e.seq for e in recorder.events] == list(range(len(recorder.events)))


def test_misbehaviour_scores_zero_with_reason_and_run_continues() -> None:
    done, recorder, _ = run(
        task_with([Raising(StudentMisbehaviorError("symlinked the key")), AlwaysPassJudge()]),
        [assistant("a"), assistant("b")],
    )
    scoring = [e for e in recorder.events if e.type == "scoring"]
    assert scoring[0].score == 0.0  # type: ignore[union-attr]
    assert scoring[0].metadata == {"misbehavior": "symlinked the key"}  # type: ignore[union-attr]
    assert done.scores == [0.0, 1.0]
    assert done.status == "failed" and done.error_kind == "misbehavior"


def test_misbehaviour_in_pre_scoring_hook_is_zero_not_an_error() -> None:
    def hook(self: Step) -> dict[str, Any]:
        raise StudentMisbehaviorError("left a process running")

    task = task_with([AlwaysPassJudge()])
    step_cls = type(task(EvaluationRunConfig(task_id="t")).steps[0])
    step_cls.pre_scoring_hook = hook  # type: ignore[method-assign]
    done, _, _ = run(task, [assistant("a")])
    assert done.scores == [0.0] and done.error_kind == "misbehavior"


@pytest.mark.parametrize(
    ("judge", "kind"),
    [(Raising(RuntimeError("bug in judge")), "judge"), (Raising(KeyError("x")), "judge")],
)
def test_judge_failure_is_a_judge_error(judge: Judge, kind: str) -> None:
    done, recorder, _ = run(task_with([judge, AlwaysPassJudge()]), [assistant("a")])
    assert done.status == "error" and done.error_kind == kind
    assert done.scores == [None, None]
    assert recorder.events[-2].type == "error"


def test_task_code_failure_is_a_task_error() -> None:
    def broken_hook(self: Task) -> dict[str, Any]:
        raise ValueError("cannot prepare")

    done, recorder, _ = run(task_with([AlwaysPassJudge()], pre_hook=broken_hook), [])
    assert done.status == "error" and done.error_kind == "task"
    assert "cannot prepare" in recorder.events[-2].message  # type: ignore[union-attr]


def test_max_turns_fires_and_step_is_still_scored() -> None:
    looping = [assistant(None, [tool_call(f"c{i}", "echo", text="x")]) for i in range(10)]
    done, recorder, tools = run(task_with([AlwaysPassJudge()]), looping, max_turns=3)
    step_done = next(e for e in recorder.events if e.type == "step_completed")
    assert step_done.stop_reason == "max_turns" and step_done.turns == 3  # type: ignore[union-attr]
    assert len(tools.calls) == 3
    assert done.scores == [1.0]


def test_empty_turns_are_nudged_then_stop() -> None:
    _done, recorder, _ = run(task_with([AlwaysPassJudge()]), [assistant("")] * 5, max_empty_turns=2)
    nudges = [e for e in recorder.events if e.type == "message_added" and e.message.role == "user"]  # type: ignore[union-attr]
    assert len(nudges) == 2
    step_done = next(e for e in recorder.events if e.type == "step_completed")
    assert step_done.stop_reason == "empty_turns"  # type: ignore[union-attr]


def test_malformed_tool_arguments_go_back_to_the_model() -> None:
    bad = assistant(None, [tool_call("c1", "echo")])
    bad.tool_calls[0].function.arguments = "{not json"  # type: ignore[index]
    done, recorder, tools = run(task_with([AlwaysPassJudge()]), [bad, assistant("ok")])
    completed = next(e for e in recorder.events if e.type == "tool_call_completed")
    assert completed.is_error and "not valid JSON" in completed.output  # type: ignore[union-attr]
    assert tools.calls == []
    assert done.status == "passed"


def test_continue_task_false_stops_after_the_step() -> None:
    class Stop(Judge):
        async def score(self, context: JudgeContext) -> Scoring:
            return Scoring(score=1.0, continue_task=False)

    done, _, _ = run(task_with([Stop(), AlwaysPassJudge()]), [assistant("a")])
    assert done.scores == [1.0, None] and done.status == "failed"


def test_extra_config_overrides_prompt_and_instructions() -> None:
    _done, recorder, _ = run(
        task_with([AlwaysPassJudge(), AlwaysPassJudge()]),
        [assistant("a"), assistant("b")],
        extra_config={
            "system_prompt_override": "NEW",
            "extra_system_prompt": "MORE",
            "instructions_override": [None, "second!"],
            "extra_task_instructions": "END",
        },
    )
    started = recorder.events[0]
    assert started.system_prompt == "NEW\n\nMORE"  # type: ignore[union-attr]
    steps = [e.instructions for e in recorder.events if e.type == "step_started"]  # type: ignore[union-attr]
    assert steps == ["do it\n\nEND", "second!\n\nEND"]


def test_a_property_declared_as_method_is_refused_at_class_definition() -> None:
    with pytest.raises(TaskDefinitionError, match=r"system_prompt must be a @property"):

        class Bad(Task):
            id = "bad"

            def system_prompt(self) -> str:  # type: ignore[override]
                return "x"

    with pytest.raises(TypeError, match=r"judge must be a @property"):

        class BadStep(Step):
            def judge(self) -> Judge:  # type: ignore[override]
                return AlwaysPassJudge()


def test_hook_results_are_recorded() -> None:
    _done, recorder, _ = run(
        task_with([AlwaysPassJudge()], pre_hook=lambda self: {"seed": 7}), [assistant("a")]
    )
    hooks = [e for e in recorder.events if e.type == "hook_completed"]
    assert hooks[0].hook == "pre_hook" and hooks[0].result == {"seed": 7}  # type: ignore[union-attr]
