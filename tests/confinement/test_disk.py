"""Loop-mounted disk quota: a student writer really hits the byte and the file limit."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from student_helpers import as_student

from karotte.sandbox.confinement.demote import Identity
from karotte.sandbox.confinement.disk import LoopQuota, loop_devices_available

pytestmark = pytest.mark.requires_root

MIB = 1 << 20


@pytest.fixture
def quota(student: Identity, tmp_path: Path) -> LoopQuota:
    why = loop_devices_available()
    if why:
        pytest.skip(why)
    os.chmod(tmp_path, 0o755)
    data = tmp_path / "data"
    data.mkdir()
    (data / "given.txt").write_text("from the image\n")
    os.chown(data / "given.txt", student.uid, student.gid)
    quota = LoopQuota(data, size_bytes=16 * MIB, inodes=128, uid=student.uid, gid=student.gid)
    yield quota  # type: ignore[misc]
    quota.remove()
    assert not quota.mounted and quota.image is None
    assert str(data) not in Path("/proc/mounts").read_text()


def test_writer_is_stopped_at_the_size(student: Identity, quota: LoopQuota) -> None:
    report = quota.create()
    assert report.device and report.device.startswith("/dev/loop")
    assert (quota.path / "given.txt").read_text() == "from the image\n"  # content kept
    result = as_student(
        student, f"dd if=/dev/zero of={quota.path}/fill bs=1M count=64 2>&1", timeout=60
    )
    assert result.returncode != 0
    assert "No space left" in result.stdout
    assert 15 * MIB <= (quota.path / "fill").stat().st_size <= 17 * MIB
    # the rest of the machine did not get the bytes: the filesystem is full, the host is not
    free = os.statvfs(quota.path)
    assert free.f_bavail * free.f_frsize < MIB


def test_file_count_is_bounded_by_inodes(student: Identity, quota: LoopQuota) -> None:
    quota.create()
    result = as_student(
        student,
        f"cd {quota.path} && i=0; while [ $i -lt 1000 ]; do touch f$i || exit 3; i=$((i+1)); done",
        timeout=60,
    )
    assert result.returncode == 3
    assert "No space left" in result.stderr
    count = len(os.listdir(quota.path))
    assert 100 <= count <= 128 + 16


def test_mount_is_nosuid_nodev_and_owned_by_the_student(
    student: Identity, quota: LoopQuota
) -> None:
    quota.create()
    line = next(
        line for line in Path("/proc/mounts").read_text().splitlines() if f" {quota.path} " in line
    )
    assert "nosuid" in line and "nodev" in line
    st = os.stat(quota.path)
    assert (st.st_uid, st.st_gid) == (student.uid, student.gid)
    assert as_student(student, f"echo ok > {quota.path}/mine").returncode == 0


def test_remove_is_idempotent_and_detaches(student: Identity, quota: LoopQuota) -> None:
    quota.create()
    device = quota.device
    quota.remove()
    quota.remove()
    out = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    assert f"{device}:" not in out
