"""The example task: two steps, one judged by a regular expression, one by a scoring script.

Step 1: the student reads a shared file and answers in a message (RegexJudge).
Step 2: the student writes a file. The harness takes it into custody (a root-only copy made
after the student is done), and `score_answer.py` grades that copy against the expected answer
in root_data/, which the student cannot read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from karotte.judges import ExecutableJudge, Judge, RegexJudge
from karotte.task import Step, Task

from environment import paths
from environment.system_prompts import DEFAULT_SYSTEM_PROMPT

HERE = Path(__file__).resolve().parent
NUMBERS = paths.SHARED_DATA / "example_task" / "numbers.txt"
ANSWER = paths.STUDENT_DATA / "answer.txt"
EXPECTED = paths.ROOT_DATA / "example_task" / "expected_answer.txt"


class SumStep(Step):
    @property
    def instructions(self) -> str:
        text = (
            f"The file {NUMBERS} holds one integer per line. What is their sum? "
            "End your answer with a line `SUM: <number>`."
        )
        if self.config.use_hints:
            text += "\n\nHint: `awk '{s += $1} END {print s}' FILE` adds up a column."
        return text

    @property
    def judge(self) -> Judge:
        return RegexJudge(r"SUM:\s*52\b")


class LargestNumberStep(Step):
    @property
    def instructions(self) -> str:
        return f"Write the largest number of {NUMBERS} into {ANSWER}, as the file's only content."

    @property
    def submission_paths(self) -> list[str]:
        return [str(ANSWER)]

    @property
    def judge(self) -> Judge:
        return ExecutableJudge(HERE / "score_answer.py", ["{submission}", str(EXPECTED)])


class ExampleTask(Task):
    id = "example-task"

    @property
    def system_prompt(self) -> str:
        return DEFAULT_SYSTEM_PROMPT

    @property
    def tools(self) -> list[str]:
        return ["bash", "view_lines_in_file", "replace_in_file"]

    @property
    def steps(self) -> list[Step]:
        return [SumStep(self.config), LargestNumberStep(self.config)]

    def pre_hook(self) -> dict[str, Any] | None:
        # a local run leaves the answer of the previous run behind; start from nothing
        if ANSWER.is_symlink() or ANSWER.exists():
            ANSWER.unlink()
            return {"removed_stale_answer": str(ANSWER)}
        return None
