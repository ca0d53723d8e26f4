"""Judge interface, the Scoring result, and composition with ``&`` and ``|``."""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from karotte.config import EvaluationRunConfig
from karotte.errors import StudentMisbehaviorError
from karotte.schemas import Message


class Scoring(BaseModel):
    """A judge's verdict: ``score`` in [0, 1], free-form ``metadata``, and whether to go on."""

    model_config = ConfigDict(extra="forbid")

    score: float
    metadata: dict[str, Any] = Field(default_factory=dict)
    continue_task: bool = True

    @field_validator("score")
    @classmethod
    def _finite_unit_interval(cls, value: float) -> float:
        if not math.isfinite(value) or not 0.0 <= value <= 1.0:
            raise ValueError(f"score must be a finite number in [0, 1], got {value!r}")
        return value

    @classmethod
    def misbehavior(cls, reason: str) -> Scoring:
        """Score 0 because the student misbehaved; the reason is recorded."""
        return cls(score=0.0, metadata={"misbehavior": reason}, continue_task=True)


@dataclass
class JudgeContext:
    """What a judge may look at.

    ``messages`` are the step's conversation; ``submissions`` maps each submitted path (as the
    student named it) to the root-only copy taken into custody: judges read the copy, never the
    student's file.
    """

    config: EvaluationRunConfig
    step_index: int
    messages: list[Message]
    submissions: dict[str, Path] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def student_messages(self) -> list[Message]:
        """The assistant's messages of this step (what the student said)."""
        return [m for m in self.messages if m.role == "assistant"]


class Judge(abc.ABC):
    """Scores a step. Subclasses implement :meth:`score`; compose judges with ``&`` and ``|``."""

    name: str | None = None

    @abc.abstractmethod
    async def score(self, context: JudgeContext) -> Scoring:
        """Return the verdict. Raise :class:`StudentMisbehaviorError` for cheating."""

    def label(self) -> str:
        return self.name or type(self).__name__

    def __and__(self, other: Judge) -> Judge:
        return AllOf(self, other)

    def __or__(self, other: Judge) -> Judge:
        return AnyOf(self, other)


class _Composite(Judge):
    op: str = ""

    def __init__(self, *judges: Judge) -> None:
        flat: list[Judge] = []
        for judge in judges:
            if not isinstance(judge, Judge):
                raise TypeError(f"can only compose Judge objects, got {type(judge).__name__}")
            # (a & b) & c flattens to one node, so the metadata tree stays readable
            if isinstance(judge, _Composite) and type(judge) is type(self):
                flat.extend(judge.judges)
            else:
                flat.append(judge)
        self.judges: list[Judge] = flat

    def _combine(self, scores: list[float]) -> float:
        raise NotImplementedError

    async def score(self, context: JudgeContext) -> Scoring:
        # Every child runs (their metadata is all recorded). Misbehaviour in any child propagates
        # and zeroes the whole step: cheating is never excused by another judge passing.
        results = [await judge.score(context) for judge in self.judges]
        return Scoring(
            score=self._combine([r.score for r in results]),
            metadata={
                "op": self.op,
                "children": [
                    {"judge": j.label(), "score": r.score, "metadata": r.metadata}
                    for j, r in zip(self.judges, results, strict=True)
                ],
            },
            continue_task=all(r.continue_task for r in results),
        )


class AllOf(_Composite):
    """``a & b``: the lowest child score (all must pass)."""

    op = "and"

    def _combine(self, scores: list[float]) -> float:
        return min(scores)


class AnyOf(_Composite):
    """``a | b``: the highest child score (one must pass)."""

    op = "or"

    def _combine(self, scores: list[float]) -> float:
        return max(scores)


class AlwaysPassJudge(Judge):
    """Scores 1.0. For steps that only prepare something, and for tests."""

    async def score(self, context: JudgeContext) -> Scoring:
        return Scoring(score=1.0, metadata={})


__all__ = [
    "AllOf",
    "AlwaysPassJudge",
    "AnyOf",
    "Judge",
    "JudgeContext",
    "Scoring",
    "StudentMisbehaviorError",
]
