"""The fake model solves example-task in a local run (`karotte run --runtime local`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from environment.tasks.example_task.task import ANSWER


def _karotte() -> list[str]:
    script = Path(sys.executable).parent / "karotte"
    return [str(script)] if script.exists() else [shutil.which("karotte") or "karotte"]


def test_fake_model_solves_example_task(tmp_path: Path) -> None:
    transcript = tmp_path / "transcript.json"
    try:
        proc = subprocess.run(
            [
                *_karotte(),
                "run",
                "--runtime",
                "local",
                "--fake-model",
                "--task",
                "example-task",
                "--transcript",
                str(transcript),
                "--events",
                "none",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        ANSWER.unlink(missing_ok=True)  # a local run writes into student_data/
    assert transcript.exists(), proc.stderr
    data = json.loads(transcript.read_text())
    completed = [e for e in data["events"] if e["type"] == "task_completed"][-1]
    assert completed["status"] == "passed", proc.stderr
    assert completed["scores"] == [1.0, 1.0]
