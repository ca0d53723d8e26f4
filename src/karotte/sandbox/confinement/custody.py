"""Custody of submissions: judges only see a root-only copy, taken after the student is gone.

:func:`collect_submission` (what the harness calls before scoring a step with
``submission_paths``) does, in order:

1. kill every process of the student uid and *prove* they are gone (cgroup freeze+kill,
   ``kill(-1)`` from inside the uid, a ``/proc`` sweep, repeated; see ``processes``);
2. delete the student's other files in shared temp dirs and its SysV IPC objects (``cleanup``);
3. copy each submission into a fresh root-only directory under ``config.artifacts_dir`` with
   :func:`save_submission`, refusing anything that is not plain data;
4. return ``{student path: copy}``.

Every refusal is a :class:`StudentMisbehaviorError` with a precise reason (score 0, recorded).
A *missing* submission is not misbehaviour: its key maps to a path inside the custody directory
that does not exist, so a judge sees exactly what the student left: nothing. Each custody
directory holds a ``custody.json`` manifest of what was copied or missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import stat
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from karotte.config import EvaluationRunConfig
from karotte.errors import KarotteError, StudentMisbehaviorError
from karotte.sandbox.confinement.cleanup import (
    DEFAULT_CLEANUP_DIRS,
    remove_student_files,
    remove_student_ipc,
)
from karotte.sandbox.confinement.demote import Identity, student_identity
from karotte.sandbox.confinement.processes import kill_student_processes

MIB = 1 << 20

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_KIND = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFLNK: "a symbolic link",
}


class CustodyOptions(BaseModel):
    """Bounds of custody. Defaults fit typical answers (files or small project trees)."""

    model_config = ConfigDict(extra="forbid")

    max_depth: int = Field(default=32, ge=1)
    max_entries: int = Field(default=10_000, ge=1)
    max_total_bytes: int = Field(default=512 * MIB, ge=0)
    max_file_bytes: int = Field(default=256 * MIB, ge=0)
    sparse_min_bytes: int = Field(default=16 * MIB, ge=0)
    sparse_min_allocated_ratio: float = Field(default=0.125, ge=0, le=1)
    kill_timeout_s: float = Field(default=10.0, gt=0)
    cleanup: bool = True
    cleanup_dirs: list[str] = Field(default_factory=lambda: list(DEFAULT_CLEANUP_DIRS))
    cleanup_max_entries: int = Field(default=200_000, ge=0)
    cleanup_timeout_s: float = Field(default=20.0, gt=0)


class CustodyError(KarotteError):
    """Custody itself failed for a reason that is not the student's (e.g. artifacts dir unsafe)."""


class _Missing(Exception):
    pass


class _Budget:
    def __init__(self, options: CustodyOptions) -> None:
        self.options = options
        self.entries = 0
        self.bytes = 0

    def entry(self, path: str) -> None:
        self.entries += 1
        if self.entries > self.options.max_entries:
            raise StudentMisbehaviorError(
                f"submission {path}: more than {self.options.max_entries} files and directories"
            )

    def take(self, path: str, size: int) -> None:
        self.bytes += size
        if self.bytes > self.options.max_total_bytes:
            raise StudentMisbehaviorError(
                f"submission {path}: submissions total more than "
                f"{self.options.max_total_bytes} bytes"
            )


def _refuse(path: str, what: str) -> StudentMisbehaviorError:
    return StudentMisbehaviorError(f"submission {path}: {what}")


def _open_parent(path: str) -> tuple[int, str]:
    """Open the directory holding ``path`` walking from ``/`` without following any symlink."""
    parts = [p for p in path.split("/") if p]
    if not parts:
        raise _refuse(path, "is the root directory")
    fd = os.open("/", _DIR_FLAGS)
    try:
        for index, part in enumerate(parts[:-1]):
            here = "/" + "/".join(parts[: index + 1])
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                raise _Missing from None
            if stat.S_ISLNK(st.st_mode):
                target = _readlink(fd, part)
                raise _refuse(path, f"parent directory {here} is a symbolic link (to {target})")
            if not stat.S_ISDIR(st.st_mode):
                raise _Missing
            next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


def _readlink(dir_fd: int, name: str) -> str:
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return "?"


