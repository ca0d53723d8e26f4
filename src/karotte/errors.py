"""Exceptions shared by the host side and the sandbox side.

Every failure of a run is classified by an :class:`ErrorKind` so that a trainer can drop
infrastructure failures instead of learning from them.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorKind(StrEnum):
    """Why a run did not end normally. Recorded in the task-completed event."""

    MODEL = "model"  # the model API failed after retries, or answered garbage we cannot use
    TASK = "task"  # the environment's task code raised (a bug in the task, not the student)
    JUDGE = "judge"  # a judge or scoring script failed or timed out
    INFRA = "infra"  # the sandbox, tool server or harness itself failed
    TIMEOUT = "timeout"  # the whole run exceeded its wall-clock budget
    MISBEHAVIOR = "misbehavior"  # the student tried to cheat or break the harness


class KarotteError(Exception):
    """Base class of Karotte's own errors. The message is meant for a human and says what to do."""

    kind: ErrorKind = ErrorKind.INFRA


class StudentMisbehaviorError(KarotteError):
    """Raised when the student cheated or attacked the harness.

    Raising it anywhere during scoring (hooks, custody, judges) turns the step's score into 0 with
    the reason recorded in ``metadata["misbehavior"]``; it is never reported as an infrastructure
    error.
    """

    kind = ErrorKind.MISBEHAVIOR

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ConfigError(KarotteError):
    """A run config, template or CLI argument is malformed. The message names the field and file."""

    kind = ErrorKind.INFRA


class TaskDefinitionError(KarotteError, TypeError):
    """A Task or Step class is declared wrongly (raised at class definition or load time)."""

    kind = ErrorKind.TASK


class TaskLoadError(KarotteError):
    """The environment package or one of its tasks or tools could not be loaded."""

    kind = ErrorKind.TASK


class JudgeError(KarotteError):
    """A judge failed for a reason that is not the student's fault (bug, timeout, bad output)."""

    kind = ErrorKind.JUDGE


class ModelError(KarotteError):
    """The model could not be called (after retries) or returned something unusable."""

    kind = ErrorKind.MODEL


class RuntimeUnavailableError(KarotteError):
    """A sandbox runtime is not installed or not running. The message holds the exact fix."""

    kind = ErrorKind.INFRA
