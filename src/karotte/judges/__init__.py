"""Judges score a step. Compose them with ``&`` (all must pass) and ``|`` (one must pass)."""

from karotte.errors import StudentMisbehaviorError
from karotte.judges.base import AllOf, AlwaysPassJudge, AnyOf, Judge, JudgeContext, Scoring
from karotte.judges.executable import ExecutableJudge
from karotte.judges.regex import RegexJudge
from karotte.judges.rubric import Criterion, RubricJudge
from karotte.judges.rubric_context import (
    AnswersContext,
    FilesContext,
    ReferenceContext,
    RubricContext,
    TranscriptContext,
)

__all__ = [
    "AllOf",
    "AlwaysPassJudge",
    "AnswersContext",
    "AnyOf",
    "Criterion",
    "ExecutableJudge",
    "FilesContext",
    "Judge",
    "JudgeContext",
    "ReferenceContext",
    "RegexJudge",
    "RubricContext",
    "RubricJudge",
    "Scoring",
    "StudentMisbehaviorError",
    "TranscriptContext",
]
