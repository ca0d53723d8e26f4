"""Karotte: robust reinforcement-learning environments for LLM agents.

The public API is re-exported here; everything else is private to the package.
"""

from karotte._version import __version__
from karotte.config import EvaluationRunConfig
from karotte.errors import ErrorKind, StudentMisbehaviorError
from karotte.sandbox.confinement.custody import collect_submission, save_submission
from karotte.sandbox.confinement.store import ProtectedStore
from karotte.task import Hardware, Step, Task

__all__ = [
    "ErrorKind",
    "EvaluationRunConfig",
    "Hardware",
    "ProtectedStore",
    "Step",
    "StudentMisbehaviorError",
    "Task",
    "__version__",
    "collect_submission",
    "save_submission",
]
