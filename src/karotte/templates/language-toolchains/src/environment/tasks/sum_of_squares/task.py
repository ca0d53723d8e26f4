"""One example task per toolchain: read n from stdin, print 1² + 2² + … + n².

The student writes the program into its data folder and may try it with the `build` tool; the
file is taken into custody when the student is done, and `ProgramOutputJudge` compiles and runs
the custody copy as the student on hidden cases (root_data/sum_of_squares/cases.json).
"""

from __future__ import annotations

from pathlib import Path

from karotte.judges import Judge
from karotte.task import Step, Task

from environment import paths
from environment.system_prompts import DEFAULT_SYSTEM_PROMPT
from environment.toolchains import TOOLCHAINS, get_toolchain
from environment.toolchains.task import ProgramOutputJudge, ToolchainTask

HERE = Path(__file__).resolve().parent
SOLUTIONS = HERE / "solutions"  # the fake model's (good) and the tests' (wrong) programs
CASES = paths.ROOT_DATA / "sum_of_squares" / "cases.json"


def source_path(toolchain: str) -> Path:
    """Where the student writes the program (Java wants the public class's name)."""
    if toolchain == "java":
        return paths.STUDENT_DATA / "Main.java"
    return paths.STUDENT_DATA / f"solution{get_toolchain(toolchain).extension}"


def solution(kind: str, toolchain: str) -> str:
    """A scripted solution: ``kind`` is "good" or "wrong"."""
    extension = get_toolchain(toolchain).extension
    return (SOLUTIONS / kind / f"{toolchain}{extension}").read_text(encoding="utf-8")


class SquaresStep(Step):
    def __init__(self, task: SumOfSquaresTask) -> None:
        super().__init__(task.config)
        self.toolchain = get_toolchain(task.toolchain)

    @property
    def instructions(self) -> str:
        path = source_path(self.toolchain.name)
        text = (
            f"Write a program in {self.toolchain.title} that reads one integer n "
            f"(0 <= n <= 1000000) from standard input and prints 1^2 + 2^2 + ... + n^2 "
            f"followed by a newline. For n = 3 it prints 14.\n\n"
            f"Save it as {path}. The `build` tool compiles and runs it (pass the input as "
            f"`stdin`); it is graded on hidden inputs when you are done."
        )
        if self.toolchain.name == "java":
            text += " The public class must be called Main."
        if self.config.use_hints:
            text += "\n\nHint: the sum can exceed 2^32; use a 64-bit integer."
        return text

    @property
    def submission_paths(self) -> list[str]:
        return [str(source_path(self.toolchain.name))]

    @property
    def judge(self) -> Judge:
        return ProgramOutputJudge(self.toolchain.name, CASES)


class SumOfSquaresTask(ToolchainTask):
    """Subclassed once per toolchain below (the task id names the toolchain)."""

    @property
    def system_prompt(self) -> str:
        return DEFAULT_SYSTEM_PROMPT

    @property
    def steps(self) -> list[Step]:
        return [SquaresStep(self)]

    def pre_hook(self) -> dict[str, object] | None:
        recorded = dict(super().pre_hook() or {})
        stale = source_path(self.toolchain)
        if stale.is_symlink() or stale.exists():  # a local run leaves the last program behind
            stale.unlink()
            recorded["removed_stale_source"] = str(stale)
        return recorded


def _task_class(name: str) -> type[Task]:
    class_name = "".join(part.capitalize() for part in name.split("-")) + "SquaresTask"
    attributes = {"id": f"sum-of-squares-{name}", "toolchain": name, "__module__": __name__}
    return type(class_name, (SumOfSquaresTask,), attributes)


TASKS: list[type[Task]] = [_task_class(name) for name in TOOLCHAINS]
