"""Every task loads, with and without hints; INCLUDE_TASKS/EXCLUDE_TASKS filter them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from karotte.config import EvaluationRunConfig
from karotte.discovery import load_tasks

from environment import get_tasks
from environment.tasks.example_task import task as example


@pytest.mark.parametrize("use_hints", [False, True])
def test_every_task_loads(use_hints: bool) -> None:
    tasks = load_tasks()
    assert "example-task" in tasks
    for task_id, cls in tasks.items():
        task = cls(EvaluationRunConfig(task_id=task_id, use_hints=use_hints))
        assert task.system_prompt
        assert task.steps
        for step in task.steps:
            assert step.instructions
            assert step.judge is not None


def test_hint_only_when_asked() -> None:
    plain = example.SumStep(EvaluationRunConfig(task_id="example-task"))
    hinted = example.SumStep(EvaluationRunConfig(task_id="example-task", use_hints=True))
    assert "Hint" not in plain.instructions
    assert "Hint" in hinted.instructions


def test_include_and_exclude_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXCLUDE_TASKS", "example-task")
    assert "example-task" not in {t.id for t in get_tasks()}
    monkeypatch.delenv("EXCLUDE_TASKS")
    monkeypatch.setenv("INCLUDE_TASKS", "example-task")
    assert [t.id for t in get_tasks()] == ["example-task"]
    monkeypatch.setenv("INCLUDE_TASKS", "no-such-task")
    with pytest.raises(ValueError, match="no-such-task"):
        get_tasks()


@pytest.mark.parametrize(("content", "score"), [("23\n", 1.0), ("17", 0.0), ("", 0.0)])
def test_scoring_script(tmp_path, content: str, score: float) -> None:
    submission = tmp_path / "answer.txt"
    submission.write_text(content)
    score_file = tmp_path / "score.json"
    subprocess.run(
        [
            sys.executable,
            "-I",
            str(example.HERE / "score_answer.py"),
            str(submission),
            str(example.EXPECTED),
        ],
        env={"KAROTTE_SCORE_FILE": str(score_file)},
        check=True,
    )
    assert json.loads(score_file.read_text())["score"] == score
