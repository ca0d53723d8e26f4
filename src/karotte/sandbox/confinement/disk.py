"""A disk quota for the student's writable directory: a loop-mounted ext4 filesystem.

The filesystem's size bounds the bytes and its inode count (``mkfs.ext4 -N``) bounds the number
of files, whatever the student does; nothing it writes there can fill the sandbox's disk. The
directory's existing content is copied into the new filesystem (``mkfs.ext4 -d``), which is then
mounted over it ``nosuid,nodev`` and owned by the student. :meth:`LoopQuota.remove` unmounts it,
detaches the loop device and deletes the image.

Needs root with ``CAP_SYS_ADMIN`` and loop devices (``/dev/loop-control``): inside an
unprivileged container that is usually missing, and :class:`DiskQuotaUnavailable` says so, so
that the caller can fall back (tmpfs sizes set by the launcher, or no quota) and record it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from karotte.errors import KarotteError
from karotte.sandbox.confinement.sanitize import UntrustedBinaryError, resolve_system_binary

MIB = 1 << 20


class DiskQuotaUnavailable(KarotteError):
    """A loop-mounted quota cannot be made here; the message says why and what to do."""


class DiskQuotaReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    bytes: int
    inodes: int
    mechanism: str
    device: str | None = None


def _tool(name: str) -> str:
    try:
        return resolve_system_binary(name)
    except UntrustedBinaryError as exc:
        raise DiskQuotaUnavailable(f"{exc} (install e2fsprogs / util-linux / mount)") from exc


def _run(argv: list[str], what: str, timeout: float = 120) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise DiskQuotaUnavailable(
            f"{what} failed: {result.stderr.strip() or result.stdout.strip()}"
        )
    return result.stdout.strip()


def usage(path: Path) -> tuple[int, int]:
    """Allocated bytes and number of entries below ``path`` (no symlink following)."""
    total, count = 0, 0
    for root, dirs, files in os.walk(path, followlinks=False):
        for name in dirs + files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            total += st.st_blocks * 512 + 4096
            count += 1
    return total, count


def ext4_image_bytes(free_bytes: int, existing_bytes: int, inodes: int) -> int:
    """Size of an ext4 image that leaves ``free_bytes`` for data on top of ``existing_bytes``,
    with ``inodes`` inodes (``mkfs.ext4 -m 0 -O ^has_journal``): inode tables (256 B each),
    bitmaps and group descriptors (~2 %) come on top."""
    total = free_bytes + existing_bytes + inodes * 256
    return total + total // 50 + 2 * MIB


def loop_devices_available() -> str | None:
    """None when loop devices can be used, else why not."""
    if os.geteuid() != 0:
        return "not root"
    if not os.path.exists("/dev/loop-control"):
        return (
            "/dev/loop-control is missing (unprivileged container without loop devices; the "
            "launcher must pass --device /dev/loop-control and the loop devices)"
        )
    return None


@dataclass
class LoopQuota:
    """A size- and inode-limited ext4 filesystem mounted on ``path`` for ``uid``/``gid``."""

    path: Path
    size_bytes: int  # free bytes for the student, on top of what the directory already holds
    inodes: int  # free inodes (files) for the student, on top of the existing ones
    uid: int
    gid: int
    image_dir: Path | None = None  # default: a root-only temp dir
    mode: int | None = (
        None  # mode of the mounted root dir (e.g. 0o1777 for /tmp); default: as before
    )
    image: Path | None = None
    device: str | None = None
    mounted: bool = False
    _image_dir_made: Path | None = field(default=None, repr=False)

    def create(self) -> DiskQuotaReport:
        why = loop_devices_available()
        if why:
            raise DiskQuotaUnavailable(f"no loop-mounted disk quota: {why}")
        if self.size_bytes < 4 * MIB:
            raise ValueError("a loop quota needs at least 4 MiB")
        mkfs, losetup, mount = _tool("mkfs.ext4"), _tool("losetup"), _tool("mount")
        self.path.mkdir(parents=True, exist_ok=True)
        original_mode = os.stat(self.path).st_mode & 0o7777
        if self.image_dir is None:
            self._image_dir_made = Path(tempfile.mkdtemp(prefix="karotte-disk-"))
            image_dir = self._image_dir_made
        else:
            image_dir = self.image_dir
            image_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(image_dir, 0o700)
        self.image = image_dir / "student-disk.ext4"
        try:
            existing_bytes, existing_files = usage(self.path)
            inodes = self.inodes + existing_files + 16
            # ext4 metadata: inode tables (256 B each), bitmaps, group descriptors (~2%)
            total = ext4_image_bytes(self.size_bytes, existing_bytes, inodes)
            with open(self.image, "xb") as handle:
                handle.truncate(total)
            argv = [
                mkfs,
                "-q",
                "-F",
                "-m",
                "0",
                "-O",
                "^has_journal",
                "-N",
                str(inodes),
                "-E",
                f"root_owner={self.uid}:{self.gid}",
            ]
            if any(self.path.iterdir()):
                argv += ["-d", str(self.path)]
            _run([*argv, str(self.image)], "mkfs.ext4")
            self.device = _run([losetup, "--find", "--show", str(self.image)], "losetup")
            _run(
                [mount, "-t", "ext4", "-o", "nosuid,nodev", self.device, str(self.path)],
                f"mount {self.device} on {self.path}",
            )
            self.mounted = True
            os.chown(self.path, self.uid, self.gid)
            os.chmod(self.path, self.mode if self.mode is not None else original_mode)
        except BaseException:
            self.remove()
            raise
        return DiskQuotaReport(
            path=str(self.path),
            bytes=self.size_bytes,
            inodes=self.inodes,
            mechanism="loop-mounted ext4 (size and inode count)",
            device=self.device,
        )

    def remove(self) -> None:
        """Unmount, detach and delete (idempotent; lazy unmount if the mount is busy)."""
        if self.mounted:
            umount = _tool("umount")
            result = subprocess.run(
                [umount, str(self.path)], capture_output=True, timeout=60, check=False
            )
            if result.returncode != 0:
                subprocess.run(
                    [umount, "-l", str(self.path)], capture_output=True, timeout=60, check=False
                )
            self.mounted = False
        if self.device:
            with contextlib.suppress(DiskQuotaUnavailable):
                subprocess.run(
                    [_tool("losetup"), "-d", self.device],
                    capture_output=True,
                    timeout=60,
                    check=False,
                )
            self.device = None
        if self.image is not None:
            self.image.unlink(missing_ok=True)
            self.image = None
        if self._image_dir_made is not None:
            with contextlib.suppress(OSError):
                self._image_dir_made.rmdir()
            self._image_dir_made = None
