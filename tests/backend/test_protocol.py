"""The reference backend's protocol, spoken by the harness's own HTTP client: idempotent event
replay, bearer tokens (rotation, wrong token), presigned artifact uploads."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import httpx
import pytest

from karotte.backend.protocol import CreateRun, EventPage, PresignedUpload, RunRecord
from karotte.events import ErrorOccurred, StepStarted, Transcript
from karotte.sandbox.backend_client import BackendConnection, BackendError, upload_artifact

from .conftest import Backend


def make_run(conn: BackendConnection, run_id: str = "r1") -> None:
    body = CreateRun(run_id=run_id, task_id="t", model="m")
    first = conn.request("POST", "/v1/runs", json=body.model_dump(mode="json"))
    again = conn.request("POST", "/v1/runs", json=body.model_dump(mode="json"))
    assert (first.status_code, again.status_code) == (201, 200)  # creating twice is idempotent


def test_the_same_seq_twice_is_one_event_overwritten(backend: Backend, client_token: Path) -> None:
    conn = BackendConnection(backend.url, client_token)
    make_run(conn)
    first = StepStarted(seq=0, step_index=0, instructions="first version")
    other = StepStarted(seq=1, step_index=0, instructions="second event")
    replay = StepStarted(seq=0, step_index=0, instructions="replayed version")
    conn.request("POST", "/v1/runs/r1/events", json={"events": [first.model_dump(mode="json")]})
    conn.request(
        "POST",
        "/v1/runs/r1/events",
        json={"events": [replay.model_dump(mode="json"), other.model_dump(mode="json")]},
    )
    page = EventPage.model_validate_json(conn.request("GET", "/v1/runs/r1/events").content)
    assert [e.seq for e in page.events] == [0, 1]
    assert isinstance(page.events[0], StepStarted)
    assert page.events[0].instructions == "replayed version"
    record = RunRecord.model_validate_json(conn.request("GET", "/v1/runs/r1").content)
    assert (record.event_count, record.contiguous_seq) == (2, 1)
    transcript = Transcript.model_validate_json(
        conn.request("GET", "/v1/runs/r1/transcript").content
    )
    assert [e.seq for e in transcript.events] == [0, 1]


def test_a_gap_in_seq_is_visible_in_the_run_record(backend: Backend, client_token: Path) -> None:
    conn = BackendConnection(backend.url, client_token)
    make_run(conn)
    events = [
        ErrorOccurred(seq=s, kind="infra", message=str(s)).model_dump(mode="json")
        for s in (0, 1, 3)
    ]
    conn.request("POST", "/v1/runs/r1/events", json={"events": events})
    record = RunRecord.model_validate_json(conn.request("GET", "/v1/runs/r1").content)
    assert (record.event_count, record.last_seq, record.contiguous_seq) == (3, 3, 1)


def test_malformed_events_are_refused_with_the_reason(backend: Backend, client_token: Path) -> None:
    conn = BackendConnection(backend.url, client_token)
    make_run(conn)
    with pytest.raises(BackendError) as caught:
        conn.request("POST", "/v1/runs/r1/events", json={"events": [{"type": "nope", "seq": 0}]})
    assert caught.value.status == 422 and not caught.value.retryable
    assert "EventBatch" in str(caught.value)


def test_token_file_is_reread_on_every_request(backend: Backend, client_token: Path) -> None:
    conn = BackendConnection(backend.url, client_token)
    conn.request("GET", "/v1/runs")
    # the server rotates: the new token is valid, the old one still too (both lines) …
    backend.token_file.write_text("secret-2\nsecret-1\n")
    conn.request("GET", "/v1/runs")
    client_token.write_text("secret-2\n")
    conn.request("GET", "/v1/runs")  # the same connection object picks up the new file
    # … then the old one is dropped: a client still holding it is refused, clearly
    backend.token_file.write_text("secret-2\n")
    client_token.write_text("secret-1\n")
    with pytest.raises(BackendError) as caught:
        conn.request("GET", "/v1/runs")
    assert caught.value.status == 401
    assert f"refused the bearer token from {client_token}" in str(caught.value)
    assert "invalid bearer token" in str(caught.value)
    client_token.write_text("secret-2\n")
    conn.request("GET", "/v1/runs")


def test_requests_without_a_token_are_refused(backend: Backend) -> None:
    response = httpx.get(backend.url + "/v1/runs")
    assert response.status_code == 401 and "missing bearer token" in response.json()["error"]
    assert httpx.get(backend.url + "/v1/health").status_code == 200
    missing = BackendConnection(backend.url, backend.token_file.parent / "absent")
    with pytest.raises(BackendError, match="cannot read the backend token file"):
        missing.request("GET", "/v1/runs")


def test_presigned_upload_round_trip(backend: Backend, client_token: Path) -> None:
    conn = BackendConnection(backend.url, client_token)
    make_run(conn)
    data = b"submission\n" * 1000
    upload_artifact(conn, "r1", "sub/answer.txt", data)
    listing = conn.request("GET", "/v1/runs/r1/artifacts").json()["artifacts"]
    assert [(a["name"], a["size"]) for a in listing] == [("sub/answer.txt", len(data))]
    assert listing[0]["compressed_size"] < len(data)  # stored gzip-compressed
    raw = httpx.get(
        backend.url + "/v1/runs/r1/artifacts/sub/answer.txt",
        headers=conn.headers(),
    )
    assert raw.content == data  # httpx decodes Content-Encoding: gzip


def presign(conn: BackendConnection, name: str, data: bytes) -> PresignedUpload:
    body = {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    answer = conn.request("POST", "/v1/runs/r1/artifacts", json=body)
    return PresignedUpload.model_validate_json(answer.content)


def put(backend: Backend, path: str, data: bytes) -> httpx.Response:
    headers = {"Content-Encoding": "gzip"}
    return httpx.put(backend.url + path, content=gzip.compress(data), headers=headers)


def test_presigned_urls_are_signed_expiring_and_single_purpose(
    backend: Backend, client_token: Path
) -> None:
    conn = BackendConnection(backend.url, client_token)
    make_run(conn)
    data = b"the real artifact"
    url = presign(conn, "a.txt", data).upload_path
    # forged: another name, another size, a tampered signature, no signature at all
    forged_name = url.replace("/a.txt?", "/b.txt?")
    assert put(backend, forged_name, data).status_code == 403
    forged_sig = url[:-4] + ("0000" if not url.endswith("0000") else "1111")
    assert "signature does not match" in put(backend, forged_sig, data).json()["error"]
    assert put(backend, url.split("?")[0], data).status_code == 403
    # the signature binds the content: other bytes (same length) are refused
    assert put(backend, url, b"the fake artifact").status_code == 422
    # a gzip bomb stops at the declared size
    assert put(backend, url, data + b"x" * 10_000_000).status_code == 422
    # the real upload works once; the URL cannot be used again
    assert put(backend, url, data).status_code == 201
    assert put(backend, url, data).status_code == 409
    # expired
    late = presign(conn, "late.txt", data).upload_path
    backend.clock_offset[0] = 301.0
    response = put(backend, late, data)
    assert response.status_code == 403 and "expired" in response.json()["error"]
    names = [a["name"] for a in conn.request("GET", "/v1/runs/r1/artifacts").json()["artifacts"]]
    assert names == ["a.txt"]


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../../b", "a//b", ".", "a\\b"])
def test_artifact_names_must_be_plain_relative_paths(
    backend: Backend, client_token: Path, name: str
) -> None:
    conn = BackendConnection(backend.url, client_token)
    make_run(conn)
    with pytest.raises(BackendError) as caught:
        presign(conn, name, b"x")
    assert caught.value.status == 422
