"""A real Docker sandbox (``--network=none``) streams its run to the backend through the relay
socket: the launcher's part is done here by a small subclass, as docs/backend.md describes
(the launcher itself does not start the relay yet)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from runtimes.test_e2e import TASK, _image, env_dir  # noqa: F401 (a session fixture, reused)

from karotte import EvaluationRunConfig
from karotte.backend.relay import SANDBOX_DIR, HostBackendRelay
from karotte.events import Transcript
from karotte.host.launcher import Launcher, LaunchOptions
from karotte.host.runtimes.base import Mount, SandboxSpec
from karotte.sandbox.backend_client import BackendConnection

from .conftest import Backend

pytestmark = [pytest.mark.slow, pytest.mark.requires_docker]


class RelayLauncher(Launcher):
    def __init__(self, relay: HostBackendRelay, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.relay = relay

    def write_configs(self) -> None:
        for slot in self.slots:
            slot.config = slot.config.model_copy(
                update={"backend_token_file": self.relay.sandbox_token_file()}
            )
        super().write_configs()

    def spec_for(self, *args: Any, **kwargs: Any) -> SandboxSpec:
        spec = super().spec_for(*args, **kwargs)
        spec.mounts.append(Mount(source=self.relay.socket_dir, target=SANDBOX_DIR))
        spec.env.update(self.relay.env())
        return spec


def test_a_docker_sandbox_streams_through_the_relay(
    tmp_path: Path,
    env_dir: Path,  # noqa: F811
    backend: Backend,
    client_token: Path,
) -> None:
    image = _image(env_dir, "docker")
    relay = HostBackendRelay(backend.url, client_token)
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
    try:
        result = RelayLauncher(relay, config, options).run()
    finally:
        relay.close()
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
