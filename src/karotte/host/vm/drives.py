"""The drives of a VM sandbox.

* **root** (read-only, shared): the built image, ``docker export``-ed and turned into an ext4 file
  system with ``mkfs.ext4 -d``; cached by image id under ``<cache>/root/``. A VM holds a shared
  ``flock`` on its root drive for as long as it runs (the VMM inherits the descriptor), so
  eviction (least recently used first, down to a size bound) never removes a drive in use.
* **scratch** (per run, sparse): an empty ext4 of the disk budget (+ room for the overlay's
  copy-ups); the guest's root is an overlay of root (lower) and scratch (upper).
* **in** (per run, read-only in the guest): ``vm.json`` (command, environment, limits, mounts) and a
  copy of every host mount (``/out`` with the run config too).
* **out** (per run, raw): the guest writes its read-write mounts there as one tar of regular files;
  :func:`extract_out` takes back only regular files that are new or changed, never following or
  creating links, never outside the mount's source.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from karotte.errors import RuntimeUnavailableError

MIB = 1024**2
GIB = 1024**3
DEFAULT_CACHE_BYTES = 20 * GIB
ROOT_SLACK = 256 * MIB  # free room on the read-only root (the overlay takes the writes)
# on top of the disk budget (the student's loop-mounted /workdir): the harness's /var/tmp quota
# (1 GiB), copy-ups of the root, /out and the transcript; sparse, so unused room costs nothing
SCRATCH_EXTRA = 2 * GIB


class DriveError(RuntimeUnavailableError):
    """A drive could not be built (the message says which tool failed and how)."""


def _run(argv: list[str], what: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    try:
        proc = subprocess.run(argv, capture_output=True, check=False, **kwargs)
    except FileNotFoundError as exc:
        raise DriveError(f"{what}: {argv[0]} is not installed (scripts/setup-vm.sh)") from exc
    if proc.returncode != 0:
        raise DriveError(f"{what} failed: {proc.stderr.decode(errors='replace').strip()[-2000:]}")
    return proc


def tree_bytes(path: Path) -> tuple[int, int]:
    """(bytes, entries) of a directory tree, without following links."""
    total, count = 0, 0
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            count += 1
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total, count


def make_ext4(
    target: Path, size: int, label: str, source: Path | None = None, inodes: int = 0
) -> None:
    """A sparse ext4 image of ``size`` bytes, filled from ``source`` (``mkfs.ext4 -d``)."""
    target.unlink(missing_ok=True)
    with open(target, "wb") as handle:
        handle.truncate(size)
    argv = ["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-L", label]
    argv += ["-E", "lazy_itable_init=1,nodiscard"]
    if inodes:
        argv += ["-N", str(inodes)]
    if source is not None:
        argv += ["-d", str(source)]
    _run([*argv, str(target)], f"mkfs.ext4 of the {label} drive")


# ---- the root drive ------------------------------------------------------------------------------
@dataclass(frozen=True)
class RootDrive:
    path: Path
    image_id: str
    env: list[str]
    workdir: str
    user: str


def image_config(engine: str, image: str) -> tuple[str, dict[str, Any]]:
    proc = _run(
        [engine, "image", "inspect", "--format", "{{json .}}", image], f"inspecting {image}"
    )
    data: dict[str, Any] = json.loads(proc.stdout)
    config: dict[str, Any] = data.get("Config") or {}
    return str(data["Id"]), config


def _key(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:24]


def root_drive(image: str, cache: Path, engine: str = "docker") -> RootDrive:
    """The image's root drive, exported and built once (concurrent callers wait for one build)."""
    image_id, config = image_config(engine, image)
    directory = cache / "root"
    directory.mkdir(parents=True, exist_ok=True)
    key = _key(image_id)
    path = directory / f"{key}.ext4"
    meta = directory / f"{key}.json"
    with open(directory / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path.is_file() and meta.is_file()):
            _build_root(engine, image, path)
            meta.write_text(json.dumps({"image_id": image_id, "image": image, "config": config}))
    touch_used(path)
    return RootDrive(
        path=path,
        image_id=image_id,
        env=list(config.get("Env") or []),
        workdir=str(config.get("WorkingDir") or ""),
        user=str(config.get("User") or ""),
    )


