"""The dashboard's HTTP API at the ASGI level (starlette's TestClient, no browser), plus the same
refusals against the real uvicorn server with raw requests, and the CLI command."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from karotte.host.dashboard import create_app

from .factory import append_jsonl, make_run, run_events, write_transcript

KAROTTE = [sys.executable, "-c", "from karotte.cli import main; main()"]


def client(root: Path) -> TestClient:
    return TestClient(create_app(root, allowed_hosts={"testserver"}))


def test_runs_api_lists_runs_and_answers_304_when_unchanged(runs_dir: Path) -> None:
    c = client(runs_dir)
    response = c.get("/api/runs")
    assert response.status_code == 200
    body = response.json()
    assert body["root"] == str(runs_dir.resolve())
    statuses = {r["path"]: r["status"] for r in body["runs"]}
    assert statuses["run-pass.json"] == "passed" and statuses["broken.json"] == "malformed"
    etag = response.headers["etag"]
    assert c.get("/api/runs", headers={"If-None-Match": etag}).status_code == 304
    make_run(runs_dir, run_id="run-new")
    again = c.get("/api/runs", headers={"If-None-Match": etag})
    assert again.status_code == 200
    assert "run-new.json" in {r["path"] for r in again.json()["runs"]}


def test_run_api_returns_events_summary_and_artifacts(runs_dir: Path) -> None:
    body = client(runs_dir).get("/api/run", params={"path": "run-pass.json"}).json()
    assert body["summary"]["status"] == "passed"
    assert body["header"]["run_id"] == "run-pass"
    types = [e["type"] for e in body["events"]]
    assert types[0] == "task_started" and types[-1] == "task_completed"
    assert "tool_call_completed" in types
    names = sorted(a["name"] for a in body["artifacts"])
    assert names == ["answer.txt", "nested.json", "page.html", "screen.png"]


def test_events_api_gives_new_events_and_resets_on_a_rewrite(tmp_path: Path) -> None:
    events = run_events(run_id="live", scores=[1.0, 1.0], complete=True)
    path = tmp_path / "live.json"
    write_transcript(path, events[:5])
    c = client(tmp_path)
    first = c.get("/api/run", params={"path": "live.json"}).json()
    assert first["summary"]["status"] == "running" and len(first["events"]) == 5
    last = first["events"][-1]["timestamp"]
    write_transcript(path, events)  # the whole file rewritten with more events
    more = c.get("/api/run/events", params={"path": "live.json", "after": 5, "last": last}).json()
    assert more["reset"] is False and len(more["events"]) == len(events) - 5
    assert more["summary"]["status"] == "passed"
    # rewritten with other events (another run in the same file): the page must reload all
    write_transcript(path, run_events(run_id="other", started_at=1.0))
    reset = c.get("/api/run/events", params={"path": "live.json", "after": 5, "last": last})
    assert reset.json()["reset"] is True
    assert c.get("/api/run/events", params={"path": "live.json", "after": "x"}).status_code == 400


def test_growing_jsonl_run_over_the_api(tmp_path: Path) -> None:
    events = run_events(run_id="stream", complete=True)
    stream = tmp_path / "stream.jsonl"
    append_jsonl(stream, events[:4])
    c = client(tmp_path)
    assert len(c.get("/api/run", params={"path": "stream.jsonl"}).json()["events"]) == 4
    append_jsonl(stream, events[4:], start_seq=4)
    new = c.get("/api/run/events", params={"path": "stream.jsonl", "after": 4}).json()
    assert [e["seq"] for e in new["events"]] == list(range(4, len(events)))


@pytest.mark.parametrize(
    ("url", "status"),
    [
        ("/api/run?path=../outside.json", 403),
        ("/api/run?path=/etc/passwd", 403),
        ("/api/run?path=link.json", 403),
        ("/api/run?path=nothing.json", 404),
        ("/api/run?path=manifest.json", 404),
        ("/files/..%2Foutside.json", 403),
        ("/files/linkdir/outside.json", 403),
        ("/files/link.json", 403),
        ("/files/run-pass_artifacts/missing", 404),
    ],
)
def test_nothing_outside_the_directory_is_served(runs_dir: Path, url: str, status: int) -> None:
    make_run(runs_dir.parent, run_id="outside")
    (runs_dir / "link.json").symlink_to(runs_dir.parent / "outside.json")
    (runs_dir / "linkdir").symlink_to(runs_dir.parent, target_is_directory=True)
    response = client(runs_dir).get(url)
    assert response.status_code == status
    assert b"outside" not in response.content or status != 200
    assert b"task_started" not in response.content


def test_artifacts_are_served_inert(runs_dir: Path) -> None:
    c = client(runs_dir)
    html = c.get("/files/run-pass_artifacts/page.html")
    assert html.status_code == 200
    assert html.headers["content-type"].startswith("text/plain")  # shown, never rendered
    assert html.headers["content-security-policy"].startswith("sandbox")
    assert html.headers["x-content-type-options"] == "nosniff"
    image = c.get("/files/run-pass_artifacts/screen.png")
    assert image.headers["content-type"] == "image/png" and image.content[:4] == b"\x89PNG"
    page = c.get("/")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert "<table" in page.text
    assert c.get("/static/run.js").status_code == 200


def test_requests_for_another_host_name_are_refused(runs_dir: Path) -> None:
    """DNS rebinding: a page on evil.example resolving to 127.0.0.1 must not read runs."""
    c = TestClient(create_app(runs_dir, allowed_hosts={"127.0.0.1", "localhost", "::1"}))
    refused = c.get("/api/runs", headers={"Host": "evil.example:8750"})
    assert refused.status_code == 421
    assert c.get("/api/runs", headers={"Host": "127.0.0.1:8750"}).status_code == 200
    assert c.get("/api/runs", headers={"Host": "[::1]:8750"}).status_code == 200


def raw_get(port: int, target: str, host: str = "127.0.0.1") -> tuple[int, bytes]:
    """A request with the target sent exactly as given (no client-side normalisation)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.putrequest("GET", target, skip_host=True, skip_accept_encoding=True)
    connection.putheader("Host", f"{host}:{port}")
    connection.endheaders()
    response = connection.getresponse()
    body = response.read()
    connection.close()
    return response.status, body


