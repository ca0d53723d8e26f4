"""Whole runs through the real harness (``run_harness``, fake model, real tools and custody),
streamed to the reference backend served by uvicorn; outages made by a proxy that cuts every
connection for a while."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from karotte import EvaluationRunConfig
from karotte.backend.protocol import RunRecord
from karotte.events import ErrorOccurred, Transcript
from karotte.sandbox.backend_client import WARNING_PREFIX, BackendConnection
from karotte.sandbox.entry import run_harness

from .conftest import ENVS, Backend, DroppingProxy

BASIC = Path(__file__).parents[1] / "fixtures" / "envs" / "basic"


def read_local(config: EvaluationRunConfig) -> Transcript:
    return Transcript.model_validate_json(config.transcript_file.read_text())


def read_remote(backend: Backend, token: Path, run_id: str) -> Transcript:
    conn = BackendConnection(backend.url, token)
    return Transcript.model_validate_json(
        conn.request("GET", f"/v1/runs/{run_id}/transcript").content
    )


def warnings(transcript: Transcript) -> list[str]:
    return [
        e.message
        for e in transcript.events
        if isinstance(e, ErrorOccurred) and e.message.startswith(WARNING_PREFIX)
    ]


def dump(transcript: Transcript) -> Any:
    return transcript.model_dump(mode="json")


def test_a_streamed_run_reads_back_equal_to_the_local_transcript(
    tmp_path: Path, use_environment: Any, backend: Backend, client_token: Path
) -> None:
    use_environment(BASIC)
    config = EvaluationRunConfig(
        run_id="streamed",
        task_id="two-steps",
        use_fake_model=True,
        transcript_file=tmp_path / "out" / "transcript.json",
        extra_config={"answer_path": str(tmp_path / "answer.txt")},
        backend_uri=backend.url,
        backend_token_file=client_token,
    )
    completed = run_harness(config, events="none")
    assert completed.status == "passed"
    local = read_local(config)
    assert warnings(local) == []
    remote = read_remote(backend, client_token, "streamed")
    assert dump(remote) == dump(local)
    assert len(local.events) > 10
    conn = BackendConnection(backend.url, client_token)
    record = RunRecord.model_validate_json(conn.request("GET", "/v1/runs/streamed").content)
    assert (record.status, record.score, record.error_kind) == ("passed", 1.0, None)
    assert record.usage == completed.usage
    # the submission custody saved is uploaded through a presigned URL, gzip-compressed
    local_artifacts = sorted(
        p.relative_to(config.artifacts_dir).as_posix()
        for p in config.artifacts_dir.rglob("*")
        if p.is_file()
    )
    assert local_artifacts
    listed = conn.request("GET", "/v1/runs/streamed/artifacts").json()["artifacts"]
    assert [a["name"] for a in listed] == local_artifacts
    for name in local_artifacts:
        raw = conn.client.get(f"/v1/runs/streamed/artifacts/{name}", headers=conn.headers())
        assert raw.content == (config.artifacts_dir / name).read_bytes()


def cut_after(delay_s: float, proxy: DroppingProxy, outage_s: float) -> None:
    """Cut the backend off ``delay_s`` into the run, for ``outage_s``."""
    timer = threading.Timer(delay_s, proxy.drop_for, args=(outage_s,))
    timer.daemon = True
    timer.start()


def slow_config(tmp_path: Path, url: str, token: Path, **extra: Any) -> EvaluationRunConfig:
    fields: dict[str, Any] = {
        "run_id": "slow",
        "task_id": "slow",
        "use_fake_model": True,
        "transcript_file": tmp_path / "out" / "transcript.json",
        "extra_config": {"pause_s": 0.4, "calls": 6},
        "backend_uri": url,
        "backend_token_file": token,
    }
    fields.update(extra)
    return EvaluationRunConfig(**fields)


def test_an_outage_mid_run_is_bridged_and_caught_up_in_order(
    tmp_path: Path,
    use_environment: Any,
    backend: Backend,
    proxy: DroppingProxy,
    client_token: Path,
) -> None:
    use_environment(ENVS / "slow")
    config = slow_config(tmp_path, proxy.url, client_token, backend_retry_budget_s=30.0)
    # the backend goes dark 0.8 s into the run, for 1.5 s, while the run goes on
    cut_after(0.8, proxy, 1.5)
    started = time.monotonic()
    completed = run_harness(config, events="none")
    elapsed = time.monotonic() - started
    assert completed.status == "passed"
    assert proxy.dropped >= 1
    local = read_local(config)
    assert [e.seq for e in local.events] == list(range(len(local.events)))
    notes = warnings(local)
    assert any("cannot deliver events" in n and "the run goes on" in n for n in notes), notes
    assert any("resumed" in n and "caught up in order" in n for n in notes), notes
    remote = read_remote(backend, client_token, "slow")
    # everything up to the end is there, in order, identical (a warning recorded after the
    # last delivery may only be local)
    assert remote.status == "passed"
    assert dump(remote)["events"] == dump(local)["events"][: len(remote.events)]
    assert any(e.type == "task_completed" for e in remote.events)
    assert elapsed < 20


def test_an_outage_longer_than_the_budget_records_the_gap(
    tmp_path: Path,
    use_environment: Any,
    backend: Backend,
    proxy: DroppingProxy,
    client_token: Path,
) -> None:
    use_environment(ENVS / "slow")
    config = slow_config(
        tmp_path,
        proxy.url,
        client_token,
        backend_retry_budget_s=1.0,
        backend_flush_timeout_s=2.0,
    )
    cut_after(0.8, proxy, 3600)
    started = time.monotonic()
    completed = run_harness(config, events="none")
    elapsed = time.monotonic() - started
    assert completed.status == "passed"  # the outage never fails the run
    local = read_local(config)
    assert local.completed() is not None and local.status == "passed"
    notes = warnings(local)
    assert any("gave up after" in n for n in notes), notes
    assert any(
        "were not delivered" in n and "the local transcript has them all" in n for n in notes
    )
    remote = read_remote(backend, client_token, "slow")
    assert 0 < len(remote.events) < len(local.events)
    assert dump(remote)["events"] == dump(local)["events"][: len(remote.events)]
    assert elapsed < 15  # bounded: the run does not wait for the backend


def test_a_backend_back_by_the_end_gets_everything_after_giving_up(
    tmp_path: Path,
    use_environment: Any,
    backend: Backend,
    proxy: DroppingProxy,
    client_token: Path,
) -> None:
    use_environment(ENVS / "slow")
    config = slow_config(
        tmp_path, proxy.url, client_token, backend_retry_budget_s=0.5, backend_flush_timeout_s=10
    )
    cut_after(0.8, proxy, 1.2)
    assert run_harness(config, events="none").status == "passed"
    local = read_local(config)
    notes = warnings(local)
    assert any("gave up after" in n for n in notes), notes
    remote = read_remote(backend, client_token, "slow")
    assert remote.status == "passed"
    assert any(e.type == "task_completed" for e in remote.events)
    assert dump(remote)["events"] == dump(local)["events"][: len(remote.events)]


def test_a_stopped_and_restarted_backend_catches_up(
    tmp_path: Path, use_environment: Any, backend: Backend, client_token: Path
) -> None:
    use_environment(ENVS / "slow")
    config = slow_config(tmp_path, backend.url, client_token, backend_retry_budget_s=30.0)

    def bounce() -> None:
        time.sleep(0.8)
        backend.stop()
        time.sleep(1.0)
        backend.start()

    bouncer = threading.Thread(target=bounce)
    bouncer.start()
    completed = run_harness(config, events="none")
    bouncer.join()
    assert completed.status == "passed"
    local = read_local(config)
    assert any("cannot deliver events" in n for n in warnings(local)), warnings(local)
    remote = read_remote(backend, client_token, "slow")
    assert dump(remote)["events"] == dump(local)["events"][: len(remote.events)]
    assert remote.status == "passed"


def test_a_wrong_token_is_recorded_clearly_and_the_run_goes_on(
    tmp_path: Path, use_environment: Any, backend: Backend, client_token: Path
) -> None:
    use_environment(ENVS / "slow")
    client_token.write_text("not-the-token\n")
    config = slow_config(
        tmp_path,
        backend.url,
        client_token,
        extra_config={"pause_s": 0.1, "calls": 1},
        backend_retry_budget_s=0.5,
        backend_flush_timeout_s=1.0,
    )
    completed = run_harness(config, events="none")
    assert completed.status == "passed"
    notes = warnings(read_local(config))
    assert any(f"refused the bearer token from {client_token} (HTTP 401" in n for n in notes), notes
    backend_token = backend.token_file.read_text().strip()
    conn = BackendConnection(backend.url, tmp_path / "good")
    (tmp_path / "good").write_text(backend_token)
    assert conn.request("GET", "/v1/runs").json()["runs"] == []


def test_no_backend_at_all_is_bounded(tmp_path: Path, use_environment: Any) -> None:
    use_environment(ENVS / "slow")
    from .conftest import free_port

    config = slow_config(
        tmp_path,
        f"http://127.0.0.1:{free_port()}",
        None,  # type: ignore[arg-type]
        extra_config={"pause_s": 0.1, "calls": 1},
        backend_retry_budget_s=1.0,
        backend_flush_timeout_s=1.0,
    )
    started = time.monotonic()
    assert run_harness(config, events="none").status == "passed"
    assert time.monotonic() - started < 8
    notes = warnings(read_local(config))
    assert any("unreachable" in n for n in notes), notes