def _build_root(engine: str, image: str, target: Path) -> None:
    staging = Path(tempfile.mkdtemp(prefix=".export-", dir=target.parent))
    container = ""
    try:
        created = _run([engine, "create", image, "true"], f"{engine} create {image}")
        container = created.stdout.decode().strip()
        cid = container
        export = subprocess.Popen([engine, "export", cid], stdout=subprocess.PIPE)
        assert export.stdout is not None
        untar = subprocess.run(
            ["tar", "-x", "--numeric-owner", "-p", "-C", str(staging)],
            stdin=export.stdout,
            capture_output=True,
            check=False,
        )
        export.stdout.close()
        if export.wait() != 0 or untar.returncode != 0:
            raise DriveError(
                f"exporting {image} failed: {untar.stderr.decode(errors='replace')[-1000:]}"
            )
        for name in ("proc", "sys", "dev", "run", "tmp"):
            (staging / name).mkdir(exist_ok=True)
        size, entries = tree_bytes(staging)
        total = int(size * 1.15) + ROOT_SLACK
        total -= total % 4096
        partial = target.with_suffix(".partial")
        make_ext4(partial, total, "karotte-root", staging, inodes=entries + 65536)
        os.replace(partial, target)
    finally:
        if container:
            subprocess.run([engine, "rm", "-f", container], capture_output=True, check=False)
        shutil.rmtree(staging, ignore_errors=True)


def touch_used(path: Path) -> None:
    now = time.time()
    with contextlib.suppress(OSError):
        os.utime(path, (now, now))


def hold(path: Path) -> int:
    """A descriptor holding a shared lock on ``path`` (inherit it into the VMM: in use)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def in_use(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def evict(
    cache: Path, max_bytes: int = DEFAULT_CACHE_BYTES, keep: Path | None = None
) -> list[Path]:
    """Remove least recently used root drives until they take at most ``max_bytes`` on disk;
    a drive in use (a VM holds its lock) or ``keep`` is never removed. Returns what went."""
    directory = cache / "root"
    drives = sorted(directory.glob("*.ext4"), key=lambda p: p.stat().st_mtime)
    total = sum(p.stat().st_blocks * 512 for p in drives)
    removed: list[Path] = []
    for drive in drives:
        if total <= max_bytes:
            break
        if keep is not None and drive == keep:
            continue
        fd = os.open(drive, os.O_RDONLY | os.O_CLOEXEC)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a VM runs on it
            used = drive.stat().st_blocks * 512
            drive.unlink()
            drive.with_suffix(".json").unlink(missing_ok=True)
            total -= used
            removed.append(drive)
        finally:
            os.close(fd)
    return removed


# ---- the per-run drives --------------------------------------------------------------------------
def scratch_drive(path: Path, disk_bytes: int) -> None:
    size = disk_bytes + SCRATCH_EXTRA
    make_ext4(path, size - size % 4096, "karotte-scratch")


def out_drive(path: Path, size: int) -> None:
    path.unlink(missing_ok=True)
    with open(path, "wb") as handle:
        handle.truncate(max(size, 64 * MIB))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _sockets(directory: str, names: list[str]) -> set[str]:
    return {n for n in names if stat.S_ISSOCK(os.lstat(os.path.join(directory, n)).st_mode)}


def in_drive(
    path: Path, vm_config: dict[str, Any], mounts: list[tuple[Path, str, bool]]
) -> dict[str, str]:
    """The io drive: ``vm.json`` plus a copy of each ``(source, target, read_only)`` mount as
    ``mounts/<i>``. Returns the manifest (``<i>/<relpath>`` → sha256) of the regular files copied
    in, so that only files the guest changed come back."""
    staging = Path(tempfile.mkdtemp(prefix=".in-", dir=path.parent))
    manifest: dict[str, str] = {}
    try:
        entries = []
        (staging / "mounts").mkdir()
        for index, (source, target, read_only) in enumerate(mounts):
            dest = staging / "mounts" / str(index)
            if source.is_dir():
                # sockets are forwarded, not copied (karotte.host.vm.socket_forward)
                shutil.copytree(source, dest, symlinks=True, ignore=_sockets)
                for root, _dirs, files in os.walk(dest):
                    for name in files:
                        file = Path(root) / name
                        if file.is_file() and not file.is_symlink():
                            manifest[f"{index}/{file.relative_to(dest)}"] = _sha256(file)
            else:
                shutil.copy2(source, dest)
                manifest[str(index)] = _sha256(dest)
            entries.append({"source": f"mounts/{index}", "target": target, "read_only": read_only})
        (staging / "vm.json").write_text(json.dumps({**vm_config, "mounts": entries}))
        os.chmod(staging / "vm.json", 0o600)
        size, count = tree_bytes(staging)
        total = int(size * 1.2) + 16 * MIB
        make_ext4(path, total - total % 4096, "karotte-in", staging, inodes=count + 1024)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest


def _safe_parent(base: Path, rel: PurePosixPath) -> Path | None:
    """``base/rel``'s parent, created as real directories (no component may be a link)."""
    current = base
    for part in rel.parts[:-1]:
        current = current / part
        if current.is_symlink():
            return None
        if not current.exists():
            current.mkdir(mode=0o755)
        elif not current.is_dir():
            return None
    return current


