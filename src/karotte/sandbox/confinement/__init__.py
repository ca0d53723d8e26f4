"""Confinement of the student and custody of its submissions (runs inside the sandbox, as root).

See ``docs/confinement.md``. Public API (re-exported from ``karotte``): :func:`collect_submission`,
:func:`save_submission`, :class:`ProtectedStore`.
"""

from __future__ import annotations

from karotte.sandbox.confinement.custody import (
    CustodyOptions,
    collect_submission,
    collect_submission_async,
    save_submission,
)
from karotte.sandbox.confinement.store import ProtectedStore

__all__ = [
    "CustodyOptions",
    "ProtectedStore",
    "collect_submission",
    "collect_submission_async",
    "save_submission",
]
