"""The fake model's script for the sum-of-squares tasks: write the program, try it, finish."""

from __future__ import annotations

from karotte.schemas import Message, assistant, tool_call

from environment.tasks.sum_of_squares.task import solution, source_path
from environment.toolchains import TOOLCHAINS

PREFIX = "sum-of-squares-"


def messages_for(task_id: str) -> list[Message] | None:
    name = task_id.removeprefix(PREFIX)
    if not task_id.startswith(PREFIX) or name not in TOOLCHAINS:
        return None
    path = source_path(name)
    write = f"cat > {path} <<'KAROTTE_EOF'\n{solution('good', name)}KAROTTE_EOF\n"
    return [
        assistant(None, [tool_call("call_1", "bash", command=write)]),
        assistant(None, [tool_call("call_2", "build", source=str(path), stdin="3\n")]),
        assistant(f"The program in {path} prints 14 for n = 3, as it should."),
    ]