def extract_out(
    raw: Path, sources: dict[int, Path], manifest: dict[str, str], max_bytes: int
) -> list[str]:
    """Copy the guest's files back into the read-write mounts' sources (``index`` → host path).

    Only regular files, only new or changed ones (against ``manifest``), never through a link,
    at most ``max_bytes`` in all. Returns the problems (skipped members), if any."""
    problems: list[str] = []
    written = 0
    try:
        tar = tarfile.open(raw, mode="r:")  # noqa: SIM115 (closed by the with below)
    except tarfile.TarError as exc:
        return [f"no readable /out archive: {exc}"]
    with tar:
        while True:
            try:
                member = tar.next()
            except tarfile.TarError as exc:
                problems.append(f"archive ends early: {exc}")
                break
            if member is None:
                break
            name = PurePosixPath(member.name)
            if not member.isreg():
                continue
            if name.is_absolute() or ".." in name.parts or not name.parts:
                problems.append(f"refused {member.name!r}")
                continue
            try:
                index = int(name.parts[0])
            except ValueError:
                problems.append(f"refused {member.name!r}")
                continue
            if index not in sources:
                continue
            rel = PurePosixPath(*name.parts[1:]) if len(name.parts) > 1 else None
            key = member.name if rel is not None else str(index)
            written += member.size
            if written > max_bytes:
                problems.append(f"/out larger than {max_bytes} bytes: the rest is dropped")
                break
            handle = tar.extractfile(member)
            if handle is None:
                continue
            data_digest = hashlib.sha256()
            source = sources[index]
            if rel is None:
                dest_dir, dest = source.parent, source
            else:
                parent = _safe_parent(source, rel)
                if parent is None:
                    problems.append(f"refused {member.name!r}: a path component is not a directory")
                    continue
                dest_dir, dest = parent, parent / rel.name
            fd, tmp = tempfile.mkstemp(dir=dest_dir, prefix=".karotte-out-")
            try:
                with os.fdopen(fd, "wb") as out:
                    for chunk in iter(lambda: handle.read(1 << 20), b""):  # noqa: B023
                        data_digest.update(chunk)
                        out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
                if manifest.get(key) == data_digest.hexdigest():
                    os.unlink(tmp)  # unchanged in the guest: the host's copy may be newer
                    continue
                os.chmod(tmp, member.mode & 0o755 or 0o644)
                os.replace(tmp, dest)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                problems.append(f"{member.name}: {exc}")
    return problems
