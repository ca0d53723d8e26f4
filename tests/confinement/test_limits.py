"""Resource limits, really hit by a student process on this host (as root, throwaway uid)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from student_helpers import as_student, spawn_student, wait_until

from karotte.sandbox.confinement.demote import Identity as StudentIdentity
from karotte.sandbox.confinement.limits import (
    AppliedLimits,
    LimitsOptions,
    apply_limits,
    sandbox_memory_bytes,
    student_memory_bytes,
)
from karotte.sandbox.confinement.processes import processes_of_uid

pytestmark = pytest.mark.requires_root

MIB = 1 << 20
STUDENT_PY = "/usr/bin/python3"  # the student cannot run the root venv


@pytest.fixture
def limits(student: StudentIdentity) -> AppliedLimits:
    applied = apply_limits(student, LimitsOptions(memory_bytes=128 * MIB, pids=64))
    yield applied  # type: ignore[misc]
    applied.close()
    if applied.cgroup is not None and applied.cgroup.created:
        for path in applied.cgroup._dirs():
            assert not path.exists(), f"cgroup {path} not removed"


def _require_cgroup(applied: AppliedLimits, controller: str) -> None:
    if applied.cgroup is None or controller not in applied.cgroup.controllers():
        pytest.skip(f"no writable {controller} cgroup here: {applied.report.cgroup_source}")


def test_report_names_the_mechanism_of_each_limit(limits: AppliedLimits) -> None:
    report = limits.report
    payload = report.event_payload()
    assert payload["student_uid"] == limits.identity.uid
    assert report.memory.value == 128 * MIB
    if limits.cgroup is not None and "memory" in limits.cgroup.controllers():
        assert report.memory.mechanism.startswith("cgroup")
        assert report.watchdog == [] or "memory" not in report.watchdog
    else:
        assert "watchdog" in report.memory.mechanism
    assert "RLIMIT_NPROC" in report.pids.mechanism
    assert report.core_dumps.mechanism == "RLIMIT_CORE"


def test_student_memory_keeps_a_gib_for_the_harness() -> None:
    assert student_memory_bytes() <= max(
        sandbox_memory_bytes() - (1 << 30), sandbox_memory_bytes() // 2
    )


def test_memory_hog_is_killed_and_the_harness_survives(
    student: StudentIdentity, limits: AppliedLimits
) -> None:
    _require_cgroup(limits, "memory")
    hog = (
        f'{STUDENT_PY} -S -c "b=[]\n'
        "while True: b.append(bytearray(8 << 20)); b[-1][::4096]=b'x'*(len(b[-1])//4096)\""
    )
    started = time.monotonic()
    result = as_student(student, hog, before=limits.preexec, timeout=60)
    assert result.returncode in (-9, 137), (result.returncode, result.stderr[-500:])
    assert time.monotonic() - started < 30
    assert limits.cgroup is not None and limits.cgroup.oom_kills() >= 1
    assert os.path.exists(f"/proc/{os.getpid()}")  # we are alive


def test_tmpfs_files_count_against_the_student_memory(
    student: StudentIdentity, limits: AppliedLimits
) -> None:
    _require_cgroup(limits, "memory")
    target = f"/dev/shm/karotte-test-{student.uid}"
    try:
        result = as_student(
            student,
            f"dd if=/dev/zero of={target} bs=1M count=400 2>&1; echo rc=$?",
            before=limits.preexec,
            timeout=60,
        )
        written = os.path.getsize(target) if os.path.exists(target) else 0
        # the write fails (ENOSPC/ENOMEM) or the writer is OOM-killed near the 128 MiB limit
        assert written <= 140 * MIB, (written, result.stdout[-300:], result.returncode)
    finally:
        if os.path.exists(target):
            os.unlink(target)


def test_fork_bomb_is_stopped_by_the_pids_limit(
    student: StudentIdentity, limits: AppliedLimits
) -> None:
    _require_cgroup(limits, "pids")
    # a bounded bomb: each process forks until fork fails; we stop it after a few seconds
    bomb = spawn_student(
        student,
        f"{STUDENT_PY} -S -c 'import os,time\nwhile True:\n"
        " try: os.fork()\n except OSError: time.sleep(0.01)'",
        before=limits.preexec,
    )
    try:
        time.sleep(3)
        count = len(processes_of_uid(student.uid))
        assert count <= 64, f"{count} processes despite pids limit 64"
        assert count > 8, "the bomb did not start"
        assert limits.cgroup is not None and len(limits.cgroup.pids()) <= 64
    finally:
        bomb.kill()
        limits.cgroup.kill_all() if limits.cgroup else None
        assert wait_until(lambda: not processes_of_uid(student.uid), 10)


def test_rlimits_and_oom_score_adj_reach_the_student(
    student: StudentIdentity, limits: AppliedLimits
) -> None:
    result = as_student(
        student,
        "cat /proc/self/oom_score_adj; "
        f"{STUDENT_PY} -S -c 'import resource as r; "
        "print(*(r.getrlimit(x)[0] for x in (r.RLIMIT_NPROC, r.RLIMIT_CORE, r.RLIMIT_FSIZE)))'",
        before=limits.preexec,
    )
    lines = result.stdout.split()
    assert lines[0] == "1000"
    assert lines[1] == "64"
    assert lines[2] == "0"
    assert int(lines[3]) > 0


def _assert_watchdog_kills_a_200_mib_hog(student: StudentIdentity) -> None:
    """A student process holding 200 MiB of touched memory, then sleeping: SIGKILLed in time."""
    hog = spawn_student(
        student,
        f"{STUDENT_PY} -S -c \"b=bytearray(200 << 20); b[::4096]=b'x'*(len(b)//4096); "
        'import time; time.sleep(60)"',
    )
    assert wait_until(lambda: hog.poll() is not None, 20), "watchdog did not kill the hog"
    assert hog.returncode == -9


def test_watchdog_kills_when_no_kernel_limit(student: StudentIdentity, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # simulate a sandbox without any writable cgroup: the watchdog must take over
    import karotte.sandbox.confinement.limits as limits_module

    monkeypatch.setattr(limits_module, "open_student_cgroup", lambda name: (None, "none (test)"))
    applied = apply_limits(
        student, LimitsOptions(memory_bytes=64 * MIB, pids=64, watchdog_interval_s=0.1)
    )
    try:
        assert "watchdog" in applied.report.memory.mechanism
        _assert_watchdog_kills_a_200_mib_hog(student)
        assert any("resident memory" in k for k in applied.watchdog_kills())
    finally:
        applied.close()


def test_a_memory_cgroup_that_does_not_enforce_is_left_to_the_watchdog(
    student: StudentIdentity, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under gVisor the memory controller stores limits without enforcing them (a 256 MiB hog
    survived a 64 MiB limit there): its limit must go to the watchdog, which really kills."""
    from karotte.sandbox.confinement import cgroups

    monkeypatch.setenv("KAROTTE_SANDBOX", "gvisor")
    assert cgroups.running_under_gvisor()
    assert "memory" in cgroups.unenforced_controllers()
    applied = apply_limits(
        student, LimitsOptions(memory_bytes=64 * MIB, pids=64, watchdog_interval_s=0.1)
    )
    try:
        assert applied.report.memory.mechanism.startswith("watchdog"), applied.report.memory
        assert "gVisor" in (applied.report.memory.detail or "")
        assert "memory" in applied.report.watchdog
        _assert_watchdog_kills_a_200_mib_hog(student)
    finally:
        applied.close()
    monkeypatch.delenv("KAROTTE_SANDBOX")
    if not Path("/proc/version").read_text().startswith(cgroups.GVISOR_PROC_VERSION):
        assert cgroups.unenforced_controllers() == {}


