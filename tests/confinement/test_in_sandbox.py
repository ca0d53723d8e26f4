"""The confinement inside real sandboxes (docker runc and gVisor): attacks end harmlessly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from karotte.sandbox.confinement.requirements import HARNESS_CAPABILITIES, HARNESS_DEVICES

pytestmark = [pytest.mark.requires_docker, pytest.mark.slow]

IMAGE = "karotte/base:bookworm"
ROOT = Path(__file__).resolve().parents[2]
SITE = (
    Path(sys.prefix)
    / "lib"
    / f"python{sys.version_info.major}.{sys.version_info.minor}"
    / "site-packages"
)


def _run(runtime: str) -> dict:  # type: ignore[type-arg]
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode:
        pytest.skip(f"{IMAGE} not built here (karotte base)")
    if (
        runtime == "runsc"
        and "runsc"
        not in subprocess.run(
            ["docker", "info", "--format", "{{json .Runtimes}}"], capture_output=True, text=True
        ).stdout
    ):
        pytest.skip("docker has no runsc runtime")
    argv = [
        "docker",
        "run",
        "--rm",
        f"--runtime={runtime}",
        "--cap-drop=ALL",
        "--memory=3g",
        "--security-opt",
        "no-new-privileges",
        "--tmpfs",
        "/out",
    ]
    argv += [f"--cap-add={cap}" for cap in HARNESS_CAPABILITIES]
    if runtime == "runc":
        argv += [f"--device={dev}" for dev in HARNESS_DEVICES]
    argv += [
        "-v",
        f"{ROOT / 'src'}:/k/src:ro",
        "-v",
        f"{SITE}:/k/site:ro",
        "-v",
        f"{Path(__file__).parent}:/k/tests:ro",
        "-e",
        "PYTHONPATH=/k/src:/k/site",
        "-e",
        f"KAROTTE_SANDBOX={'gvisor' if runtime == 'runsc' else 'runc'}",
        "-e",
        "KAROTTE_DISK_BYTES=67108864",
        IMAGE,
        "python3",
        "/k/tests/sandbox_scenario.py",
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_attacks_in_a_real_sandbox(runtime: str) -> None:
    out = _run(runtime)
    limits = out["limits"]
    assert limits["memory"]["mechanism"] != "none"
    # memory: the hog never finishes
    assert "survived" not in out["memory_hog"]["output"]
    if "canary_error" in out:
        # no firewall in this sandbox: the canary caught the open harness port (infra error)
        assert runtime == "runsc", out["canary_error"]
        assert "127.0.0.1:" in out["canary_error"]
        assert (
            "firewall" in limits["network"].get("detail", "")
            or limits["network"]["backend"] is None
        )
    else:
        assert "reached" not in out["harness_port"]  # the harness's port is closed to the student
    custody = out["custody"]
    assert custody["copy"] in ("right\n", "wrong\n") and custody["stable"]
    assert custody["mode"] == "0o600"
    assert custody["left_processes"] == 0
    assert not custody["shm_left"] and not custody["tmp_left"]
    assert "symbolic link" in out["symlink"]
    assert out["mounts_after"] == []
    if runtime == "runc":
        assert limits["disk"][0]["mechanism"].startswith("loop-mounted")
        assert "No space left" in out["disk_fill"]
        assert limits["namespaces"]["pid"].startswith("per session")
