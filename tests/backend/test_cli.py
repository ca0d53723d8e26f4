"""``karotte backend serve`` as a real process, a ``karotte run --runtime local`` streaming to
it, and ``karotte backend export`` writing files the dashboard lists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from karotte.events import Transcript

from .conftest import free_port

KAROTTE = str(Path(sys.executable).parent / "karotte")
BASIC = Path(__file__).parents[1] / "fixtures" / "envs" / "basic"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    token = tmp_path / "token"
    token.write_text("cli-token\n")
    token.chmod(0o600)
    db = tmp_path / "runs.sqlite3"
    port = free_port()
    process = subprocess.Popen(
        [
            KAROTTE,
            "backend",
            "serve",
            "--port",
            str(port),
            "--db",
            str(db),
            "--token-file",
            str(token),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(url + "/v1/health").status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            raise AssertionError(f"backend did not start: {process.communicate()[1]}")
        time.sleep(0.1)
    yield url, token, db
    process.terminate()
    process.wait(10)


def test_serve_run_export_and_the_dashboard_lists_it(
    tmp_path: Path, served: tuple[str, Path, Path]
) -> None:
    url, token, db = served
    config = {
        "run_id": "cli-run",
        "task_id": "two-steps",
        "use_fake_model": True,
        "transcript_file": str(tmp_path / "out" / "transcript.json"),
        "extra_config": {"answer_path": str(tmp_path / "answer.txt")},
        "backend_uri": url,
        "backend_token_file": str(token),
    }
    (tmp_path / "rc.json").write_text(json.dumps(config))
    run = subprocess.run(
        [KAROTTE, "run", "--runtime", "local", "--config", str(tmp_path / "rc.json")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(BASIC)},
    )
    assert run.returncode == 0, run.stderr
    local = Transcript.model_validate_json((tmp_path / "out" / "transcript.json").read_text())
    served_json = httpx.get(
        url + "/v1/runs/cli-run/transcript", headers={"Authorization": "Bearer cli-token"}
    )
    assert served_json.status_code == 200
    assert Transcript.model_validate_json(served_json.content) == local

    exported = tmp_path / "collected"
    result = subprocess.run(
        [KAROTTE, "backend", "export", str(exported), "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert Transcript.model_validate_json((exported / "cli-run.json").read_text()) == local
    artifacts = sorted(p.name for p in (exported / "cli-run_artifacts").rglob("*") if p.is_file())
    assert artifacts == sorted(
        p.name for p in (tmp_path / "out" / "cli-run_artifacts").rglob("*") if p.is_file()
    )
    from karotte.host.dashboard.index import RunIndex

    rows = RunIndex(exported).runs()
    assert [(r.run_id, r.status, r.score) for r in rows] == [("cli-run", "passed", 1.0)]


def test_serve_refuses_a_public_address_without_a_token(tmp_path: Path) -> None:
    result = subprocess.run(
        [KAROTTE, "backend", "serve", "--host", "0.0.0.0", "--db", str(tmp_path / "x.db")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "not loopback" in result.stderr and "--token-file" in result.stderr
