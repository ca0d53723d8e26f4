"""The launcher's host-side disk quota (for gVisor, which has no loop devices): a real image's
student dirs copied into loop-mounted ext4 filesystems, a real sandbox writer stopped by them,
the harness's check of the claim, and the reaping of quotas whose launcher died."""

from __future__ import annotations

import os
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from karotte.host import reaper
from karotte.host.runtimes import disk_delegation, get_runtime
from karotte.host.runtimes.docker import DockerRuntime
from karotte.sandbox.confinement.setup import verify_launcher_disk

from .tiny_image import make_rootfs_tar

pytestmark = [pytest.mark.requires_root, pytest.mark.requires_docker]

MIB = 1 << 20
TAG = "karotte-test/disk-seed:1"


def _add(tar: tarfile.TarFile, name: str, mode: int, uid: int, data: bytes | None = None) -> None:
    info = tarfile.TarInfo(name)
    info.mode, info.uid, info.gid = mode, uid, uid
    if data is None:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    else:
        import io

        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny image plus a student home holding a file, and a sticky /var/tmp."""
    why = disk_delegation.unavailable_reason()
    if why:
        pytest.skip(why)
    work = tmp_path_factory.mktemp("seed")
    tiny = make_rootfs_tar(work / "tiny.tar")
    rootfs = work / "rootfs.tar"
    with tarfile.open(tiny) as source, tarfile.open(rootfs, "w") as tar:
        for member in source.getmembers():
            if member.name != "home/student":  # replaced below, with a mode of its own
                tar.addfile(member, source.extractfile(member) if member.isfile() else None)
        _add(tar, "home/student", 0o1770, 1000)
        _add(tar, "home/student/given.txt", 0o644, 1000, b"from the image\n")
        _add(tar, "var", 0o755, 0)
        _add(tar, "var/tmp", 0o1777, 0)
    runtime = DockerRuntime()
    runtime.import_rootfs(rootfs, TAG)
    return TAG


@pytest.fixture
def disk_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "disks"
    monkeypatch.setenv(disk_delegation.DISK_ROOT_ENV, str(root))
    return root


@pytest.fixture
def delegation(image: str, disk_root: Path) -> Iterator[disk_delegation.DiskDelegation]:
    made, why = disk_delegation.delegate(
        DockerRuntime(), image, "karotte-disk-test", {"k": "v"}, 16 * MIB, inodes=300
    )
    assert made is not None, why
    yield made
    assert disk_delegation.release(made) == []
    assert not made.run_dir.exists()
    mounts = Path("/proc/mounts").read_text()
    assert all(str(d.mountpoint) not in mounts for d in made.disks)


def _losetup_of(image: Path) -> str:
    return subprocess.run(
        ["losetup", "-j", str(image)], capture_output=True, text=True, check=False
    ).stdout.strip()


def test_the_image_content_is_copied_with_owners_and_modes(
    delegation: disk_delegation.DiskDelegation,
) -> None:
    by_path = {d.path: d for d in delegation.disks}
    assert set(by_path) == {"/home/student", "/var/tmp"}
    home = by_path["/home/student"].mountpoint
    assert os.path.ismount(home)
    assert (home / "given.txt").read_text() == "from the image\n"
    assert os.stat(home / "given.txt").st_uid == 1000
    st = os.stat(home)
    assert (st.st_uid, st.st_mode & 0o7777) == (1000, 0o1770)
    assert os.stat(by_path["/var/tmp"].mountpoint).st_mode & 0o7777 == 0o1777
    # the home gets the whole budget, /var/tmp a quarter (at least 16 MiB)
    assert by_path["/home/student"].bytes == 16 * MIB
    assert by_path["/var/tmp"].bytes == 16 * MIB


def test_a_student_in_a_real_sandbox_is_stopped_by_size_and_file_count(
    delegation: disk_delegation.DiskDelegation, image: str
) -> None:
    gvisor = get_runtime("docker:gvisor")
    runtime_args = ["--runtime=runsc"] if gvisor.availability().ok else []
    mounts = []
    for mount in delegation.mounts():
        mounts += ["--mount", f"type=bind,source={mount.source},target={mount.target}"]
    script = (
        "head -c 64000000 /dev/zero > /home/student/big; echo big=$?; true > /home/student/big; "
        "i=0; while true > /home/student/f$i; do i=$((i+1)); done 2>/dev/null; echo files=$i"
    )
    proc = subprocess.run(
        ["docker", "run", "--rm", "--network=none", "--user", "1000:1000", *runtime_args,
         *mounts, image, "sh", "-c", script],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert "big=1" in proc.stdout, proc.stdout + proc.stderr
    assert "No space left on device" in proc.stderr
    files = int(proc.stdout.split("files=")[1].split()[0])
    # "big" holds one inode; mkfs rounds the inode count up to whole groups
    assert 300 <= files + 1 <= 2 * 300 + 64
    home = next(d for d in delegation.disks if d.path == "/home/student")
    used = sum(p.stat().st_size for p in home.mountpoint.iterdir() if p.is_file())
    assert used < 17 * MIB  # the host's disk took no more than the quota


def test_the_harness_accepts_a_real_quota_and_rejects_a_false_claim(
    delegation: disk_delegation.DiskDelegation, tmp_path: Path
) -> None:
    home = next(d for d in delegation.disks if d.path == "/home/student")
    claim = home.model_dump(include={"bytes", "inodes", "mechanism"})
    checked = verify_launcher_disk({**claim, "path": str(home.mountpoint)})
    assert checked["mechanism"] == disk_delegation.MECHANISM, checked
    assert "statvfs" in checked["detail"]
    # the same claim on a plain directory of the host's disk is not believed
    plain = tmp_path / "plain"
    plain.mkdir()
    rejected = verify_launcher_disk({**claim, "path": str(plain)})
    assert rejected["mechanism"] == "none"
    assert "does not hold" in rejected["detail"]


def test_release_frees_the_loop_device(image: str, disk_root: Path) -> None:
    made, why = disk_delegation.delegate(DockerRuntime(), image, "karotte-loop", {}, 8 * MIB)
    assert made is not None, why
    images = [d.image for d in made.disks]
    assert all(_losetup_of(i) for i in images)
    assert disk_delegation.release(made) == []
    assert not any(_losetup_of(i) for i in images)


def test_the_quota_of_a_dead_launcher_is_reaped_and_a_live_ones_is_not(
    image: str, disk_root: Path
) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    dead_owner = {
        "dev.karotte.launcher-pid": str(dead.pid),
        "dev.karotte.launcher-start": "1",
        "dev.karotte.launcher-host": reaper.this_host(),
    }
    orphan, why = disk_delegation.delegate(DockerRuntime(), image, "orphan", dead_owner, 8 * MIB)
    assert orphan is not None, why
    live, why = disk_delegation.delegate(
        DockerRuntime(), image, "live", reaper.launcher_labels("live"), 8 * MIB
    )
    assert live is not None, why
    try:
        assert set(reaper.stale_disks(min_age_s=0)) == {"orphan"}
        assert reaper.stale_disks(min_age_s=3600) == {}  # too young: maybe still starting
        assert reaper.reap_stale_disks(min_age_s=0) == {"orphan": []}
        assert not orphan.run_dir.exists()
        assert all(str(d.mountpoint) not in Path("/proc/mounts").read_text() for d in orphan.disks)
        assert live.run_dir.exists()
    finally:
        disk_delegation.release(live)
        disk_delegation.release(orphan)


def test_an_image_without_the_student_user_is_refused_clearly(
    disk_root: Path, tmp_path: Path
) -> None:
    if disk_delegation.unavailable_reason():
        pytest.skip(str(disk_delegation.unavailable_reason()))
    rootfs = make_rootfs_tar(tmp_path / "rootfs.tar")
    DockerRuntime().import_rootfs(rootfs, "karotte-test/disk-nouser:1")
    made, why = disk_delegation.delegate(
        DockerRuntime(), "karotte-test/disk-nouser:1", "nouser", {}, 8 * MIB, user="nobody-here"
    )
    assert made is None
    assert "no user 'nobody-here'" in why
    assert not (disk_root / "nouser").exists()


def test_seeds_of_images_not_run_for_a_week_are_evicted(image: str, disk_root: Path) -> None:
    made, why = disk_delegation.delegate(DockerRuntime(), image, "evict", {}, 8 * MIB)
    assert made is not None, why
    disk_delegation.release(made)
    seeds = disk_root / ".seed"
    old = seeds / "0123old"
    (old / "0").mkdir(parents=True)
    recent = seeds / "0123recent"
    recent.mkdir()
    week_ago = time.time() - disk_delegation.SEED_MAX_AGE_S - 60
    os.utime(old, (week_ago, week_ago))
    made, why = disk_delegation.delegate(DockerRuntime(), image, "evict2", {}, 8 * MIB)
    assert made is not None, why
    disk_delegation.release(made)
    assert not old.exists()
    assert recent.exists()
    assert len([p for p in seeds.iterdir() if p.name not in ("0123recent",)]) == 1  # the image's
