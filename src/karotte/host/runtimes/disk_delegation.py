"""The student's disk quota made on the host, for sandboxes that cannot make their own.

Inside a runc container the harness loop-mounts a size- and inode-limited ext4 over the
student's writable directories itself (``karotte.sandbox.confinement.disk``). gVisor has no loop
devices, so there the launcher does it, as host root, before the sandbox starts:

* the image's content of each directory (the student's home, ``/var/tmp``) is copied out once per
  image id (``<engine> cp``) into a root-only seed directory;
* per run, an ext4 image sized to the disk budget with a bounded inode count is made from that
  seed (``mkfs.ext4 -d``), loop-mounted ``nosuid,nodev`` under ``/var/lib/karotte/disks/<run>/``
  and bind-mounted over the directory in the sandbox;
* ``KAROTTE_DISK_MOUNTS`` tells the harness which directories are already bounded and by how
  much; the harness checks the mount (``statvfs``) and records the mechanism in the transcript;
* after the run, the launcher unmounts and deletes everything; a run dir whose launcher died is
  reaped by the next ``karotte run`` or ``karotte clean`` (``owner.json`` names the launcher).

Writes past the quota fail with ``ENOSPC`` in the sandbox; nothing the student writes reaches
the host's own disk beyond the image's size.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from karotte.host.runtimes.base import Mount
from karotte.host.runtimes.oci_cli import OciCliRuntime
from karotte.sandbox.confinement.disk import ext4_image_bytes, usage
from karotte.sandbox.confinement.sanitize import UntrustedBinaryError, resolve_system_binary

DISK_ROOT_ENV = "KAROTTE_DISK_ROOT"
DISK_MOUNTS_ENV = "KAROTTE_DISK_MOUNTS"  # JSON list of SandboxDisk, read by the harness
DEFAULT_INODES = 200_000
MIB = 1 << 20
SEED_MAX_AGE_S = 7 * 24 * 3600.0
MECHANISM = "loop-mounted ext4 on the host (size and inode count), bind-mounted by the launcher"


def disk_root() -> Path:
    return Path(os.environ.get(DISK_ROOT_ENV, "/var/lib/karotte/disks"))


class SandboxDisk(BaseModel):
    """One bounded directory, as the harness sees it."""

    model_config = ConfigDict(extra="forbid")

    path: str  # in the sandbox
    bytes: int  # free bytes the student gets
    inodes: int  # free files the student gets
    mechanism: str = MECHANISM


class HostDisk(SandboxDisk):
    image: Path
    mountpoint: Path


class DiskDelegation(BaseModel):
    """What was made on the host for one run (and must be removed after it)."""

    model_config = ConfigDict(extra="forbid")

    run_name: str
    run_dir: Path
    disks: list[HostDisk]

    def mounts(self) -> list[Mount]:
        return [Mount(source=d.mountpoint, target=d.path) for d in self.disks]

    def env(self) -> dict[str, str]:
        plain = [
            SandboxDisk(path=d.path, bytes=d.bytes, inodes=d.inodes, mechanism=d.mechanism)
            for d in self.disks
        ]
        return {DISK_MOUNTS_ENV: json.dumps([d.model_dump() for d in plain])}


def _tool(name: str) -> str | None:
    """A system binary from a root-owned directory (the rule the harness follows too)."""
    try:
        return resolve_system_binary(name)
    except UntrustedBinaryError:
        return None


def unavailable_reason() -> str | None:
    """None when the host can make loop-mounted quotas, else why not (with the fix)."""
    if os.geteuid() != 0:
        return "the launcher is not root, so it cannot loop-mount a quota filesystem"
    if not os.path.exists("/dev/loop-control"):
        return "the host has no loop devices (/dev/loop-control; `modprobe loop`)"
    missing = [t for t in ("mkfs.ext4", "mount", "umount") if _tool(t) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install e2fsprogs mount)"
    return None


def _run(argv: list[str], what: str, timeout: float = 300) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise OSError(f"{what} failed: {(proc.stderr or proc.stdout).strip()}")


def _keep_mode(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """The "tar" filter's checks (no absolute names, nothing outside ``dest``, also through an
    extracted symlink) without its mode changes: the copy must keep the image's modes exactly
    (a sticky, group-writable home; ``/var/tmp`` 1777)."""
    checked = tarfile.tar_filter(member, dest)
    return checked.replace(mode=member.mode, deep=False)


def _extract(archive: bytes, dest: Path) -> None:
    """Unpack an ``<engine> cp`` archive as root, keeping numeric owners and modes."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, numeric_owner=True, filter=_keep_mode)  # noqa: S202 (filtered)


