"""TASK_ID: describe the task here.

Made by `just create-task TASK_ID` from tasks/_template/. Keep answers and scoring data in
root_data/ (the student cannot read it); put what the student works on in student_data/ or
shared_data/ (see environment.paths).
"""

from __future__ import annotations

from karotte.judges import Judge, RegexJudge
from karotte.task import Step, Task

from environment.system_prompts import DEFAULT_SYSTEM_PROMPT


class FirstStep(Step):
    @property
    def instructions(self) -> str:
        text = "Describe what the student has to do. End your answer with `ANSWER: <answer>`."
        if self.config.use_hints:
            text += "\n\nHint: a hint for weaker models."
        return text

    @property
    def judge(self) -> Judge:
        return RegexJudge(r"ANSWER:\s*42\b")


class TemplateTask(Task):
    id = "TASK_ID"

    @property
    def system_prompt(self) -> str:
        return DEFAULT_SYSTEM_PROMPT

    @property
    def tools(self) -> list[str]:
        return ["bash", "view_lines_in_file", "replace_in_file"]

    @property
    def steps(self) -> list[Step]:
        return [FirstStep(self.config)]