def _check_entry(path: str, st: os.stat_result, options: CustodyOptions) -> None:
    """Refuse everything but regular files and directories, hard links and sparse monsters."""
    fmt = stat.S_IFMT(st.st_mode)
    if fmt in _KIND:
        raise _refuse(path, f"is {_KIND[fmt]}, not a regular file")
    if fmt == stat.S_IFDIR:
        return
    if fmt != stat.S_IFREG:
        raise _refuse(path, "is not a regular file")
    if st.st_nlink > 1:
        raise _refuse(
            path,
            f"is a hard link ({st.st_nlink} names for one file); it may point at a file "
            "outside the submission",
        )
    if st.st_size > options.max_file_bytes:
        raise _refuse(path, f"is {st.st_size} bytes, more than {options.max_file_bytes}")
    allocated = st.st_blocks * 512
    if (
        st.st_size >= options.sparse_min_bytes
        and allocated < st.st_size * options.sparse_min_allocated_ratio
    ):
        raise _refuse(
            path, f"is a sparse file ({st.st_size} bytes long, {allocated} bytes allocated)"
        )


def _copy_file(
    src_dir: int, name: str, dst_dir: int, path: str, options: CustodyOptions, budget: _Budget
) -> int:
    src = os.open(name, _READ_FLAGS, dir_fd=src_dir)
    try:
        st = os.fstat(src)
        _check_entry(path, st, options)  # again, on what we really opened
        budget.take(path, st.st_size)
        dst = os.open(
            name,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=dst_dir,
        )
        copied = 0
        try:
            while chunk := os.read(src, min(1 << 20, st.st_size + 1 - copied)):
                copied += len(chunk)
                if copied > st.st_size:
                    raise _refuse(path, "grew while it was being copied")
                view = memoryview(chunk)
                while view:
                    view = view[os.write(dst, view) :]
            os.fsync(dst)
        finally:
            os.close(dst)
        return copied
    finally:
        os.close(src)


def _copy_entry(
    src_dir: int,
    name: str,
    dst_dir: int,
    path: str,
    options: CustodyOptions,
    budget: _Budget,
    depth: int,
) -> int:
    budget.entry(path)
    st = os.stat(name, dir_fd=src_dir, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, f"is a symbolic link (to {_readlink(src_dir, name)})")
    _check_entry(path, st, options)
    if not stat.S_ISDIR(st.st_mode):
        return _copy_file(src_dir, name, dst_dir, path, options, budget)
    if depth >= options.max_depth:
        raise _refuse(path, f"directory tree is deeper than {options.max_depth} levels")
    sub_src = os.open(name, _DIR_FLAGS, dir_fd=src_dir)
    try:
        os.mkdir(name, 0o700, dir_fd=dst_dir)
        sub_dst = os.open(name, _DIR_FLAGS, dir_fd=dst_dir)
        try:
            total = 0
            with os.scandir(sub_src) as entries:
                for count, entry in enumerate(entries):
                    if count >= options.max_entries:
                        raise _refuse(path, f"holds more than {options.max_entries} entries")
                    total += _copy_entry(
                        sub_src,
                        entry.name,
                        sub_dst,
                        f"{path}/{entry.name}",
                        options,
                        budget,
                        depth + 1,
                    )
            return total
        finally:
            os.close(sub_dst)
    finally:
        os.close(sub_src)


def _make_dirs(base_fd: int, relative: list[str]) -> int:
    """mkdir -p below ``base_fd`` (root-only, no symlinks); returns an fd of the last dir."""
    fd = os.dup(base_fd)
    for part in relative:
        with contextlib.suppress(FileExistsError):
            os.mkdir(part, 0o700, dir_fd=fd)
        next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
        os.close(fd)
        fd = next_fd
    return fd


def _absolute(path: str, base: str) -> str:
    joined = path if path.startswith("/") else os.path.join(base, path)
    return os.path.normpath(joined).replace("//", "/")


