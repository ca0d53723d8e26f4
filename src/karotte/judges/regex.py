"""RegexJudge: passes when the student's messages match a regular expression."""

from __future__ import annotations

import re
from typing import Literal

from karotte.judges.base import Judge, JudgeContext, Scoring


class RegexJudge(Judge):
    """Search the step's assistant messages for ``pattern``.

    ``where="last"`` looks only at the final assistant message (the answer); ``"any"`` at every
    assistant message of the step. Tool outputs are never searched: text the student merely
    caused a tool to print does not count as its answer.
    """

    def __init__(
        self,
        pattern: str | re.Pattern[str],
        *,
        flags: int = 0,
        where: Literal["last", "any"] = "last",
        name: str | None = None,
    ) -> None:
        self.pattern = re.compile(pattern, flags) if isinstance(pattern, str) else pattern
        self.where = where
        self.name = name

    async def score(self, context: JudgeContext) -> Scoring:
        said = [m.text() for m in context.student_messages() if m.text()]
        candidates = said[-1:] if self.where == "last" else said
        for text in candidates:
            match = self.pattern.search(text)
            if match:
                return Scoring(
                    score=1.0, metadata={"pattern": self.pattern.pattern, "match": match.group(0)}
                )
        return Scoring(score=0.0, metadata={"pattern": self.pattern.pattern, "match": None})
