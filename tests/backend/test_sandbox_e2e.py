"""A real Docker sandbox (``--network=none``) streams its run to the backend through the
launcher's relay socket (docs/backend.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from runtimes.test_e2e import TASK, _image, env_dir  # noqa: F401 (a session fixture, reused)

from karotte import EvaluationRunConfig
from karotte.events import Transcript
from karotte.host.launcher import Launcher, LaunchOptions
from karotte.sandbox.backend_client import BackendConnection

from .conftest import Backend

pytestmark = [pytest.mark.slow, pytest.mark.requires_docker]


def test_a_docker_sandbox_streams_through_the_relay(
    tmp_path: Path,
    env_dir: Path,  # noqa: F811
    backend: Backend,
    client_token: Path,
) -> None:
    image = _image(env_dir, "docker")
    config = EvaluationRunConfig(
        run_id="in-docker",
        task_id=TASK,
        use_fake_model=True,
        backend_uri=backend.url,
        backend_token_file=client_token,
    )
    options = LaunchOptions(
        runtime="docker", env_dir=env_dir, out_dir=tmp_path / "out", image=image, ui=False
    )
    result = Launcher(config, options).run()
    assert result.statuses == ["passed"], result
    local = Transcript.model_validate_json(result.transcripts[0].read_text())
    conn = BackendConnection(backend.url, client_token)
    remote = Transcript.model_validate_json(
        conn.request("GET", "/v1/runs/in-docker/transcript").content
    )
    assert remote.model_dump(mode="json") == local.model_dump(mode="json")
    started = local.events[0]
    assert started.type == "task_started" and started.sandbox  # it ran in the sandbox
    record = conn.request("GET", "/v1/runs/in-docker").json()
    assert record["sandbox"] == started.sandbox and record["status"] == "passed"
    artifacts = conn.request("GET", "/v1/runs/in-docker/artifacts").json()["artifacts"]
    assert artifacts  # the custody copy, uploaded from inside through a presigned URL