def _student_entry(passwd: str, user: str) -> tuple[int, int, str] | None:
    for line in passwd.splitlines():
        fields = line.split(":")
        if len(fields) >= 6 and fields[0] == user:
            try:
                return int(fields[2]), int(fields[3]), fields[5]
            except ValueError:
                return None
    return None


class Seed(BaseModel):
    """An image's student-writable directories, copied out once per image id."""

    model_config = ConfigDict(extra="forbid")

    uid: int
    gid: int
    home: str
    trees: dict[str, Path]  # sandbox path -> local copy of its content (the directory itself)


def seed_for(runtime: OciCliRuntime, image: str, user: str) -> Seed:
    """The student's home and ``/var/tmp`` from ``image`` (cached by image id; root-only)."""
    image_id = runtime.image_id(image).replace("sha256:", "")[:32]
    seeds = disk_root() / ".seed"
    seeds.mkdir(parents=True, exist_ok=True)
    os.chmod(disk_root(), 0o700)
    done = seeds / image_id / f"seed-{user}.json"
    _evict_old_seeds(seeds, keep=image_id)
    if done.exists():
        os.utime(seeds / image_id)  # recently used: not evicted
        return Seed.model_validate_json(done.read_text())
    copied = runtime.copy_from_image(image, ["/etc/passwd"])
    entry = None
    if copied["/etc/passwd"] is not None:
        with tarfile.open(fileobj=io.BytesIO(copied["/etc/passwd"])) as tar:
            member = tar.extractfile("passwd")
            if member is not None:
                entry = _student_entry(member.read().decode(errors="replace"), user)
    if entry is None:
        raise OSError(f"image {image} has no user {user!r} in /etc/passwd")
    uid, gid, home = entry
    paths = [home, "/var/tmp"] if home not in ("", "/") else ["/var/tmp"]
    archives = runtime.copy_from_image(image, paths)
    staging = Path(tempfile.mkdtemp(prefix=f"{image_id}.", dir=seeds))
    trees: dict[str, Path] = {}
    final = seeds / image_id
    for index, path in enumerate(paths):
        archive = archives.get(path)
        if archive is None:
            continue
        unpack = staging / str(index)
        unpack.mkdir()
        _extract(archive, unpack)
        # the archive holds the directory itself under its base name
        trees[path] = final / str(index) / Path(path).name
    seed = Seed(uid=uid, gid=gid, home=home, trees=trees)
    (staging / done.name).write_text(seed.model_dump_json())
    try:
        staging.rename(final)
    except OSError:  # another launcher won the race: use its copy
        shutil.rmtree(staging, ignore_errors=True)
        if not done.exists():
            raise
        return Seed.model_validate_json(done.read_text())
    return seed


def _evict_old_seeds(seeds: Path, keep: str, max_age_s: float = SEED_MAX_AGE_S) -> None:
    """Seeds of images not run for ``max_age_s`` go (a later run of such an image copies it
    again). Half-made staging dirs of a crashed launcher go after the same time."""
    for entry in seeds.iterdir():
        if entry.name != keep and dir_age_s(entry) > max_age_s:
            shutil.rmtree(entry, ignore_errors=True)


def _make_disk(
    run_dir: Path, index: int, target: str, source: Path | None, budget: int, inodes: int
) -> HostDisk:
    image = run_dir / f"{index}.ext4"
    mountpoint = run_dir / f"{index}.mnt"
    mountpoint.mkdir(mode=0o700)
    existing_bytes, existing_files = usage(source) if source is not None else (0, 0)
    with open(image, "xb") as handle:
        handle.truncate(ext4_image_bytes(budget, existing_bytes, inodes + existing_files + 16))
    mkfs = _tool("mkfs.ext4") or "mkfs.ext4"
    argv = [mkfs, "-q", "-F", "-m", "0", "-O", "^has_journal"]
    argv += ["-N", str(inodes + existing_files + 16)]
    if source is not None:
        argv += ["-d", str(source)]
    _run([*argv, str(image)], "mkfs.ext4")
    _run(
        [_tool("mount") or "mount", "-o", "loop,nosuid,nodev", str(image), str(mountpoint)],
        f"loop-mounting {image}",
    )
    return HostDisk(path=target, bytes=budget, inodes=inodes, image=image, mountpoint=mountpoint)


