"""setup_confinement: the whole confinement for a run, its limits_applied payload, and teardown."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
from student_helpers import as_student

from karotte.config import EvaluationRunConfig
from karotte.events import LimitsApplied
from karotte.sandbox.confinement.demote import Identity
from karotte.sandbox.confinement.disk import loop_devices_available
from karotte.sandbox.confinement.limits import LimitsOptions, active_limits
from karotte.sandbox.confinement.setup import ConfinementOptions, setup_confinement


def test_local_runs_are_not_confined(tmp_path: Path) -> None:
    config = EvaluationRunConfig(task_id="t", transcript_file=tmp_path / "r.json")
    confinement = setup_confinement(config)
    assert confinement.payload()["student_user"] is None
    confinement.teardown()


@pytest.mark.requires_root
def test_full_setup_reports_every_mechanism_and_teardown_undoes_it(
    student: Identity, tmp_path: Path
) -> None:
    os.chmod(tmp_path, 0o755)
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, student.uid, student.gid)
    shared_tmp = tmp_path / "shared-tmp"
    shared_tmp.mkdir()
    os.chmod(shared_tmp, 0o1777)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    config = EvaluationRunConfig(
        task_id="t", student_user=student.name, transcript_file=tmp_path / "r.json"
    )
    options = ConfinementOptions(
        limits=LimitsOptions(memory_bytes=256 << 20, pids=128, cgroup_name=f"setup-{student.uid}"),
        disk_paths=[str(data)],
        temp_quota_dirs=[str(shared_tmp)],  # never the host's real /tmp
        disk_bytes=16 << 20,
        disk_inodes=256,
    )
    confinement = setup_confinement(config, harness_ports=[port], options=options)
    try:
        payload = confinement.payload()
        LimitsApplied(limits=payload)  # fits the event
        assert active_limits() is confinement.limits
        assert payload["memory"]["mechanism"].startswith("cgroup")
        assert "RLIMIT_NPROC" in payload["pids"]["mechanism"]
        if loop_devices_available() is None:
            assert payload["disk"][0]["mechanism"].startswith("loop-mounted ext4")
        assert payload["network"]["backend"].startswith("iptables")
        assert payload["network"]["canary"][f"127.0.0.1:{port}"] == "refused"
        assert payload["network"]["canary"]["192.0.2.1:80"] == "refused"
        assert "pid" in payload["namespaces"]
        assert [d["path"] for d in payload["disk"]] == [str(data), str(shared_tmp)]
        st = os.stat(shared_tmp)
        assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o1777)  # a sticky temp dir stays one
        assert as_student(student, f"echo hi > {shared_tmp}/mine").returncode == 0
        # the student really is limited: a write beyond the quota fails
        result = as_student(student, f"head -c 40000000 /dev/zero > {data}/big", timeout=60)
        assert result.returncode != 0
    finally:
        confinement.teardown()
        listener.close()
    assert active_limits() is None
    assert (
        f"KAROTTE-{os.getpid()}"
        not in subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout
    )
    assert f" {data} " not in Path("/proc/mounts").read_text()
    assert f" {shared_tmp} " not in Path("/proc/mounts").read_text()
    assert not Path(f"/sys/fs/cgroup/pids/karotte-student-setup-{student.uid}").exists()
