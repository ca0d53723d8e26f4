"""The scripted "fake model": messages that solve the tasks, to test them without a real model.

`karotte run --fake-model --task example-task` replays these messages in order, one per model
call, across all steps. Build them with `karotte.schemas.assistant` and `tool_call`.
"""

from __future__ import annotations

from karotte.config import EvaluationRunConfig
from karotte.schemas import Message, assistant, tool_call

from environment import paths

SUM_COMMAND = "awk '{s += $1} END {print s}' "


def get_messages(config: EvaluationRunConfig) -> list[Message]:
    if config.task_id == "example-task":
        return _example_task()
    return [assistant("The fake model has no script for this task.")]


def _example_task() -> list[Message]:
    numbers = paths.SHARED_DATA / "example_task" / "numbers.txt"
    answer = paths.STUDENT_DATA / "answer.txt"
    return [
        # step 1: read the file, answer in a message
        assistant(None, [tool_call("call_1", "view_lines_in_file", path=str(numbers))]),
        assistant(None, [tool_call("call_2", "bash", command=SUM_COMMAND + str(numbers))]),
        assistant("The numbers add up to 52.\n\nSUM: 52"),
        # step 2: write a draft, fix it with replace_in_file, check it
        assistant(None, [tool_call("call_3", "bash", command=f"echo 'largest: 17' > {answer}")]),
        assistant(
            None,
            [
                tool_call(
                    "call_4",
                    "replace_in_file",
                    path=str(answer),
                    old="largest: 17",
                    new="23",
                )
            ],
        ),
        assistant(None, [tool_call("call_5", "bash", command=f"cat {answer}")]),
        assistant(f"I wrote the largest number, 23, to {answer}."),
    ]
