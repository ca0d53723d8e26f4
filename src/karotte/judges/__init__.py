"""Judges score a step. Compose them with ``&`` (all must pass) and ``|`` (one must pass)."""

from karotte.errors import StudentMisbehaviorError
from karotte.judges.base import AllOf, AlwaysPassJudge, AnyOf, Judge, JudgeContext, Scoring
from karotte.judges.executable import ExecutableJudge
from karotte.judges.regex import RegexJudge
from karotte.judges.rubric import Criterion, RubricJudge

__all__ = [
    "AllOf",
    "AlwaysPassJudge",
    "AnyOf",
    "Criterion",
    "ExecutableJudge",
    "Judge",
    "JudgeContext",
    "RegexJudge",
    "RubricJudge",
    "Scoring",
    "StudentMisbehaviorError",
]
