"""Custody of submissions against real attacks by a throwaway student uid (as root)."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest
from student_helpers import as_student, spawn_student, wait_until

from karotte.config import EvaluationRunConfig
from karotte.errors import StudentMisbehaviorError
from karotte.sandbox.confinement.cleanup import student_ipc_left
from karotte.sandbox.confinement.custody import (
    CustodyOptions,
    collect_submission,
    collect_submission_async,
    save_submission,
)
from karotte.sandbox.confinement.demote import Identity
from karotte.sandbox.confinement.limits import LimitsOptions, apply_limits, set_active_limits
from karotte.sandbox.confinement.processes import processes_of_uid

pytestmark = pytest.mark.requires_root

PY = "/usr/bin/python3"


@pytest.fixture
def config(student: Identity, tmp_path: Path) -> EvaluationRunConfig:
    return EvaluationRunConfig(
        task_id="t", student_user=student.name, transcript_file=tmp_path / "out" / "run.json"
    )


def _collect(config: EvaluationRunConfig, paths: list[str], **options: object) -> dict[str, Path]:
    return collect_submission(config, paths, CustodyOptions(**options))  # type: ignore[arg-type]


def _refused(config: EvaluationRunConfig, paths: list[str], **options: object) -> str:
    with pytest.raises(StudentMisbehaviorError) as info:
        _collect(config, paths, **options)
    return info.value.reason


def test_honest_submission_is_copied_intact_into_a_root_only_dir(
    student: Identity, config: EvaluationRunConfig
) -> None:
    as_student(
        student,
        "echo 42 > answer.txt && mkdir -p proj/src && printf 'print(1)\\n' > proj/src/main.py",
    )
    answer, proj = f"{student.home}/answer.txt", f"{student.home}/proj"
    copies = asyncio.run(collect_submission_async(config, [answer, "proj"]))
    assert copies[answer].read_text() == "42\n"
    assert (copies["proj"] / "src" / "main.py").read_text() == "print(1)\n"
    assert str(copies[answer]).startswith(str(config.artifacts_dir.resolve()))
    st = copies[answer].stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600)
    custody_dir = copies[answer].parents[len(Path(answer).parts) - 2]
    assert stat.S_IMODE(custody_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(config.artifacts_dir.stat().st_mode) == 0o700
    assert (custody_dir / "custody.json").exists()
    # the student cannot read the copy
    assert as_student(student, f"cat {copies[answer]}").returncode != 0
    assert Path(proj).exists()  # the original stays


def test_missing_submission_is_not_misbehaviour(
    student: Identity, config: EvaluationRunConfig
) -> None:
    copies = _collect(config, [f"{student.home}/nothing.txt"])
    assert not copies[f"{student.home}/nothing.txt"].exists()


def test_symlink_to_a_root_file_is_refused(
    student: Identity, config: EvaluationRunConfig, tmp_path: Path
) -> None:
    secret = tmp_path / "answer_key"
    secret.write_text("the answer")
    os.chmod(tmp_path, 0o755)
    as_student(student, f"ln -s {secret} answer.txt")
    reason = _refused(config, [f"{student.home}/answer.txt"])
    assert "symbolic link" in reason and str(secret) in reason


def test_symlink_in_a_parent_directory_is_refused(
    student: Identity, config: EvaluationRunConfig, tmp_path: Path
) -> None:
    root_dir = tmp_path / "root_data"
    root_dir.mkdir()
    (root_dir / "answer.txt").write_text("the answer")
    as_student(student, f"ln -s {root_dir} out")
    reason = _refused(config, [f"{student.home}/out/answer.txt"])
    assert "parent directory" in reason and "symbolic link" in reason


def test_fifo_is_refused_without_blocking(student: Identity, config: EvaluationRunConfig) -> None:
    as_student(student, "mkfifo answer.txt")
    started = time.monotonic()
    reason = _refused(config, [f"{student.home}/answer.txt"])
    assert "FIFO" in reason
    assert time.monotonic() - started < 5


def test_device_is_refused(student: Identity, config: EvaluationRunConfig) -> None:
    os.mknod(f"{student.home}/answer.txt", stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero
    assert "character device" in _refused(config, [f"{student.home}/answer.txt"])
    os.unlink(f"{student.home}/answer.txt")
    as_student(student, "ln -s /dev/zero answer.txt")
    assert "symbolic link" in _refused(config, [f"{student.home}/answer.txt"])


def test_socket_is_refused(student: Identity, config: EvaluationRunConfig) -> None:
    as_student(
        student, f"{PY} -c \"import socket; socket.socket(socket.AF_UNIX).bind('answer.txt')\""
    )
    assert "socket" in _refused(config, [f"{student.home}/answer.txt"])


def test_100_gb_sparse_file_is_refused(student: Identity, config: EvaluationRunConfig) -> None:
    as_student(student, "truncate -s 100G answer.txt")
    started = time.monotonic()
    assert "bytes, more than" in _refused(config, [f"{student.home}/answer.txt"])
    assert time.monotonic() - started < 5


def test_sparse_file_below_the_size_cap_is_refused(
    student: Identity, config: EvaluationRunConfig
) -> None:
    as_student(student, "truncate -s 64M answer.txt")
    assert "sparse" in _refused(config, [f"{student.home}/answer.txt"])


def test_deep_directory_bomb_is_refused(student: Identity, config: EvaluationRunConfig) -> None:
    as_student(student, "mkdir -p bomb/" + "/".join(["d"] * 60))
    assert "deeper than" in _refused(config, [f"{student.home}/bomb"])


def test_wide_directory_bomb_is_refused(student: Identity, config: EvaluationRunConfig) -> None:
    as_student(student, "mkdir bomb && cd bomb && seq 1 3000 | xargs touch")
    assert "more than 1000" in _refused(config, [f"{student.home}/bomb"], max_entries=1000)


def test_too_many_bytes_in_a_tree_is_refused(
    student: Identity, config: EvaluationRunConfig
) -> None:
    as_student(
        student,
        "mkdir t && for i in 1 2 3 4; do head -c 1048576 /dev/urandom > t/f$i; done",
    )
    assert "total more than" in _refused(config, [f"{student.home}/t"], max_total_bytes=3 << 20)


def test_hard_link_to_an_outside_file_is_refused(
    student: Identity, config: EvaluationRunConfig, tmp_path: Path
) -> None:
    secret = Path(student.home).parent / f"key-{student.uid}"
    secret.write_text("the answer")
    try:
        os.link(secret, f"{student.home}/answer.txt")
        assert "hard link" in _refused(config, [f"{student.home}/answer.txt"])
    finally:
        secret.unlink()


def test_background_swapper_is_killed_before_the_copy(
    student: Identity, config: EvaluationRunConfig
) -> None:
    answer = Path(student.home) / "answer.txt"
    swapper = spawn_student(
        student,
        "while true; do echo right > answer.tmp && mv answer.tmp answer.txt; "
        "echo wrong > answer.tmp && mv answer.tmp answer.txt; done",
    )
    assert wait_until(answer.exists)
    copies = _collect(config, [str(answer)])
    assert processes_of_uid(student.uid) == []
    assert swapper.wait(timeout=5) == -9
    seen = copies[str(answer)].read_text()
    assert seen in ("right\n", "wrong\n")
    original = answer.read_text()
    time.sleep(0.3)
    assert answer.read_text() == original  # nobody writes any more
    assert copies[str(answer)].read_text() == seen


def test_fork_and_die_chain_is_reaped(student: Identity, config: EvaluationRunConfig) -> None:
    spawn_student(
        student,
        f"{PY} -S -c 'import os,time\nwhile True:\n if os.fork(): os._exit(0)\n time.sleep(0.002)'",
    )
    assert wait_until(lambda: processes_of_uid(student.uid) != [])
    _collect(config, [])
    assert processes_of_uid(student.uid) == []
    time.sleep(0.2)
    assert processes_of_uid(student.uid) == []


def test_student_cgroup_is_killed_too(student: Identity, config: EvaluationRunConfig) -> None:
    applied = apply_limits(student, LimitsOptions(memory_bytes=256 << 20, pids=64))
    set_active_limits(applied)
    try:
        spawn_student(student, "sleep 60 & sleep 60 & wait", before=applied.preexec)
        assert wait_until(lambda: len(processes_of_uid(student.uid)) >= 3)
        _collect(config, [])
        assert processes_of_uid(student.uid) == []
        if applied.cgroup is not None:
            assert applied.cgroup.pids() == []
    finally:
        set_active_limits(None)
        applied.close()


def test_unkillable_cohort_is_misbehaviour_in_bounded_time(
    student: Identity, config: EvaluationRunConfig
) -> None:
    # a process frozen in a cgroup custody does not know cannot die: stands for any cohort the
    # kernel will not reap (the student itself cannot freeze; this proves the time bound)
    freezer = Path("/sys/fs/cgroup/freezer")
    if not (freezer / "cgroup.procs").exists() or not os.access(freezer, os.W_OK):
        pytest.skip("no writable cgroup v1 freezer")
    frozen = freezer / f"karotte-test-{student.uid}"
    frozen.mkdir()
    try:
        proc = spawn_student(student, "sleep 60")
        (frozen / "cgroup.procs").write_text(str(proc.pid))
        (frozen / "freezer.state").write_text("FROZEN")
        started = time.monotonic()
        reason = _refused(config, [], kill_timeout_s=1.0)
        assert "survived" in reason
        assert time.monotonic() - started < 5
    finally:
        (frozen / "freezer.state").write_text("THAWED")
        assert wait_until(lambda: not processes_of_uid(student.uid), 5) or True
        for pid in (frozen / "cgroup.procs").read_text().split():
            os.kill(int(pid), 9)
        wait_until(lambda: (frozen / "cgroup.procs").read_text() == "", 5)
        frozen.rmdir()


def test_dev_shm_files_and_sysv_ipc_are_cleaned_up(
    student: Identity, config: EvaluationRunConfig
) -> None:
    shm_file = Path(f"/dev/shm/karotte-test-{student.uid}")
    tmp_dir = Path(f"/tmp/karotte-test-{student.uid}")
    result = as_student(
        student,
        f"echo x > {shm_file} && mkdir {tmp_dir} && echo y > {tmp_dir}/f && "
        f"ln -s /etc/passwd {tmp_dir}/link && ipcmk -M 65536 && ipcmk -S 2 && ipcmk -Q",
    )
    assert result.returncode == 0, result.stderr
    assert len(student_ipc_left(student.uid)) == 3
    keep = f"/tmp/karotte-keep-{student.uid}"
    as_student(student, f"echo keep > {keep}")
    try:
        copies = _collect(config, [keep])
        assert copies[keep].read_text() == "keep\n"
        assert not shm_file.exists()
        assert not tmp_dir.exists()
        assert Path("/etc/passwd").exists()
        assert student_ipc_left(student.uid) == []
        assert Path(keep).exists()  # a submission path is never deleted
    finally:
        for leftover in (shm_file, Path(keep)):
            leftover.unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", str(tmp_dir)], check=False)


def test_local_runs_copy_safely_without_a_student(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "answer.txt").write_text("ok")
    (work / "link").symlink_to(work / "answer.txt")
    config = EvaluationRunConfig(task_id="t", transcript_file=tmp_path / "out" / "run.json")
    old = os.getcwd()
    os.chdir(work)
    try:
        copies = collect_submission(config, ["answer.txt"])
        assert copies["answer.txt"].read_text() == "ok"
        with pytest.raises(StudentMisbehaviorError, match="symbolic link"):
            collect_submission(config, ["link"])
    finally:
        os.chdir(old)


def test_save_submission_into_a_given_directory(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a")
    copies = save_submission(["a.txt"], tmp_path / "dest", base_dir=str(tmp_path))
    assert copies["a.txt"].read_text() == "a"
    assert stat.S_IMODE((tmp_path / "dest").stat().st_mode) == 0o700


def test_custody_options_come_from_extra_config(tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_bytes(b"x" * 2048)
    config = EvaluationRunConfig(
        task_id="t",
        transcript_file=tmp_path / "out" / "run.json",
        extra_config={"custody": {"max_file_bytes": 1024}},
    )
    with pytest.raises(StudentMisbehaviorError, match="more than 1024"):
        collect_submission(config, [str(tmp_path / "big.txt")])
