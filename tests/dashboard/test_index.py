"""The run index without a web server: which files are runs, their summaries, broken files,
growing event streams, the summary cache and path confinement."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from karotte.host.dashboard.index import RunIndex, parse_transcript_bytes

from .conftest import MISBEHAVIOR_REASON
from .factory import append_jsonl, make_run, run_events


def by_path(index: RunIndex) -> dict[str, object]:
    return {r.path: r for r in index.runs()}


def test_lists_every_run_with_status_scores_and_usage(runs_dir: Path) -> None:
    rows = {r.path: r for r in RunIndex(runs_dir).runs()}
    assert set(rows) == {
        "run-pass.json",
        "run-fail.json",
        "run-cheat.json",
        "run-error.json",
        "batch-2/run-nested.json",
        "broken.json",
        "half-written.json",
        "run-live.events.jsonl",
    }  # not the run config, not manifest.json, nothing inside *_artifacts/
    passed = rows["run-pass.json"]
    assert (passed.status, passed.scores, passed.score) == ("passed", [1.0, 1.0], 1.0)
    assert passed.run_id == "run-pass" and passed.task_id == "fizzbuzz"
    # 2 steps x (2 tool turns of 100/101 in + 10 out, one final turn 200 in + 5 out)
    assert passed.input_tokens == 2 * (100 + 101 + 200)
    assert passed.output_tokens == 2 * (10 + 10 + 5)
    assert passed.duration_s is not None and passed.duration_s > 0
    assert passed.started_at is not None
    failed = rows["run-fail.json"]
    assert (failed.status, failed.scores, failed.score) == ("failed", [1.0, 0.0], 0.5)
    assert failed.model == "anthropic/claude-test"
    cheat = rows["run-cheat.json"]
    assert (cheat.status, cheat.error_kind) == ("failed", "misbehavior")
    assert cheat.misbehavior == [f"step 0: {MISBEHAVIOR_REASON}"]
    error = rows["run-error.json"]
    assert (error.status, error.error_kind, error.scores) == ("error", "model", [0.5, None])
    live = rows["run-live.events.jsonl"]
    assert (live.status, live.kind, live.run_id, live.task_id) == (
        "running",
        "events",
        "run-live",
        "live-task",
    )


def test_broken_and_half_written_files_are_rows_with_the_problem(runs_dir: Path) -> None:
    rows = {r.path: r for r in RunIndex(runs_dir).runs()}
    broken = rows["broken.json"]
    assert broken.status == "malformed" and broken.problem and "not JSON" in broken.problem
    half = rows["half-written.json"]
    # the complete events before the cut are kept, and the header identifies the run
    assert half.run_id == "run-fail" and half.event_count > 3
    assert half.problem and "cut short" in half.problem
    assert half.status == "unfinished"  # transcripts are written whole: a cut one is not live


def test_json_with_invalid_events_keeps_the_valid_ones() -> None:
    data = (
        b'{"version": 1, "run_id": "r", "task_id": "t", "model": "m", "events": ['
        b'{"type": "step_started", "seq": 0, "timestamp": 1.0, "step_index": 0, '
        b'"instructions": "go"}, {"type": "step_started", "seq": 1}, {"type": "bogus"}]}'
    )
    parsed = parse_transcript_bytes(data)
    assert len(parsed.events) == 1 and not parsed.unreadable
    assert parsed.problem and "2 invalid events skipped" in parsed.problem
    assert parse_transcript_bytes(b'{"other": "document"}').not_a_run
    assert parse_transcript_bytes(b"").unreadable


def test_growing_event_stream_is_read_incrementally(tmp_path: Path) -> None:
    events = run_events(run_id="grow", scores=[1.0, 1.0])
    stream = tmp_path / "grow.jsonl"
    append_jsonl(stream, events[:5])
    with stream.open("a") as handle:  # a log line and a half-written event line
        handle.write("harness: starting step 0\n")
        handle.write(events[5].model_dump_json()[:20])
    index = RunIndex(tmp_path)
    summary, parsed = index.load("grow.jsonl")
    assert len(parsed.events) == 5 and summary.status == "running"
    # the writer finishes the line and the run
    with stream.open("a") as handle:
        handle.write(events[5].model_dump_json()[20:] + "\n")
    append_jsonl(stream, events[6:], start_seq=6)
    summary, parsed = index.load("grow.jsonl")
    assert len(parsed.events) == len(events)
    assert (summary.status, summary.scores) == ("passed", [1.0, 1.0])


def test_event_stream_beside_its_finished_transcript_is_listed_once(tmp_path: Path) -> None:
    events = run_events(run_id="dup")
    append_jsonl(tmp_path / "dup.events.jsonl", events)
    make_run(tmp_path, run_id="dup")
    assert [r.path for r in RunIndex(tmp_path).runs()] == ["dup.json"]


def test_summaries_are_cached_by_file_identity(tmp_path: Path) -> None:
    path = make_run(tmp_path, run_id="cached", scores=[1.0])
    index = RunIndex(tmp_path)
    assert index.runs()[0].status == "passed"
    # same size and mtime, other content: the cached summary is used (no re-parse)
    stat = path.stat()
    text = path.read_text()
    path.write_text(text.replace('"passed"', '"failed"'))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert index.runs()[0].status == "passed"
    # a real change (new mtime) is seen
    make_run(tmp_path, run_id="cached", scores=[0.0])
    assert index.runs()[0].status == "failed"


def test_a_run_without_its_final_event_goes_stale(tmp_path: Path) -> None:
    stream = tmp_path / "old.jsonl"
    append_jsonl(stream, run_events(run_id="old", complete=False))
    index = RunIndex(tmp_path)
    assert index.runs()[0].status == "running"
    an_hour_ago = os.stat(stream).st_mtime - 3600
    os.utime(stream, (an_hour_ago, an_hour_ago))
    assert index.runs()[0].status == "unfinished"


@pytest.mark.parametrize(
    "rel",
    ["../secret.txt", "a/../../secret.txt", "/etc/passwd", "", ".", "a//b", "a\\..\\b", "x\x00"],
)
def test_paths_outside_the_root_are_refused(tmp_path: Path, rel: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "secret.txt").write_text("secret")
    with pytest.raises(PermissionError):
        RunIndex(root).resolve(rel)


def test_symlinks_out_of_the_root_are_refused_and_not_listed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    make_run(outside, run_id="foreign")
    (root / "link.json").symlink_to(outside / "foreign.json")
    (root / "linkdir").symlink_to(outside, target_is_directory=True)
    make_run(root, run_id="inside")
    (root / "alias.json").symlink_to(root / "inside.json")
    index = RunIndex(root)
    assert sorted(r.path for r in index.runs()) == ["alias.json", "inside.json"]
    for rel in ("link.json", "linkdir/foreign.json"):
        with pytest.raises(PermissionError):
            index.resolve(rel)
    assert index.resolve("alias.json") == (root / "inside.json").resolve()


def test_artifacts_are_listed_without_symlinks_out(tmp_path: Path) -> None:
    make_run(tmp_path, run_id="arty")
    artifacts = tmp_path / "arty_artifacts"
    (artifacts / "sub").mkdir(parents=True)
    (artifacts / "sub" / "a.txt").write_text("a")
    (artifacts / "evil").symlink_to("/etc/passwd")
    listed = RunIndex(tmp_path).artifacts("arty.json", "arty")
    assert listed == [{"path": "arty_artifacts/sub/a.txt", "name": "sub/a.txt", "size": 1}]
    assert RunIndex(tmp_path).artifacts("arty.json", "../..") == []


def test_a_real_fake_model_run_is_summarised_as_the_harness_ended_it(
    tmp_path: Path, use_environment: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real harness (fake model, real tools and custody): its transcript and its JSON-lines
    event stream both give the row the harness's own result."""
    from karotte import EvaluationRunConfig
    from karotte.sandbox.entry import run_harness

    use_environment(Path(__file__).parents[1] / "fixtures" / "envs" / "basic")
    out = tmp_path / "out"
    config = EvaluationRunConfig(
        run_id="real",
        task_id="two-steps",
        use_fake_model=True,
        transcript_file=out / "real.json",
        extra_config={"answer_path": str(tmp_path / "answer.txt")},
    )
    capsys.readouterr()
    completed = run_harness(config, events="jsonl")
    (out / "stream").mkdir()
    (out / "stream" / "real.events.jsonl").write_text(capsys.readouterr().out)
    rows = {r.path: r for r in RunIndex(out).runs()}
    for path in ("real.json", "stream/real.events.jsonl"):
        row = rows[path]
        assert row.status == completed.status == "passed", path
        assert row.scores == completed.scores and row.score == completed.score, path
        assert row.duration_s == completed.duration_s, path
        assert (row.run_id, row.task_id, row.model) == ("real", "two-steps", "fake/scripted")
        assert row.problem is None
    index = RunIndex(out)
    _, parsed = index.load("real.json")
    _, streamed = index.load("stream/real.events.jsonl")
    assert [e.model_dump() for e in parsed.events] == [e.model_dump() for e in streamed.events]
    assert index.artifacts("real.json", "real") != []  # the custody copy of the submission


def test_names_that_are_not_utf8_are_skipped(tmp_path: Path) -> None:
    make_run(tmp_path, run_id="fine")
    make_run(tmp_path, run_id="odd")
    os.rename(tmp_path / "odd.json", os.fsencode(tmp_path) + b"/odd-\xff.json")
    artifacts = tmp_path / "fine_artifacts"
    artifacts.mkdir()
    (artifacts / "ok.txt").write_text("ok")
    with open(os.fsencode(artifacts) + b"/bad-\xfe.txt", "w") as handle:
        handle.write("bad")
    index = RunIndex(tmp_path)
    assert [r.path for r in index.runs()] == ["fine.json"]
    assert [a["name"] for a in index.artifacts("fine.json", "fine")] == ["ok.txt"]
