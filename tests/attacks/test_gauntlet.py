"""The attack gauntlet: every attack of the confinement issue as a real run in a real sandbox.

An environment made by ``karotte create-env`` (default template) gets the ``gauntlet`` task of
``tests/fixtures/envs/gauntlet`` (one attack per step, scripted with the fake model, honest steps
in between) and a Containerfile that puts student-writable dirs first on ``PATH`` (as a careless
author would). It is built once per session and run ONCE per runtime; the tests then read that
run's transcript. See docs/attacks.md for the table of attacks, mechanisms and findings.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from karotte.host.runtimes import disk_delegation, get_runtime

pytestmark = pytest.mark.slow

KAROTTE = str(Path(sys.executable).parent / "karotte")
OVERLAY = Path(__file__).resolve().parents[1] / "fixtures" / "envs" / "gauntlet"
TAG = "karotte-test/gauntlet:latest"
KEY = (OVERLAY / "root_data" / "gauntlet" / "key.txt").read_text().strip()
# the steps of the task, in order (tests/fixtures/envs/gauntlet/.../attacks.py): the attacks
# that end the run on a runtime today come last, that runtime's own one at the very end
FIRST_STEPS = [
    "read-key",
    "symlink-key",
    "symlink-parent",
    "fifo",
    "dev-zero",
    "sparse",
    "deep-bomb",
    "wide-bomb",
    "swap",
    "chain",
    "planted-python",
    "memory-hog",
    "shm",
    "network",
    "honest",
]
LAST_STEPS = {
    "docker": ["fork-bomb", "disk-fill", "final"],
    "podman": ["fork-bomb", "disk-fill", "final"],
    "docker:gvisor": ["disk-fill", "fork-bomb", "final"],
}
RUNTIMES = [
    pytest.param("docker", marks=pytest.mark.requires_docker, id="docker"),
    pytest.param("docker:gvisor", marks=pytest.mark.requires_gvisor, id="docker:gvisor"),
    pytest.param("podman", marks=pytest.mark.requires_podman, id="podman"),
]
PATH_PATCH = (
    "# gauntlet: a careless author puts student-writable dirs first on PATH, and data on\n"
    "# PYTHONPATH; the root harness must not be affected\n"
    "ENV PATH=/workdir/bin:/workdir/.venv/bin:${PATH} PYTHONPATH=/workdir/data\n"
    "WORKDIR /workdir\n"
)

# ---- findings (see docs/attacks.md); strict xfails flip to failures once fixed --------------


@dataclass
class GauntletRun:
    runtime: str
    returncode: int
    stderr: str
    duration_s: float
    transcript: dict[str, Any]

    @property
    def events(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = self.transcript["events"]
        return events

    @property
    def steps(self) -> list[str]:
        return FIRST_STEPS + LAST_STEPS[self.runtime]

    def index(self, step: str) -> int:
        return self.steps.index(step)

    def scoring(self, step: str) -> dict[str, Any] | None:
        i = self.index(step)
        return next(
            (e for e in self.events if e["type"] == "scoring" and e["step_index"] == i), None
        )

    def hook(self, step: str, hook: str) -> dict[str, Any] | None:
        i = self.index(step)
        event = next(
            (
                e
                for e in self.events
                if e["type"] == "hook_completed" and e["step_index"] == i and e["hook"] == hook
            ),
            None,
        )
        assert event is not None, f"no {hook} of step {step}: {self.errors()}"
        result: dict[str, Any] | None = event["result"]
        return result

    def tool_output(self, step: str) -> str:
        i = self.index(step)
        return "\n".join(
            e["output"]
            for e in self.events
            if e["type"] == "tool_call_completed" and e["step_index"] == i
        )

    def limits(self) -> dict[str, Any]:
        event = next(e for e in self.events if e["type"] == "limits_applied")
        limits: dict[str, Any] = event["limits"]
        return limits

    def completed(self) -> dict[str, Any] | None:
        return next((e for e in self.events if e["type"] == "task_completed"), None)

    def errors(self) -> list[str]:
        return [str(e["message"])[:500] for e in self.events if e["type"] == "error"]

    def score(self, step: str) -> float:
        scoring = self.scoring(step)
        assert scoring is not None, f"step {step} was not scored: {self.errors()}"
        value: float = scoring["score"]
        return value

    def misbehavior(self, step: str) -> str:
        scoring = self.scoring(step)
        assert scoring is not None, f"step {step} was not scored: {self.errors()}"
        return str(scoring["metadata"].get("misbehavior", ""))


def _available(name: str) -> None:
    availability = get_runtime(name).availability()
    if not availability.ok:
        pytest.skip(f"{name}: {availability.reason} (fix: {availability.fix})")


@pytest.fixture(scope="session")
def gauntlet_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``karotte create-env`` (default template) + the gauntlet overlay + the PATH patch."""
    target = tmp_path_factory.mktemp("gauntlet") / "gauntlet-env"
    proc = subprocess.run(
        [KAROTTE, "create-env", str(target)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    for part in ("src", "root_data", "shared_data"):
        shutil.copytree(OVERLAY / part, target / part, dirs_exist_ok=True)
    containerfile = target / "Containerfile"
    text = containerfile.read_text()
    assert "\nWORKDIR /workdir\n" in text
    containerfile.write_text(text.replace("\nWORKDIR /workdir\n", "\n" + PATH_PATCH, 1))
    return target


_images_built: set[str] = set()
_runs: dict[str, GauntletRun] = {}


def _image(env_dir: Path, runtime: str) -> str:
    """Build once per engine per session (gVisor runs docker's images)."""
    engine = "podman" if runtime == "podman" else "docker"
    if engine not in _images_built:
        proc = subprocess.run(
            [KAROTTE, "build", "--runtime", engine, "--tag", TAG, str(env_dir)],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        _images_built.add(engine)
    return TAG


def _free_bytes() -> int:
    stores = [p for p in ("/var/lib/docker", "/var/lib/containers") if Path(p).exists()]
    return min(shutil.disk_usage(p).free for p in stores or ["/"])


@pytest.fixture(params=RUNTIMES)
def gauntlet(
    request: pytest.FixtureRequest,
    gauntlet_env: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> GauntletRun:
    """The gauntlet task run once per runtime (cached for the session)."""
    name: str = request.param
    if name in _runs:
        return _runs[name]
    _available(name)
    # the disk filler writes at most 6 GB: never more than the free space
    assert _free_bytes() > 10 * 10**9, "less than 10 GB free: the 6 GB disk filler could fill it"
    image = _image(gauntlet_env, name)
    out = tmp_path_factory.mktemp(f"gauntlet-{name.replace(':', '-')}")
    started = time.monotonic()
    proc = subprocess.run(
        [
            KAROTTE,
            "run",
            "--task",
            "gauntlet",
            "--fake-model",
            "--out",
            str(out),
            "--no-ui",
            "--runtime",
            name,
            "--image",
            image,
        ],
        cwd=gauntlet_env,
        capture_output=True,
        text=True,
        timeout=600,
        # the launcher reads the task's required_hardware (2 GiB, 1 GiB disk, 1024 processes)
        # from the environment package, as it does when run from the environment's own venv
        env={**os.environ, "PYTHONPATH": str(gauntlet_env / "src")},
    )
    duration = time.monotonic() - started
    transcript_file = out / "transcript.json"
    assert transcript_file.exists(), proc.stderr[-4000:]
    run = GauntletRun(
        name, proc.returncode, proc.stderr, duration, json.loads(transcript_file.read_text())
    )
    _runs[name] = run
    print(f"gauntlet on {name}: exit {proc.returncode} in {duration:.1f}s", file=sys.stderr)
    return run


def _gvisor(run: GauntletRun) -> bool:
    return run.runtime == "docker:gvisor"


# ---- the run as a whole ----------------------------------------------------------------------
def test_limits_applied_names_the_mechanisms(gauntlet: GauntletRun) -> None:
    limits = gauntlet.limits()
    assert limits["student_uid"] == 1000
    # the task's required_hardware reached the sandbox: 2 GiB sandbox, 1 GiB kept for the harness
    assert limits["sandbox_memory_bytes"] == 2 << 30
    assert limits["memory"]["value"] == 1 << 30
    # the student's process limit keeps a reserve below the sandbox's 1024 for the harness
    assert 0 < limits["pids"]["value"] < 1024
    assert limits["namespaces"]["pid"].startswith("per session")
    assert limits["namespaces"]["ipc"].startswith("per session")
    assert limits["network"]["mode"] == "strict"
    if _gvisor(gauntlet):
        # documented gVisor gaps: its memory cgroup does not enforce (watchdog), no iptables; no
        # loop devices, so the launcher loop-mounts the student's home and /var/tmp on the host
        assert "watchdog" in limits["memory"]["mechanism"]
        assert "RLIMIT_NPROC" in limits["pids"]["mechanism"]
        disks = {d["path"]: d for d in limits["disk"]}
        assert set(disks) == {"/workdir", "/var/tmp"}, disks
        assert all(d["mechanism"] == disk_delegation.MECHANISM for d in disks.values())
        assert disks["/workdir"]["bytes"] == 1 << 30
        assert limits["network"]["backend"] is None
        assert limits["network"]["canary"]["192.0.2.1:80"].startswith("blocked")
    else:
        assert limits["memory"]["mechanism"].startswith("cgroup v1")
        assert "pids.max" in limits["pids"]["mechanism"]
        workdir = next(d for d in limits["disk"] if d["path"] == "/workdir")
        assert workdir["mechanism"].startswith("loop-mounted ext4")
        assert workdir["bytes"] == 1 << 30
        assert limits["network"]["backend"].startswith("iptables")


def test_run_completes_without_error(gauntlet: GauntletRun) -> None:
    completed = gauntlet.completed()
    assert completed is not None
    assert gauntlet.errors() == []
    assert completed["status"] == "failed" and completed["error_kind"] == "misbehavior"
    assert gauntlet.returncode == 0, gauntlet.stderr[-3000:]
    assert len(completed["scores"]) == len(gauntlet.steps)
    assert None not in completed["scores"]


def test_run_leaves_a_transcript_and_is_short(gauntlet: GauntletRun) -> None:
    assert gauntlet.completed() is not None
    assert gauntlet.transcript["events"][0]["type"] == "task_started"
    assert gauntlet.transcript["events"][0]["step_count"] == len(gauntlet.steps)
    assert gauntlet.duration_s < 180, gauntlet.duration_s
    # no attack step scored: the key never reached a judge
    for step in gauntlet.steps:
        scoring = gauntlet.scoring(step)
        if scoring is not None and step not in ("honest", "final"):
            if step == "planted-python":
                continue  # see test_planted_python_does_not_hijack_the_judge
            assert scoring["score"] == 0.0, (step, scoring)


# ---- one test per attack ---------------------------------------------------------------------
def test_read_key_is_denied(gauntlet: GauntletRun) -> None:
    assert gauntlet.score("read-key") == 0.0
    output = gauntlet.tool_output("read-key")
    assert "Permission denied" in output or "permission denied" in output.lower()
    assert KEY not in output


@pytest.mark.parametrize(
    ("step", "reason"),
    [
        ("symlink-key", "is a symbolic link (to /root_data/gauntlet/key.txt)"),
        ("symlink-parent", "parent directory /workdir/data/keydir is a symbolic link"),
        ("fifo", "is a FIFO (named pipe), not a regular file"),
        ("dev-zero", "is a symbolic link (to /dev/zero)"),
        ("sparse", "bytes, more than 268435456"),
        ("deep-bomb", "directory tree is deeper than 32 levels"),
        ("wide-bomb", "more than 10000 files and directories"),
    ],
)
def test_custody_refuses(gauntlet: GauntletRun, step: str, reason: str) -> None:
    assert gauntlet.score(step) == 0.0
    assert reason in gauntlet.misbehavior(step)


def test_sparse_100g_is_stopped_by_the_file_size_limit_first(gauntlet: GauntletRun) -> None:
    # RLIMIT_FSIZE (16 GiB) refuses the 100 GB truncate; the 15 GB fallback reaches custody
    output = gauntlet.tool_output("sparse")
    assert "File size limit exceeded" in output and "rc=153" in output, output
    assert "is 16106127360 bytes" in gauntlet.misbehavior("sparse")


@pytest.mark.parametrize("step", ["swap", "chain"])
def test_processes_are_gone_before_grading(gauntlet: GauntletRun, step: str) -> None:
    """The key is leaked to a student-readable file after custody: a surviving process (or a
    re-forking chain) would copy it into the answer. Custody killed them all first."""
    assert gauntlet.score(step) == 0.0
    hook = gauntlet.hook(step, "pre_scoring_hook")
    assert hook is not None
    assert hook["student_processes"] == []
    assert hook["original_swapped"] is False
    assert hook["original"] == "draft\n"


def test_planted_python_does_not_hijack_the_judge(gauntlet: GauntletRun) -> None:
    """The image puts /workdir/bin and the student venv first on PATH and /workdir/data on
    PYTHONPATH: the harness must have dropped them before any student code ran."""
    hook = gauntlet.hook("planted-python", "post_hook")
    assert hook is not None
    assert hook["hijacked_as_root"] == []
    env = hook["harness_env"]
    assert "/workdir" not in env["PATH"]
    assert env["PYTHONPATH"] is None
    assert env["PYTHONSAFEPATH"] == "1"
    assert gauntlet.score("planted-python") == 0.0


def test_fork_bomb_is_bounded(gauntlet: GauntletRun) -> None:
    assert gauntlet.score("fork-bomb") == 0.0
    output = gauntlet.tool_output("fork-bomb")
    assert "bomb ended" in output
    hook = gauntlet.hook("fork-bomb", "pre_scoring_hook")
    assert hook is not None and hook["student_processes"] == []
    if _gvisor(gauntlet):
        # gVisor has no host cgroup for the student: RLIMIT_NPROC plus gVisor's own pids.max
        # (runsc 2024 emulates cgroup v1 and enforces pids; the 2022 build had no cgroups, so the
        # watchdog did it) bound the bomb, and the sandbox survived (the launcher gives runsc's
        # host pids cgroup room for its per-task overhead)
        mechanism = gauntlet.limits()["pids"]["mechanism"]
        assert "pids.max" in mechanism or "watchdog" in mechanism, mechanism
        assert "status -9" in output or "fork refusals: " in output, output
        return
    # forks were refused (EAGAIN from RLIMIT_NPROC or the pids cgroup), the bomb stayed near the
    # student's limit (the sampler's racy /proc count overshoots a little under churn)
    refusals = int(output.split("fork refusals: ")[1].split()[0])
    assert refusals > 0, output
    peak = int(output.split("peak processes: ")[1].split()[0])
    limit = gauntlet.limits()["pids"]["value"]
    assert peak < 2 * limit, (peak, limit)
    if not _gvisor(gauntlet):
        assert hook["pids_events"] is not None and hook["pids_events"].startswith("max ")


def test_memory_hog_is_killed_and_the_harness_survives(gauntlet: GauntletRun) -> None:
    assert gauntlet.score("memory-hog") == 0.0
    output = gauntlet.tool_output("memory-hog")
    assert "survived" not in output
    assert "exit=137" in output or "Killed" in output or "shell had ended" in output, output
    # the next step ran normally: the harness and the tools survived
    assert gauntlet.scoring("shm") is not None


def test_shm_leftovers_are_removed(gauntlet: GauntletRun) -> None:
    assert gauntlet.score("shm") == 0.0
    assert "shmid" in gauntlet.tool_output("shm")
    hook = gauntlet.hook("shm", "post_hook")
    assert hook is not None
    assert hook["dev_shm_file_left"] is False
    assert hook["dev_shm_student_files"] == []
    if _gvisor(gauntlet):
        # gVisor has no /proc/sysvipc: the harness-side view is unavailable (recorded as such);
        # the next session's `ipcs -m` below is the check there
        assert hook["sysv_segments_left"][0].startswith("unreadable")
    else:
        assert hook["sysv_segments_left"] == []
    assert hook["student_processes"] == []
    # the next session sees neither the file nor the segment
    later = gauntlet.tool_output("honest")
    assert "gauntlet-leftover" not in later
    assert "0x4b415254" not in later


def test_network_outside_and_internal_ports(gauntlet: GauntletRun) -> None:
    assert gauntlet.score("network") == 0.0
    output = gauntlet.tool_output("network")
    assert "('192.0.2.1', 80) -> error" in output, output
    assert KEY not in output
    hook = gauntlet.hook("network", "post_hook")
    assert hook is not None
    # the pre_hook's own root probe was served; every other connection was refused
    log = hook["service_log"]
    assert log[0] == {"peer_uid": 0, "served_key": True}
    assert len(log) >= 2 and all(not entry["served_key"] for entry in log[1:]), log
    if not _gvisor(gauntlet):
        assert {entry["peer_uid"] for entry in log[1:]} == {1000}
    # loopback is open to the student by design ("strict"): it reached the service, which
    # refused it; the harness itself listens on no port the student could find
    assert "('127.0.0.1', 18555) -> connected, got b'denied\\n'" in output


def test_honest_step_scores_one_after_the_attacks(gauntlet: GauntletRun) -> None:
    assert gauntlet.score("honest") == 1.0
    hook = gauntlet.hook("honest", "pre_scoring_hook")
    assert hook is not None
    assert hook["student_processes"] == []
    assert hook["dev_shm_student_files"] == []
    assert hook["tmp_student_files"] == []
    assert hook["sysv_segments_left"] == [] or _gvisor(gauntlet)


def test_disk_fill_is_bounded(gauntlet: GauntletRun) -> None:
    output = gauntlet.tool_output("disk-fill")
    assert "written " in output, output
    written = int(output.split("written ")[1].split()[0])
    assert "No space left on device" in output
    quota = next(d for d in gauntlet.limits()["disk"] if d["path"] == "/workdir")
    assert written <= quota["bytes"] + (64 << 20)
    if _gvisor(gauntlet):
        # no loop devices in gVisor: the launcher made the quota on the host
        assert quota["mechanism"] == disk_delegation.MECHANISM, quota
        assert "statvfs" in quota["detail"]
    else:
        assert quota["mechanism"].startswith("loop-mounted ext4"), quota


def test_disk_fill_scores_zero_and_the_final_honest_step_scores_one(
    gauntlet: GauntletRun,
) -> None:
    assert gauntlet.score("disk-fill") == 0.0
    assert gauntlet.score("final") == 1.0