def delegate(
    runtime: OciCliRuntime,
    image: str,
    run_name: str,
    owner: dict[str, str],
    disk_bytes: int,
    user: str = "student",
    inodes: int = DEFAULT_INODES,
) -> tuple[DiskDelegation | None, str]:
    """Make and mount the run's quota filesystems. Returns ``(delegation or None, why)``."""
    why = unavailable_reason()
    if why:
        return None, why
    run_dir = disk_root() / run_name
    try:
        seed = seed_for(runtime, image, user)
        run_dir.mkdir(mode=0o700, parents=True)
        (run_dir / "owner.json").write_text(json.dumps(owner))
        wanted = [(seed.home, disk_bytes)] if seed.home not in ("", "/") else []
        wanted.append(("/var/tmp", max(disk_bytes // 4, 16 * MIB)))
        disks: list[HostDisk] = []
        for index, (target, budget) in enumerate(wanted):
            source = seed.trees.get(target)
            disk = _make_disk(run_dir, index, target, source, max(budget, 4 * MIB), inodes)
            disks.append(disk)
            # the filesystem's root takes the directory's owner and mode (mkfs -d does not);
            # a directory the image lacks is the student's home, or sticky like /tmp
            if source is not None:
                st = os.stat(source)
                owner_ids, mode = (st.st_uid, st.st_gid), st.st_mode & 0o7777
            elif target == seed.home:
                owner_ids, mode = (seed.uid, seed.gid), 0o755
            else:
                owner_ids, mode = (0, 0), 0o1777
            os.chown(disk.mountpoint, *owner_ids)
            os.chmod(disk.mountpoint, mode)
        delegation = DiskDelegation(run_name=run_name, run_dir=run_dir, disks=disks)
    except (OSError, subprocess.SubprocessError) as exc:
        remove_run_dir(run_dir)
        return None, f"no host disk quota: {exc}"
    return delegation, MECHANISM


def _unmount(mountpoint: Path) -> bool:
    umount = _tool("umount") or "umount"
    for argv in ([umount, str(mountpoint)], [umount, "-l", str(mountpoint)]):
        proc = subprocess.run(argv, capture_output=True, timeout=60, check=False)
        if proc.returncode == 0:
            return True
    return not os.path.ismount(mountpoint)


def remove_run_dir(run_dir: Path) -> list[str]:
    """Unmount and delete one run's quota files (idempotent); returns what could not be done.
    ``mount -o loop`` sets the loop device's autoclear flag, so unmounting frees it."""
    problems: list[str] = []
    if not run_dir.is_dir():
        return problems
    for mountpoint in sorted(run_dir.glob("*.mnt")):
        if os.path.ismount(mountpoint) and not _unmount(mountpoint):
            problems.append(f"could not unmount {mountpoint}")
    if problems:
        return problems
    try:
        shutil.rmtree(run_dir)
    except OSError as exc:
        problems.append(f"could not remove {run_dir}: {exc}")
    return problems


def release(delegation: DiskDelegation) -> list[str]:
    return remove_run_dir(delegation.run_dir)


def leftover_run_dirs() -> dict[str, tuple[Path, dict[str, str]]]:
    """Every run dir on this host: name -> (dir, the labels of the launcher that made it)."""
    found: dict[str, tuple[Path, dict[str, str]]] = {}
    root = disk_root()
    if not root.is_dir():
        return found
    for run_dir in root.iterdir():
        if run_dir.name.startswith(".") or not run_dir.is_dir():
            continue
        owner: dict[str, str] = {}
        with contextlib.suppress(OSError, ValueError):
            loaded = json.loads((run_dir / "owner.json").read_text())
            if isinstance(loaded, dict):
                owner = {str(k): str(v) for k, v in loaded.items()}
        found[run_dir.name] = (run_dir, owner)
    return found


def dir_age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0
