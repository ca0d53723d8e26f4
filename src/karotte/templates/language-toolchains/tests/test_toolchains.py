"""The language-toolchains part: toolchain choice, the example tasks, the judge, the fake model.

Compiling needs the toolchains, which live in the image: here (outside it) a toolchain that is
not installed is skipped with the reason. Karotte's own repository builds the image and runs
every toolchain inside it (tests/test_language_toolchains.py).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from karotte.config import EvaluationRunConfig
from karotte.judges.base import JudgeContext

from environment.fake_model import get_messages
from environment.tasks.sum_of_squares.task import CASES, TASKS, solution, source_path
from environment.toolchains import (
    DISABLED,
    TOOLCHAINS,
    ToolchainError,
    get_toolchain,
    installed,
)
from environment.toolchains.task import ProgramOutputJudge, ToolchainTask


def test_unknown_toolchain_lists_the_choices() -> None:
    with pytest.raises(ToolchainError, match="unknown toolchain 'brainfuck'") as info:

        class Bad(ToolchainTask):
            id = "bad"
            toolchain = "brainfuck"

    for name in TOOLCHAINS:
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("name", "reason"),
    [("julia", "Debian bookworm has no julia package"), ("mojo", "proprietary")],
)
def test_switched_off_toolchains_say_why(name: str, reason: str) -> None:
    assert name in DISABLED
    with pytest.raises(ToolchainError, match=reason):
        get_toolchain(name)
    with pytest.raises(ToolchainError, match=reason):
        type("Off", (ToolchainTask,), {"id": "off", "toolchain": name})


def test_one_task_per_toolchain_with_scripts_and_solutions() -> None:
    assert sorted(task.toolchain for task in TASKS) == sorted(TOOLCHAINS)  # type: ignore[attr-defined]
    for task_class in TASKS:
        config = EvaluationRunConfig(task_id=task_class.id)
        task = task_class(config)
        assert "build" in task.tools
        assert task.configure_tools() == {"build": {"toolchain": task.toolchain}}  # type: ignore[attr-defined]
        (step,) = task.steps
        assert step.submission_paths == [str(source_path(task.toolchain))]  # type: ignore[attr-defined]
        messages = get_messages(config)
        assert any(m.tool_calls for m in messages), task_class.id
    for name in TOOLCHAINS:
        assert solution("good", name) != solution("wrong", name)


def test_example_task_keeps_its_script() -> None:
    messages = get_messages(EvaluationRunConfig(task_id="example-task"))
    assert "SUM: 52" in "".join(m.content or "" for m in messages)


def _score(name: str, kind: str, tmp_path: Path) -> float:
    custody = tmp_path / f"custody-{kind}"
    custody.write_text(solution(kind, name))
    context = JudgeContext(
        config=EvaluationRunConfig(task_id=f"sum-of-squares-{name}"),
        step_index=0,
        messages=[],
        submissions={str(source_path(name)): custody},
    )
    return asyncio.run(ProgramOutputJudge(name, CASES).score(context)).score


def _need(name: str) -> None:
    if not installed(name):
        pytest.skip(f"the {name} toolchain is not installed here (it is in the image)")


@pytest.mark.parametrize("name", list(TOOLCHAINS))
def test_judge_scores_good_and_wrong_solutions(name: str, tmp_path: Path) -> None:
    _need(name)
    assert _score(name, "good", tmp_path) == 1.0
    assert _score(name, "wrong", tmp_path) == 0.0


def test_missing_submission_scores_zero(tmp_path: Path) -> None:
    context = JudgeContext(
        config=EvaluationRunConfig(task_id="sum-of-squares-c"), step_index=0, messages=[]
    )
    assert asyncio.run(ProgramOutputJudge("c", CASES).score(context)).score == 0.0


def _karotte() -> list[str]:
    script = Path(sys.executable).parent / "karotte"
    return [str(script)] if script.exists() else [shutil.which("karotte") or "karotte"]


@pytest.mark.slow
def test_fake_model_solves_the_c_task_locally(tmp_path: Path) -> None:
    _need("c")
    transcript = tmp_path / "transcript.json"
    try:
        proc = subprocess.run(
            [
                *_karotte(),
                "run",
                "--runtime",
                "local",
                "--fake-model",
                "--task",
                "sum-of-squares-c",
                "--transcript",
                str(transcript),
                "--events",
                "none",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        source_path("c").unlink(missing_ok=True)  # a local run writes into student_data/
    assert transcript.exists(), proc.stderr
    data = json.loads(transcript.read_text())
    completed = [e for e in data["events"] if e["type"] == "task_completed"][-1]
    assert completed["status"] == "passed", proc.stderr
    assert completed["scores"] == [1.0]


# --- the runner behind `build` and the judge (as the current user here) -----------------------


def _run(script: str, **kwargs: object):
    from environment.toolchains.runner import run_student

    options: dict = {"identity": None, "cwd": "/tmp", "timeout_s": 5.0, "limit_chars": 1000}
    options.update(kwargs)
    return asyncio.run(run_student(["bash", "-c", script], **options))


def test_runner_collects_output_and_exit_code() -> None:
    done = _run("read n; echo out $((n * 2)); echo err >&2; exit 3", stdin=b"21\n")
    assert done.exit_code == 3 and not done.timed_out
    assert "out 42" in done.output and "err" in done.output


def test_runner_times_out_and_kills_what_it_started() -> None:
    done = _run("sleep 1000 & setsid sleep 1001 & sleep 1002", timeout_s=1.0)
    assert done.timed_out and done.exit_code is None
    leftover = subprocess.run(["pgrep", "-f", "sleep 100[012]"], capture_output=True, text=True)
    assert leftover.stdout.strip() == ""


def test_runner_does_not_wait_for_background_children() -> None:
    done = _run("sleep 1003 & echo started", timeout_s=20.0)
    assert done.exit_code == 0 and "started" in done.output and done.seconds < 10
    leftover = subprocess.run(["pgrep", "-f", "sleep 1003"], capture_output=True, text=True)
    assert leftover.stdout.strip() == ""


def test_runner_cuts_long_output_and_stops_a_flood() -> None:
    done = _run("seq 1 100000", limit_chars=1000)
    assert done.exit_code == 0 and "bytes of output cut" in done.output
    assert done.output.startswith("1\n2\n") and done.output.rstrip().endswith("100000")
    assert len(done.output) < 1200
    flood = _run("cat /dev/zero", timeout_s=60.0)
    assert flood.flooded and flood.exit_code is None and flood.seconds < 60