def test_real_server_refuses_traversal_and_symlinks(
    tmp_path: Path, serve: Callable[[Path], Any]
) -> None:
    root = tmp_path / "out"
    root.mkdir()
    make_run(root, run_id="inside")
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    (root / "secret-link.txt").symlink_to(secret)
    (root / "up").symlink_to(tmp_path, target_is_directory=True)
    server = serve(root)
    assert raw_get(server.port, "/files/inside.json")[0] == 200
    for target in (
        "/files/../secret.txt",
        "/files/%2e%2e/secret.txt",
        "/files/..%2fsecret.txt",
        "/files/secret-link.txt",
        "/files/up/secret.txt",
        "/files//etc/passwd",
        "/api/run?path=..%2Fsecret.txt",
        "/api/run?path=up%2Fsecret.txt",
    ):
        status, body = raw_get(server.port, target)
        assert status in (403, 404), (target, status)
        assert b"TOP-SECRET" not in body and b"root:" not in body, target
    assert raw_get(server.port, "/api/runs", host="attacker.example")[0] == 421


def test_cli_serves_on_a_free_loopback_port(runs_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    process = subprocess.Popen(
        [*KAROTTE, "dashboard", str(runs_dir), "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "COLUMNS": "300"},
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, line
        # no display: no browser is started (a terminal one would take over the terminal)
        assert "no display here" in process.stderr.readline()
        port = int(match.group(1))
        status, body = raw_get(port, "/api/runs")
        assert status == 200
        assert "run-pass.json" in {r["path"] for r in json.loads(body)["runs"]}
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=15) in (0, 130)


def test_cli_refuses_a_missing_directory(tmp_path: Path) -> None:
    result = subprocess.run(
        [*KAROTTE, "dashboard", str(tmp_path / "nope"), "--no-browser"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert result.returncode == 2 and "not a directory" in result.stderr


def test_cli_says_when_the_port_is_taken(runs_dir: Path) -> None:
    from karotte.host.dashboard import bind

    busy = bind("127.0.0.1", 0)
    port = busy.getsockname()[1]
    try:
        started = time.monotonic()
        result = subprocess.run(
            [*KAROTTE, "dashboard", str(runs_dir), "--no-browser", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "300"},
        )
        assert time.monotonic() - started < 60
        assert result.returncode == 2 and "cannot listen" in result.stderr
    finally:
        busy.close()
