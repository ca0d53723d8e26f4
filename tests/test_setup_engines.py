"""scripts/setup-engines.sh merges its settings into existing files and is idempotent.

Run against copies of the two configuration files (no packages, no cgroup mounts, no dockerd).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "setup-engines.sh"

pytestmark = pytest.mark.requires_root


def _run(tmp_path: Path) -> str:
    env = {
        **os.environ,
        "KAROTTE_SKIP_APT": "1",
        "KAROTTE_SKIP_CGROUPS": "1",
        "KAROTTE_SKIP_DOCKERD": "1",
        "KAROTTE_CONTAINERS_CONF": str(tmp_path / "containers.conf"),
        "KAROTTE_DAEMON_JSON": str(tmp_path / "daemon.json"),
    }
    proc = subprocess.run(
        ["sh", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_merges_into_existing_files_and_is_idempotent(tmp_path: Path) -> None:
    (tmp_path / "daemon.json").write_text(
        json.dumps(
            {
                "log-driver": "json-file",
                "runtimes": {
                    "runsc": {"path": "/opt/runsc", "runtimeArgs": ["--platform=kvm", "--debug"]},
                    "other": {"path": "/usr/bin/other"},
                },
            }
        )
    )
    (tmp_path / "containers.conf").write_text("[containers]\nlog_size_max = 1000\n\n[network]\n")
    first = _run(tmp_path)
    assert "runsc runtime registered" in first

    daemon = json.loads((tmp_path / "daemon.json").read_text())
    assert daemon["log-driver"] == "json-file"  # kept
    assert daemon["runtimes"]["other"] == {"path": "/usr/bin/other"}  # kept
    runsc = daemon["runtimes"]["runsc"]
    # never --platform=kvm; host unix sockets (the launcher's relays) may be opened
    assert runsc["runtimeArgs"] == ["--network=none", "--host-uds=open", "--debug"]
    assert runsc["path"].endswith("runsc")

    conf = (tmp_path / "containers.conf").read_text()
    assert "log_size_max = 1000" in conf and "[network]" in conf  # kept
    lines = conf.splitlines()
    ulimits = lines.index('default_ulimits = ["nofile=16384:16384", "nproc=8192:8192"]')
    assert lines[ulimits - 1] == "[containers]"  # inside the existing section

    before = ((tmp_path / "daemon.json").read_bytes(), conf)
    second = _run(tmp_path)
    assert "registered" not in second and "already set" in second
    assert (
        (tmp_path / "daemon.json").read_bytes(),
        (tmp_path / "containers.conf").read_text(),
    ) == before


def test_creates_missing_files(tmp_path: Path) -> None:
    _run(tmp_path)
    daemon = json.loads((tmp_path / "daemon.json").read_text())
    assert daemon["runtimes"]["runsc"]["runtimeArgs"] == ["--network=none", "--host-uds=open"]
    assert "default_ulimits" in (tmp_path / "containers.conf").read_text()


def test_invalid_daemon_json_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "daemon.json").write_text("{not json")
    env = {
        **os.environ,
        "KAROTTE_SKIP_APT": "1",
        "KAROTTE_SKIP_CGROUPS": "1",
        "KAROTTE_SKIP_DOCKERD": "1",
        "KAROTTE_CONTAINERS_CONF": str(tmp_path / "containers.conf"),
        "KAROTTE_DAEMON_JSON": str(tmp_path / "daemon.json"),
    }
    proc = subprocess.run(["sh", str(SCRIPT)], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert "not valid JSON" in proc.stderr
    assert (tmp_path / "daemon.json").read_text() == "{not json"
