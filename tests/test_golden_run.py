"""A scripted two-step run through the real harness, tools and custody; the whole event stream
is pinned by a golden file. Regenerate after an intended change with KAROTTE_UPDATE_GOLDEN=1."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from karotte import EvaluationRunConfig
from karotte.events import Transcript
from karotte.sandbox.entry import run_harness

GOLDEN = Path(__file__).parent / "golden" / "two_steps.events.json"
VOLATILE = {"timestamp", "duration_s", "model_latency_s", "karotte_version"}


def normalise(value: Any, tmp: str) -> Any:
    if isinstance(value, dict):
        return {k: ("<volatile>" if k in VOLATILE else normalise(v, tmp)) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v, tmp) for v in value]
    if isinstance(value, str):
        return value.replace(tmp, "<TMP>")
    return value


def test_two_step_run_matches_the_golden_event_stream(tmp_path: Path, use_environment: Any) -> None:
    use_environment(Path(__file__).parent / "fixtures" / "envs" / "basic")
    answer = tmp_path / "answer.txt"
    config = EvaluationRunConfig(
        run_id="golden",
        task_id="two-steps",
        use_fake_model=True,
        transcript_file=tmp_path / "out" / "transcript.json",
        extra_config={"answer_path": str(answer)},
    )
    completed = run_harness(config, events="none")
    assert completed.status == "passed", completed
    assert completed.scores == [1.0, 1.0]

    transcript = Transcript.model_validate_json(config.transcript_file.read_text())
    assert transcript.status == "passed" and transcript.score == 1.0
    events = normalise([e.model_dump(mode="json") for e in transcript.events], str(tmp_path))
    # the submission was judged from the custody copy, saved as an artifact
    assert (tmp_path / "out" / "golden_artifacts").is_dir()

    if os.environ.get("KAROTTE_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(events, indent=1, sort_keys=True) + "\n")
    expected = json.loads(GOLDEN.read_text())
    assert events == expected
