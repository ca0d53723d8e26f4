"""RubricJudge: grades criteria with an LLM through litellm. (Being implemented.)"""

from __future__ import annotations

from pydantic import BaseModel

from karotte.errors import JudgeError
from karotte.judges.base import Judge, JudgeContext, Scoring


class Criterion(BaseModel):
    description: str
    weight: float = 1.0


class RubricJudge(Judge):
    def __init__(self, criteria: list[str | Criterion], **kwargs: object) -> None:
        self.criteria = [
            c if isinstance(c, Criterion) else Criterion(description=c) for c in criteria
        ]

    async def score(self, context: JudgeContext) -> Scoring:
        raise JudgeError("RubricJudge is not implemented yet")
