"""Judges: verdicts, composition, misbehaviour and the ExecutableJudge's timeout."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from karotte import EvaluationRunConfig, StudentMisbehaviorError
from karotte.errors import JudgeError
from karotte.judges import (
    AlwaysPassJudge,
    ExecutableJudge,
    Judge,
    JudgeContext,
    RegexJudge,
    Scoring,
)
from karotte.schemas import Message


def ctx(*assistant_texts: str, submissions: dict[str, Path] | None = None) -> JudgeContext:
    messages = [Message(role="user", content="question 42?")]
    messages += [Message(role="assistant", content=t) for t in assistant_texts]
    return JudgeContext(
        config=EvaluationRunConfig(task_id="t", judge_timeout_s=20),
        step_index=0,
        messages=messages,
        submissions=submissions or {},
    )


def score(judge: Judge, context: JudgeContext) -> Scoring:
    return asyncio.run(judge.score(context))


class Fixed(Judge):
    def __init__(self, value: float, name: str) -> None:
        self.value, self.name = value, name

    async def score(self, context: JudgeContext) -> Scoring:
        return Scoring(score=self.value, metadata={"me": self.name})


class Cheated(Judge):
    async def score(self, context: JudgeContext) -> Scoring:
        raise StudentMisbehaviorError("read the answer key")


def test_scoring_rejects_out_of_range_and_nan() -> None:
    for bad in (1.5, -0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="score must be"):
            Scoring(score=bad)


def test_regex_judge_searches_only_the_students_last_message_by_default() -> None:
    judge = RegexJudge(r"\b42\b")
    assert score(judge, ctx("It is 42.")).score == 1.0
    assert score(judge, ctx("It is 42.", "Actually 41.")).score == 0.0
    # the user's message contains 42 but is never the student's answer
    assert score(judge, ctx("no idea")).score == 0.0
    assert score(RegexJudge(r"\b42\b", where="any"), ctx("It is 42.", "Actually 41.")).score == 1.0


def test_and_or_composition_keeps_the_metadata_tree() -> None:
    both = Fixed(1.0, "a") & Fixed(0.0, "b")
    either = Fixed(1.0, "a") | Fixed(0.0, "b")
    assert score(both, ctx()).score == 0.0
    assert score(either, ctx()).score == 1.0
    nested = (Fixed(1.0, "a") & Fixed(0.5, "b")) & Fixed(1.0, "c")
    result = score(nested, ctx())
    assert result.score == 0.5
    assert [c["metadata"]["me"] for c in result.metadata["children"]] == ["a", "b", "c"]
    mixed = score((Fixed(0.2, "a") | Fixed(0.7, "b")) & Fixed(1.0, "c"), ctx())
    assert mixed.score == 0.7
    assert mixed.metadata["op"] == "and"
    assert mixed.metadata["children"][0]["metadata"]["op"] == "or"


def test_misbehaviour_in_any_branch_propagates() -> None:
    with pytest.raises(StudentMisbehaviorError):
        score(AlwaysPassJudge() | Cheated(), ctx())


def write_script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "score.py"
    script.write_text(textwrap.dedent(body))
    return script


def test_executable_judge_reads_the_verdict_and_sees_the_copy(tmp_path: Path) -> None:
    copy = tmp_path / "copy.txt"
    copy.write_text("hello\n")
    script = write_script(
        tmp_path,
        """
        import json, os, sys
        text = open(os.environ["KAROTTE_SUBMISSION_0"]).read().strip()
        json.dump({"score": float(text == "hello"), "metadata": {"argv": sys.argv[1:]}},
                  open(os.environ["KAROTTE_SCORE_FILE"], "w"))
    """,
    )
    judge = ExecutableJudge(script, args=["{submission}"])
    result = score(judge, ctx(submissions={"/workdir/answer.txt": copy}))
    assert result.score == 1.0
    assert result.metadata["argv"] == [str(copy)]


def test_executable_judge_runs_isolated_from_planted_python_files(tmp_path: Path) -> None:
    # A sitecustomize.py next to the script or on PYTHONPATH must not be imported.
    (tmp_path / "sitecustomize.py").write_text(
        "import json, os\njson.dump({'score': 1.0}, open(os.environ['KAROTTE_SCORE_FILE'], 'w'))\n"
        "raise SystemExit(0)\n"
    )
    (tmp_path / "json.py").write_text("raise SystemExit('shadowed json imported')\n")
    script = write_script(
        tmp_path,
        """
        import json, os
        json.dump({"score": 0.0}, open(os.environ["KAROTTE_SCORE_FILE"], "w"))
    """,
    )
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tmp_path)
    try:
        result = score(ExecutableJudge(script), ctx())
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    assert result.score == 0.0


def test_executable_judge_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    marker = tmp_path / "child-alive"
    script = write_script(
        tmp_path,
        f"""
        import subprocess, sys, time
        # a grandchild that would outlive a naive kill
        subprocess.Popen([sys.executable, "-c",
            "import time, pathlib\\ntime.sleep(3)\\npathlib.Path({str(marker)!r}).write_text('x')"])
        time.sleep(3600)
    """,
    )
    started = time.monotonic()
    with pytest.raises(JudgeError, match="timed out after 1s"):
        score(ExecutableJudge(script, timeout_s=1), ctx())
    assert time.monotonic() - started < 10
    time.sleep(3.5)
    assert not marker.exists(), "the grader's child survived the timeout"


def test_executable_judge_timeout_can_be_misbehaviour(tmp_path: Path) -> None:
    script = write_script(tmp_path, "import time\ntime.sleep(60)\n")
    with pytest.raises(StudentMisbehaviorError, match="timed out"):
        score(ExecutableJudge(script, timeout_s=0.5, timeout_is_misbehavior=True), ctx())


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("raise SystemExit(3)", "exited with 3"),
        ("pass", "wrote no verdict"),
        ("import os\nopen(os.environ['KAROTTE_SCORE_FILE'], 'w').write('{nope')", "unreadable"),
        ("import os\nopen(os.environ['KAROTTE_SCORE_FILE'], 'w').write('[1]')", "JSON object"),
        (
            "import os\nopen(os.environ['KAROTTE_SCORE_FILE'], 'w').write('{\"score\": 7}')",
            "bad verdict",
        ),
    ],
)
def test_executable_judge_broken_graders_are_judge_errors(
    tmp_path: Path, body: str, error: str
) -> None:
    with pytest.raises(JudgeError, match=error):
        score(ExecutableJudge(write_script(tmp_path, body)), ctx())


def test_executable_judge_verdict_can_report_misbehaviour(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        """
        import json, os
        verdict = {"misbehavior": "answer is a symlink"}
        json.dump(verdict, open(os.environ["KAROTTE_SCORE_FILE"], "w"))
    """,
    )
    with pytest.raises(StudentMisbehaviorError, match="symlink"):
        score(ExecutableJudge(script), ctx())


def test_executable_judge_uses_the_harness_interpreter(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        """
        import json, os, sys
        json.dump({"score": 1.0, "metadata": {"exe": sys.executable}},
                  open(os.environ["KAROTTE_SCORE_FILE"], "w"))
    """,
    )
    assert score(ExecutableJudge(script), ctx()).metadata["exe"] == sys.executable
