"""What a :class:`~karotte.judges.RubricJudge` shows its grader: context providers.

Each provider renders one block of evidence. The judge puts every block between its own markers
carrying a random nonce, so nothing the student wrote can close a block early or pose as another.

* :class:`TranscriptContext`: the step's conversation — messages, tool calls, tool results —
  or only its last ``last_n`` messages;
* :class:`AnswersContext`: the student's answers (its text messages), the last ``last_n``;
* :class:`FilesContext`: files — a submission taken into custody (by the name the student gave
  it) or a root-owned file such as a reference solution; read safely, bounded in size;
* :class:`ReferenceContext`: text from the task author (a reference answer, a specification).

Subclass :class:`RubricContext` for anything else (``label``, ``description``, ``render``).
"""

from __future__ import annotations

import abc
import os
import re
import stat
from collections.abc import Sequence

from karotte.judges.base import JudgeContext

PART_LIMIT = 4000  # characters of one message shown to the grader
TRANSCRIPT_LIMIT = 100_000  # characters of the whole transcript shown to the grader
FILE_LIMIT = 20_000  # bytes of one file shown to the grader
_LABEL = re.compile(r"^[A-Z][A-Z0-9_]{0,31}$")


class RubricContext(abc.ABC):
    """One block of evidence for the grader."""

    label: str = "EVIDENCE"  # the marker word: capitals, digits, underscores
    description: str = "Evidence about the agent's work."  # tells the grader what the block is

    @abc.abstractmethod
    def render(self, context: JudgeContext) -> str:
        """The block's text (bounded in size by the provider)."""

    def checked_label(self) -> str:
        if not _LABEL.match(self.label):
            raise ValueError(f"a rubric context label must match {_LABEL.pattern}: {self.label!r}")
        return self.label


def clip(text: str, limit: int = PART_LIMIT) -> str:
    if len(text) <= limit:
        return text
    return (
        f"{text[: limit // 2]}\n[... {len(text) - limit} characters left out ...]\n"
        + (text[-limit // 2 :])
    )


class TranscriptContext(RubricContext):
    """The step's conversation; ``last_n`` keeps only its last messages (system prompt never
    shown); ``tool_calls``/``tool_results`` leave those out when False."""

    label = "TRANSCRIPT"

    def __init__(
        self, last_n: int | None = None, *, tool_calls: bool = True, tool_results: bool = True
    ) -> None:
        if last_n is not None and last_n < 1:
            raise ValueError("last_n must be at least 1")
        self.last_n = last_n
        self.tool_calls = tool_calls
        self.tool_results = tool_results
        shown = "the whole step" if last_n is None else f"the last {last_n} message(s) of the step"
        self.description = f"The transcript of the agent's work ({shown})."

    def render(self, context: JudgeContext) -> str:
        messages = [m for m in context.messages if m.role != "system"]
        if self.last_n is not None:
            messages = messages[-self.last_n :]
        parts: list[str] = []
        for message in messages:
            if message.role == "tool":
                if self.tool_results:
                    parts.append(f"[tool result: {message.name or '?'}]\n{clip(message.text())}")
                continue
            label = "agent" if message.role == "assistant" else "user"
            if message.text().strip():
                parts.append(f"[{label}]\n{clip(message.text())}")
            if self.tool_calls:
                for call in message.tool_calls or []:
                    parts.append(
                        f"[agent called tool {call.function.name}]\n{clip(call.function.arguments)}"
                    )
        text = "\n\n".join(parts) or "(empty)"
        if len(text) > TRANSCRIPT_LIMIT:
            head = parts[0] if parts else ""
            tail = text[-(TRANSCRIPT_LIMIT - len(head) - 100) :]
            text = f"{head}\n\n[... earlier part of the transcript left out ...]\n\n{tail}"
        return text


class AnswersContext(RubricContext):
    """The student's answers (its non-empty text messages), the last ``last_n`` (None: all)."""

    label = "ANSWERS"

    def __init__(self, last_n: int | None = 1) -> None:
        if last_n is not None and last_n < 1:
            raise ValueError("last_n must be at least 1")
        self.last_n = last_n
        self.description = (
            "The agent's final answer."
            if last_n == 1
            else "The agent's answers, oldest first, separated by lines of dashes."
        )

    def render(self, context: JudgeContext) -> str:
        said = [m.text() for m in context.student_messages() if m.text().strip()]
        if self.last_n is not None:
            said = said[-self.last_n :]
        if not said:
            return "(the agent gave no answer)"
        return clip("\n-----\n".join(said), TRANSCRIPT_LIMIT)


class FilesContext(RubricContext):
    """Files, each under a header with its name. A name the student submitted
    (``collect_submission``) shows the custody copy; any other path must be an absolute path
    to a regular, root-owned file (a reference solution, a log the harness wrote) — never a
    student's file read in place, which it could swap for a FIFO or a link to the answer key."""

    label = "FILES"

    def __init__(self, paths: Sequence[str], *, max_bytes: int = FILE_LIMIT) -> None:
        if not paths:
            raise ValueError("FilesContext needs at least one path")
        self.paths = list(paths)
        self.max_bytes = max_bytes
        self.description = "Files from the agent's work or the task, each under '== name =='."

    def render(self, context: JudgeContext) -> str:
        blocks = []
        for name in self.paths:
            custody = context.submissions.get(name)
            if custody is not None:
                body = read_evidence_file(str(custody), self.max_bytes, require_root=False)
            elif not os.path.isabs(name):
                body = "(not submitted)"
            else:
                body = read_evidence_file(name, self.max_bytes, require_root=True)
            blocks.append(f"== {name} ==\n{body}")
        return "\n\n".join(blocks)


class ReferenceContext(RubricContext):
    """Text from the task author, e.g. a reference answer or the specification to grade by."""

    label = "REFERENCE"

    def __init__(self, text: str, description: str = "A reference from the task's author.") -> None:
        self.text = text
        self.description = description

    def render(self, context: JudgeContext) -> str:
        return clip(self.text, TRANSCRIPT_LIMIT)


def read_evidence_file(path: str, max_bytes: int, *, require_root: bool) -> str:
    """A file's text for the grader, read without following a final symlink, without blocking
    on a FIFO or device, and never more than ``max_bytes``; a problem is shown, not raised."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        return f"(unreadable: {exc.strerror or exc})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "(not a regular file)"
        if require_root and st.st_uid != 0:
            return "(refused: not owned by root; submit it with collect_submission instead)"
        data = os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if b"\0" in data[:8192]:
        return f"(binary file, {st.st_size} bytes)"
    text = data[:max_bytes].decode("utf-8", errors="replace")
    if len(data) > max_bytes:
        text += f"\n[... {st.st_size - max_bytes} more bytes left out ...]"
    return text
