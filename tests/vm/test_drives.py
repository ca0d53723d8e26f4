"""The VM layer's pieces with real tools: ext4 drives (mkfs.ext4 -d, read back with debugfs),
the root drive from a docker image (cached by image id), LRU eviction that never removes a
drive in use, taking /out back (regular files only), the channel's framing, sizing."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import time
import uuid
from pathlib import Path

import pytest

from karotte.host.vm import channel, drives, sizing
from karotte.host.vm.kernel import build_cpio, module_depends, resolve_modules

needs_e2fs = pytest.mark.skipif(
    shutil.which("mkfs.ext4") is None or shutil.which("debugfs") is None,
    reason="e2fsprogs not installed (scripts/setup-vm.sh)",
)


def debugfs(image: Path, request: str) -> str:
    proc = subprocess.run(
        ["debugfs", "-R", request, str(image)], capture_output=True, text=True, check=True
    )
    return proc.stdout


@needs_e2fs
def test_in_drive_carries_config_and_mount_copies(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text('{"a": 1}')
    (out / "sub").mkdir()
    (out / "sub" / "data.txt").write_text("data")
    single = tmp_path / "tool.sh"
    single.write_text("#!/bin/sh\necho hi\n")
    drive = tmp_path / "in.ext4"
    manifest = drives.in_drive(
        drive,
        {"command": ["true"], "env": {"K": "v"}},
        [(out, "/out", False), (single, "/usr/local/bin/tool", True)],
    )
    assert set(manifest) == {"0/run.json", "0/sub/data.txt", "1"}
    config = debugfs(drive, "cat /vm.json")
    assert '"command": ["true"]' in config and '"K": "v"' in config
    assert '"target": "/usr/local/bin/tool", "read_only": true' in config
    assert debugfs(drive, "cat /mounts/0/sub/data.txt") == "data"
    assert "echo hi" in debugfs(drive, "cat /mounts/1")
    assert "Filesystem volume name:   karotte-in" in debugfs(drive, "stats")


@needs_e2fs
def test_scratch_drive_is_sparse_and_sized_to_the_budget(tmp_path: Path) -> None:
    drive = tmp_path / "scratch.ext4"
    drives.scratch_drive(drive, 2 * drives.GIB)
    assert drive.stat().st_size == 2 * drives.GIB + drives.SCRATCH_EXTRA
    assert drive.stat().st_blocks * 512 < 64 * drives.MIB  # sparse: costs nothing until used
    assert "karotte-scratch" in debugfs(drive, "stats")


@pytest.mark.requires_docker
@needs_e2fs
def test_root_drive_is_exported_once_per_image(tmp_path: Path) -> None:
    from runtimes.tiny_image import make_rootfs_tar  # tests/ is on sys.path (rootdir import)

    tag = f"karotte-test/vm-drive:{uuid.uuid4().hex[:8]}"
    tar = make_rootfs_tar(tmp_path / "rootfs.tar")
    subprocess.run(
        ["docker", "import", "--change", "ENV FOO=bar", "--change", "WORKDIR /home/student",
         str(tar), tag],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        cache = tmp_path / "cache"
        first = drives.root_drive(tag, cache)
        inode = first.path.stat().st_ino
        listing = debugfs(first.path, "ls -l /bin")
        assert " sh" in listing or "sh\n" in listing
        assert "student" in debugfs(first.path, "cat /etc/passwd")
        assert "FOO=bar" in first.env and first.workdir == "/home/student"
        started = time.monotonic()
        second = drives.root_drive(tag, cache)
        assert second.path == first.path and second.path.stat().st_ino == inode
        assert time.monotonic() - started < 2  # cached: no second export
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


def _fake_drive(directory: Path, name: str, size: int, age_s: float) -> Path:
    path = directory / f"{name}.ext4"
    with open(path, "wb") as handle:
        handle.write(os.urandom(size))  # real blocks, so the size bound sees them
    (directory / f"{name}.json").write_text("{}")
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))
    return path


def test_eviction_is_lru_and_never_removes_a_drive_in_use(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    oldest = _fake_drive(root, "oldest", 1 << 20, 300)
    busy = _fake_drive(root, "busy", 1 << 20, 200)
    middle = _fake_drive(root, "middle", 1 << 20, 100)
    newest = _fake_drive(root, "newest", 1 << 20, 0)
    fd = drives.hold(busy)
    try:
        assert drives.in_use(busy) and not drives.in_use(oldest)
        removed = drives.evict(tmp_path, max_bytes=int(1.5 * (1 << 20)), keep=newest)
    finally:
        os.close(fd)
    # oldest first; the busy one is skipped although it is older than middle; keep stays
    assert removed == [oldest, middle]
    assert busy.exists() and newest.exists()
    assert not oldest.with_suffix(".json").exists()
    assert not drives.in_use(busy)
    assert drives.evict(tmp_path, max_bytes=0) == [busy, newest]


def test_touching_a_drive_makes_it_recent(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    a = _fake_drive(root, "a", 4096, 500)
    b = _fake_drive(root, "b", 4096, 100)
    drives.touch_used(a)
    assert drives.evict(tmp_path, max_bytes=5000) == [b]


def _tar_with(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buffer.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o4755 if name.endswith("suid") else 0o644
    return info


def test_out_comes_back_as_regular_files_only(tmp_path: Path) -> None:
    host_out = tmp_path / "out"
    host_out.mkdir()
    (host_out / "run_config.json").write_text("host version, newer than the guest's copy")
    (host_out / "linkdir").symlink_to(tmp_path)
    outside = tmp_path / "outside.txt"
    raw = tmp_path / "out.raw"
    unchanged = b"what was copied in"
    raw.write_bytes(
        _tar_with(
            [
                (_member("0/transcript.json"), b'{"ok": true}'),
                (_member("0/art/sub/file.txt"), b"artifact"),
                (_member("0/run_config.json"), unchanged),
                (_member("0/evil-link", tarfile.SYMTYPE, "/etc/shadow"), b""),
                (_member("0/hard", tarfile.LNKTYPE, "0/transcript.json"), b""),
                (_member("0/dev", tarfile.CHRTYPE), b""),
                (_member("0/../outside.txt"), b"escape"),
                (_member("/abs.txt"), b"abs"),
                (_member("0/linkdir/through-link.txt"), b"through a link"),
                (_member("0/suid"), b"x"),
                (_member("7/other-mount.txt"), b"no such mount"),
            ]
        )
        + b"\0" * 4096
    )
    manifest = {"0/run_config.json": __import__("hashlib").sha256(unchanged).hexdigest()}
    problems = drives.extract_out(raw, {0: host_out}, manifest, max_bytes=1 << 20)
    assert (host_out / "transcript.json").read_text() == '{"ok": true}'
    assert (host_out / "art" / "sub" / "file.txt").read_text() == "artifact"
    # unchanged in the guest: the host's (newer) copy is kept
    assert (host_out / "run_config.json").read_text().startswith("host version")
    assert not (host_out / "evil-link").exists() and not (host_out / "hard").exists()
    assert not (host_out / "dev").exists() and not outside.exists()
    assert not (tmp_path / "through-link.txt").exists()
    assert (host_out / "suid").stat().st_mode & 0o7000 == 0
    assert any("outside.txt" in p for p in problems)
    assert any("through-link" in p for p in problems)


def test_out_is_bounded(tmp_path: Path) -> None:
    raw = tmp_path / "out.raw"
    raw.write_bytes(_tar_with([(_member(f"0/f{i}"), b"x" * 1000) for i in range(10)]))
    host_out = tmp_path / "out"
    host_out.mkdir()
    problems = drives.extract_out(raw, {0: host_out}, {}, max_bytes=3500)
    assert len(list(host_out.iterdir())) == 3
    assert any("larger than" in p for p in problems)


def test_garbage_out_drive_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    raw = tmp_path / "out.raw"
    raw.write_bytes(os.urandom(8192))
    host_out = tmp_path / "out"
    host_out.mkdir()
    problems = drives.extract_out(raw, {0: host_out}, {}, max_bytes=1 << 20)
    assert problems and list(host_out.iterdir()) == []


def test_channel_frames_survive_console_noise(tmp_path: Path) -> None:
    log = tmp_path / "channel.log"
    log.write_bytes(
        channel.encode("H", b"1.0")
        + b"[    1.2] some kernel message\n"
        + b"noise" + channel.encode("O", b'{"type": "x"}')
        + channel.encode("E", b"err\nline")
        + channel.encode("X", b"3")
    )  # fmt: skip
    frames = channel.read_frames(log)
    assert [f.kind for f in frames] == ["H", "", "O", "E", "X"]
    assert frames[2].payload == b'{"type": "x"}'
    assert frames[3].payload == b"err line"
    assert channel.exit_code(frames) == 3
    assert list(channel.follow(log, lambda: True)) == frames


def test_sizing() -> None:
    gib = sizing.GIB
    assert sizing.guest_memory_mib(None) == 5 * 1024
    assert sizing.guest_memory_mib(2 * gib) == 3 * 1024
    assert sizing.student_memory_bytes(None) == 3 * gib
    assert sizing.guest_vcpus(None, host_cpus=8) == 2
    assert sizing.guest_vcpus(3.5, host_cpus=8) == 4
    assert sizing.guest_vcpus(16, host_cpus=2) == 2
    assert sizing.guest_vcpus(0.5, host_cpus=2) == 1


def test_cpio_and_module_dependencies(tmp_path: Path) -> None:
    archive = build_cpio([("bin", 0o040755, b""), ("init", 0o100755, b"#!/bin/sh\n")])
    assert archive.startswith(b"070701") and b"TRAILER!!!" in archive
    if shutil.which("cpio"):
        listing = subprocess.run(
            ["cpio", "-t"], input=archive, capture_output=True, check=True
        ).stdout.split()
        assert listing == [b"bin", b"init"]
    a = tmp_path / "a.ko"
    b = tmp_path / "b-mod.ko"
    a.write_bytes(b"\x00license=GPL\x00depends=b_mod\x00vermagic=6.1\x00")
    b.write_bytes(b"\x00depends=\x00")
    assert module_depends(a) == ["b_mod"]
    assert resolve_modules({"a": a, "b_mod": b}, ("a", "builtin_one")) == [b, a]
