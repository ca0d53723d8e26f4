"""Custody of submissions. (Being hardened: see the confinement issue.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from karotte.config import EvaluationRunConfig


async def collect_submission_async(config: EvaluationRunConfig, paths: list[str]) -> dict[str, Any]:
    raise NotImplementedError


def collect_submission(config: EvaluationRunConfig, paths: list[str]) -> dict[str, Path]:
    raise NotImplementedError