def save_submission(
    paths: list[str],
    destination: Path,
    *,
    base_dir: str | None = None,
    options: CustodyOptions | None = None,
) -> dict[str, Path]:
    """Copy each submission path into ``destination`` (created 0700) and return the copies.

    Relative paths are taken relative to ``base_dir`` (default: the current directory). Does not
    kill anything: call it only when nothing can modify the paths any more (see
    :func:`collect_submission`). Raises :class:`StudentMisbehaviorError` on a symlink (anywhere
    in the path), FIFO, socket, device, hard link, oversized or sparse file, or a directory tree
    too deep or too big. A missing path maps to a copy path that does not exist.
    """
    options = options or CustodyOptions()
    base = base_dir or os.getcwd()
    destination = Path(os.path.abspath(destination))
    dest_fd = _private_dir(destination)
    budget = _Budget(options)
    result: dict[str, Path] = {}
    manifest: dict[str, dict[str, object]] = {}
    try:
        for original in paths:
            path = _absolute(original, base)
            relative = [p for p in path.split("/") if p]
            copy = destination.joinpath(*relative) if relative else destination
            result[original] = copy
            try:
                src_dir, name = _open_parent(path)
            except _Missing:
                manifest[original] = {"status": "missing", "resolved": path}
                continue
            try:
                if not _exists(src_dir, name):
                    manifest[original] = {"status": "missing", "resolved": path}
                    continue
                dst_dir = _make_dirs(dest_fd, relative[:-1])
                try:
                    size = _copy_entry(src_dir, name, dst_dir, path, options, budget, 0)
                finally:
                    os.close(dst_dir)
                manifest[original] = {"status": "copied", "resolved": path, "bytes": size}
            finally:
                os.close(src_dir)
        _write_manifest(dest_fd, manifest)
    finally:
        os.close(dest_fd)
    return result


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _write_manifest(dest_fd: int, manifest: dict[str, dict[str, object]]) -> None:
    data = json.dumps(manifest, indent=2).encode() + b"\n"
    fd = os.open(
        "custody.json",
        os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
        dir_fd=dest_fd,
    )
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _private_dir(path: Path) -> int:
    """Create ``path`` as a 0700 directory of ours (parents as needed) and return an fd to it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise CustodyError(f"custody directory {path} is a symlink or not a directory") from exc
        raise
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        os.close(fd)
        raise CustodyError(f"custody directory {path} is owned by uid {st.st_uid}, not by us")
    os.fchmod(fd, 0o700)
    return fd


def new_custody_dir(artifacts_dir: Path) -> Path:
    """A fresh ``submissions-NNN`` directory below ``artifacts_dir`` (both root-only)."""
    artifacts_dir = Path(os.path.abspath(artifacts_dir))
    fd = _private_dir(artifacts_dir)
    try:
        for number in range(1, 100_000):
            name = f"submissions-{number:03d}"
            try:
                os.mkdir(name, 0o700, dir_fd=fd)
            except FileExistsError:
                continue
            return artifacts_dir / name
    finally:
        os.close(fd)
    raise CustodyError(f"no free custody directory name in {artifacts_dir}")


def secure_student(
    identity: Identity, keep: list[str], options: CustodyOptions | None = None
) -> dict[str, object]:
    """Kill every student process (proven), then delete its temp files and SysV IPC objects."""
    from karotte.sandbox.confinement.limits import active_limits

    options = options or CustodyOptions()
    applied = active_limits()
    cgroup_kill = applied.cgroup_kill() if applied is not None else None
    reaped = kill_student_processes(
        identity.uid, identity.gid, timeout_s=options.kill_timeout_s, cgroup_kill=cgroup_kill
    )
    summary: dict[str, object] = {"reaped": reaped.as_dict()}
    if options.cleanup:
        files = remove_student_files(
            identity.uid,
            options.cleanup_dirs,
            keep=keep,
            max_entries=options.cleanup_max_entries,
            timeout_s=options.cleanup_timeout_s,
        )
        summary["cleanup"] = files.as_dict()
        summary["ipc_removed"] = remove_student_ipc(identity.uid)
    return summary


def collect_submission(
    config: EvaluationRunConfig, paths: list[str], options: CustodyOptions | None = None
) -> dict[str, Path]:
    """Take the submissions into custody; return ``{student path: root-only copy}``.

    With ``config.student_user`` set (inside a sandbox), first kills every student process and
    cleans up after it (see the module doc). Without it (local development) only the safe copy
    is made. Raises :class:`StudentMisbehaviorError` when the student tampered. Options default
    to ``config.extra_config["custody"]`` (a :class:`CustodyOptions` dict), else the defaults.
    """
    if options is None:
        raw = config.extra_config.get("custody")
        options = CustodyOptions.model_validate(raw) if isinstance(raw, dict) else CustodyOptions()
    identity = student_identity(config.student_user) if config.student_user else None
    base = identity.home if identity is not None else os.getcwd()
    absolute = [_absolute(p, base) for p in paths]
    if identity is not None and os.geteuid() != 0:
        raise CustodyError(
            f"student_user is {identity.name!r} but the harness runs as uid {os.geteuid()}: "
            "custody needs root to kill the student's processes (unset student_user locally)"
        )
    if identity is not None:
        secure_student(identity, absolute, options)
    destination = new_custody_dir(config.artifacts_dir)
    return save_submission(paths, destination, base_dir=base, options=options)


async def collect_submission_async(
    config: EvaluationRunConfig, paths: list[str], options: CustodyOptions | None = None
) -> dict[str, Path]:
    """:func:`collect_submission` off the event loop (it blocks on /proc sweeps and copies)."""
    return await asyncio.to_thread(collect_submission, config, paths, options)
