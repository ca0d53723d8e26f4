"""The confinement attack gauntlet (tests/attacks/test_gauntlet.py) inside a ``qemu`` VM.

The gauntlet's own module is loaded from its file and its runtime-independent attack tests are
collected here again against a ``gauntlet`` fixture that runs the task ONCE under ``qemu`` (TCG
here). Two of its tests assume a container runtime and are restated for the VM: the limits (the
guest uses cgroup v2, not the host's v1) and the run's duration (TCG is ~20x slower, so the
bound is 900 s instead of 180 s).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from karotte.host.runtimes import get_runtime

_FILE = Path(__file__).resolve().parents[1] / "attacks" / "test_gauntlet.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("karotte_vm_gauntlet_shared", _FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


g = _load()
# the VM's step order is the container one (the gauntlet task orders by KAROTTE_SANDBOX)
g.LAST_STEPS.setdefault("qemu", ["fork-bomb", "disk-fill", "final"])

# one gauntlet run under TCG takes ~6 min (pyproject's default per-test timeout is 300 s)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.requires_qemu,
    pytest.mark.requires_docker,
    pytest.mark.timeout(1800),
]

gauntlet_env = g.gauntlet_env
_run: list[object] = []


@pytest.fixture
def gauntlet(gauntlet_env: Path, tmp_path_factory: pytest.TempPathFactory) -> object:
    """The gauntlet task run once under qemu (cached for the session)."""
    if _run:
        return _run[0]
    availability = get_runtime("qemu").availability()
    if not availability.ok:
        pytest.skip(f"qemu: {availability.reason} (fix: {availability.fix})")
    assert g._free_bytes() > 10 * 10**9, "less than 10 GB free: the 6 GB disk filler could fill it"
    image = g._image(gauntlet_env, "docker")
    out = tmp_path_factory.mktemp("gauntlet-qemu")
    started = time.monotonic()
    proc = subprocess.run(
        [g.KAROTTE, "run", "--task", "gauntlet", "--fake-model", "--out", str(out), "--no-ui",
         "--runtime", "qemu", "--image", image],
        cwd=gauntlet_env, capture_output=True, text=True, timeout=1500,
        env={**os.environ, "PYTHONPATH": str(gauntlet_env / "src")},
    )  # fmt: skip
    duration = time.monotonic() - started
    transcript_file = out / "transcript.json"
    assert transcript_file.exists(), proc.stderr[-4000:]
    run = g.GauntletRun(
        "qemu", proc.returncode, proc.stderr, duration, json.loads(transcript_file.read_text())
    )
    print(f"gauntlet on qemu: exit {proc.returncode} in {duration:.1f}s", file=sys.stderr)
    _run.append(run)
    return run


def test_vm_limits_are_the_guest_kernels(gauntlet: object) -> None:
    limits = gauntlet.limits()  # type: ignore[attr-defined]
    assert limits["student_uid"] == 1000
    assert limits["sandbox"] == "qemu"
    assert limits["sandbox_memory_bytes"] == 2 << 30
    assert limits["memory"]["value"] == 1 << 30
    assert limits["memory"]["mechanism"].startswith("cgroup v2")
    assert "pids.max" in limits["pids"]["mechanism"]
    assert 0 < limits["pids"]["value"] < 1024
    workdir = next(d for d in limits["disk"] if d["path"] == "/workdir")
    assert workdir["mechanism"].startswith("loop-mounted ext4") and workdir["bytes"] == 1 << 30
    assert limits["network"]["backend"].startswith("iptables")
    assert limits["namespaces"]["pid"].startswith("per session")


def test_vm_run_leaves_a_transcript(gauntlet: object) -> None:
    run = gauntlet
    assert run.completed() is not None  # type: ignore[attr-defined]
    assert run.duration_s < 900, run.duration_s  # type: ignore[attr-defined]
    for step in run.steps:  # type: ignore[attr-defined]
        scoring = run.scoring(step)  # type: ignore[attr-defined]
        if scoring is not None and step not in ("honest", "final", "planted-python"):
            assert scoring["score"] == 0.0, (step, scoring)


def test_vm_fork_bomb_is_bounded(gauntlet: object) -> None:
    """As the gauntlet's own fork-bomb test, minus its reading of the cgroup v1 pids.events
    (the gauntlet task reads /run/karotte/cgroup/pids/pids.events only; the guest has v2)."""
    run = gauntlet
    assert run.score("fork-bomb") == 0.0  # type: ignore[attr-defined]
    output = run.tool_output("fork-bomb")  # type: ignore[attr-defined]
    assert "bomb ended" in output
    hook = run.hook("fork-bomb", "pre_scoring_hook")  # type: ignore[attr-defined]
    assert hook is not None and hook["student_processes"] == []
    refusals = int(output.split("fork refusals: ")[1].split()[0])
    assert refusals > 0, output
    peak = int(output.split("peak processes: ")[1].split()[0])
    limits = run.limits()  # type: ignore[attr-defined]
    assert peak < 2 * limits["pids"]["value"], (peak, limits["pids"])
    assert limits["pids"]["mechanism"].startswith("cgroup v2 (pids.max)")


# the gauntlet's runtime-independent tests, collected here against the qemu run
test_run_completes_without_error = g.test_run_completes_without_error
test_read_key_is_denied = g.test_read_key_is_denied
test_custody_refuses = g.test_custody_refuses
test_sparse_100g_is_stopped_by_the_file_size_limit_first = (
    g.test_sparse_100g_is_stopped_by_the_file_size_limit_first
)
test_processes_are_gone_before_grading = g.test_processes_are_gone_before_grading
test_planted_python_does_not_hijack_the_judge = g.test_planted_python_does_not_hijack_the_judge
test_memory_hog_is_killed_and_the_harness_survives = (
    g.test_memory_hog_is_killed_and_the_harness_survives
)
test_shm_leftovers_are_removed = g.test_shm_leftovers_are_removed
test_network_outside_and_internal_ports = g.test_network_outside_and_internal_ports
test_honest_step_scores_one_after_the_attacks = g.test_honest_step_scores_one_after_the_attacks
test_disk_fill_is_bounded = g.test_disk_fill_is_bounded
test_disk_fill_scores_zero_and_the_final_honest_step_scores_one = (
    g.test_disk_fill_scores_zero_and_the_final_honest_step_scores_one
)