def test_processes_outside_the_student_are_untouched(student: StudentIdentity) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        applied = apply_limits(student, LimitsOptions(memory_bytes=64 * MIB, pids=16))
        applied.close()
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_launcher_provided_cgroup_is_used_and_left_in_place(
    student: StudentIdentity, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the CONTRACTS.md layout: <root>/<controller> are the student's cgroup, owned by the launcher
    base = {c: Path(f"/sys/fs/cgroup/{c}") for c in ("memory", "pids", "freezer")}
    if not all(os.access(p, os.W_OK) for p in base.values()):
        pytest.skip("no writable cgroup v1 hierarchy")
    root = Path(f"/run/karotte-test-{student.uid}")
    made = []
    try:
        for controller, path in base.items():
            launcher_dir = path / f"karotte-launcher-test-{student.uid}"
            launcher_dir.mkdir()
            made.append(launcher_dir)
            (root).mkdir(exist_ok=True)
            (root / controller).symlink_to(launcher_dir)
        monkeypatch.setenv("KAROTTE_CGROUP_ROOT", str(root))
        applied = apply_limits(student, LimitsOptions(memory_bytes=64 * MIB, pids=32))
        assert applied.report.cgroup_source.startswith("launcher-provided")
        assert (made[0] / "memory.limit_in_bytes").read_text().strip() == str(64 * MIB)
        hog = as_student(
            student,
            f"{STUDENT_PY} -S -c \"b=bytearray(200 << 20); b[::4096]=b'x'*(51200)\"",
            before=applied.preexec,
        )
        assert hog.returncode in (-9, 137)
        applied.close()
        assert all(p.exists() for p in made)  # the launcher removes its own dirs
        assert int((made[0] / "memory.limit_in_bytes").read_text()) > 1 << 40  # limits lifted
        assert (made[1] / "pids.max").read_text().strip() == "max"
    finally:
        for path in made:
            path.rmdir()
        for link in root.glob("*"):
            link.unlink()
        if root.exists():
            root.rmdir()


SYSV_HOG = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
size = 400 << 20
shmid = libc.shmget(0, ctypes.c_size_t(size), 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
if shmid < 0:
    sys.exit(3)
print(shmid, flush=True)
address = libc.shmat(shmid, None, 0)
ctypes.memset(address, 1, size)  # touch every page
print("survived", flush=True)
"""


def test_sysv_shm_counts_against_the_student_memory(
    student: StudentIdentity, limits: AppliedLimits, tmp_path: Path
) -> None:
    _require_cgroup(limits, "memory")
    script = tmp_path / "hog.py"
    script.write_text(SYSV_HOG)
    os.chmod(tmp_path, 0o755)
    os.chmod(script, 0o644)
    try:
        result = as_student(student, f"{STUDENT_PY} -S {script}", before=limits.preexec)
        assert "survived" not in result.stdout, result.stdout
        assert result.returncode in (-9, 137), (result.returncode, result.stderr[-300:])
    finally:
        from karotte.sandbox.confinement.cleanup import remove_student_ipc

        remove_student_ipc(student.uid)


def test_cgroup_v2_kill_and_membership(student: StudentIdentity) -> None:
    # this host's v2 hierarchy has no memory/pids controller, but cgroup.kill and membership
    # are the same code path custody uses on v2 sandboxes
    from karotte.sandbox.confinement.cgroups import CgroupV2

    unified = Path("/sys/fs/cgroup/unified")
    if not (unified / "cgroup.procs").exists() or not os.access(unified, os.W_OK):
        pytest.skip("no writable cgroup v2 mount")
    path = unified / f"karotte-test-v2-{student.uid}"
    path.mkdir()
    group = CgroupV2(path, created=True)
    try:
        procs = [
            spawn_student(student, "sleep 60 & sleep 60 & wait", before=lambda: group.add_pid(0))
            for _ in range(2)
        ]
        assert wait_until(lambda: len(group.pids()) >= 6, 10), group.pids()
        group.kill_all()
        assert all(p.wait(timeout=10) == -9 for p in procs)
        assert wait_until(lambda: group.pids() == [], 5)
    finally:
        group.remove()
    assert not path.exists()
