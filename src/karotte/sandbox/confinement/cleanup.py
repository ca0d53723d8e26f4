"""Deleting what the student leaves behind: files in shared temp dirs and SysV IPC objects.

Files in ``/dev/shm`` (and any tmpfs) and SysV shared memory outlive the processes that made them
and keep holding memory; files in ``/tmp`` can carry state to the judge or the next step. After the
student's processes are dead, custody deletes every entry owned by the student uid in the
configured directories (never following a symlink, bounded in entries and time), except the
submission paths, and removes every SysV shared memory segment, semaphore set and message queue
the uid owns or created.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_CLEANUP_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue")  # missing ones are skipped

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_IPC_RMID = 0


@dataclass
class CleanupReport:
    """What was deleted; ``incomplete`` lists the reasons a sweep stopped early."""

    files_removed: int = 0
    dirs_removed: int = 0
    ipc_removed: dict[str, int] = field(default_factory=dict)
    incomplete: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "files_removed": self.files_removed,
            "dirs_removed": self.dirs_removed,
            "ipc_removed": self.ipc_removed,
            "incomplete": self.incomplete,
        }


class _Budget:
    def __init__(self, max_entries: int, timeout_s: float) -> None:
        self.left = max_entries
        self.deadline = time.monotonic() + timeout_s

    def spend(self) -> bool:
        self.left -= 1
        return self.left >= 0 and time.monotonic() < self.deadline


class _Exhausted(Exception):
    pass


def _remove_tree(parent_fd: int, name: str, report: CleanupReport, budget: _Budget) -> None:
    """Delete ``name`` (below ``parent_fd``) and everything in it, never following symlinks."""
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not budget.spend():
        raise _Exhausted
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=parent_fd)
            report.files_removed += 1
        return
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        while True:  # re-list until empty: deleting while iterating skips entries
            with os.scandir(fd) as entries:
                names = [entry.name for _, entry in zip(range(1000), entries, strict=False)]
            if not names:
                break
            for child in names:
                _remove_tree(fd, child, report, budget)
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(name, dir_fd=parent_fd)
        report.dirs_removed += 1


def _sweep(
    fd: int,
    here: str,
    uid: int,
    keep: set[str],
    report: CleanupReport,
    budget: _Budget,
    depth: int,
) -> None:
    with os.scandir(fd) as entries:
        names = [entry.name for entry in entries]
    for name in names:
        if not budget.spend():
            raise _Exhausted
        path = os.path.join(here, name)
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        kept_inside = any(k == path or k.startswith(path + "/") for k in keep)
        if kept_inside:
            if stat.S_ISDIR(st.st_mode) and path not in keep and depth < 64:
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                try:
                    _sweep(sub, path, uid, keep, report, budget, depth + 1)
                finally:
                    os.close(sub)
            continue
        if st.st_uid == uid:
            _remove_tree(fd, name, report, budget)
        elif stat.S_ISDIR(st.st_mode) and depth < 64:
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue
            try:
                _sweep(sub, path, uid, keep, report, budget, depth + 1)
            finally:
                os.close(sub)


def remove_student_files(
    uid: int,
    dirs: Iterable[str] = DEFAULT_CLEANUP_DIRS,
    keep: Iterable[str] = (),
    max_entries: int = 200_000,
    timeout_s: float = 20.0,
) -> CleanupReport:
    """Delete every entry owned by ``uid`` in ``dirs`` (recursively), except ``keep`` paths.

    Run it only after the student's processes are dead. Never follows symlinks (a symlink owned
    by the student is deleted, not its target). Stops after ``max_entries`` or ``timeout_s`` and
    says so in ``report.incomplete``.
    """
    if uid == 0:
        raise ValueError("refusing to delete files of uid 0")
    report = CleanupReport()
    keep_set = {os.path.normpath(k) for k in keep}
    budget = _Budget(max_entries, timeout_s)
    for directory in dirs:
        top = os.path.normpath(directory)
        try:
            fd = os.open(top, _DIR_FLAGS)
        except OSError:
            continue  # missing, or a symlink: nothing of ours to clean there
        try:
            _sweep(fd, top, uid, keep_set, report, budget, 0)
        except _Exhausted:
            report.incomplete.append(f"{top}: stopped after {max_entries} entries / {timeout_s:g}s")
            break
        except OSError as exc:
            report.incomplete.append(f"{top}: {exc}")
        finally:
            os.close(fd)
    return report


# ---- SysV IPC --------------------------------------------------------------------------------


def _ipc_objects(kind: str) -> list[tuple[int, int, int]]:
    """(id, uid, cuid) of every SysV IPC object of ``kind`` (shm, sem, msg) in this namespace."""
    path = Path("/proc/sysvipc") / kind
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    if not lines:
        return []
    header = lines[0].split()
    id_col = next(i for i, name in enumerate(header) if name.endswith("id") and name != "key")
    uid_col, cuid_col = header.index("uid"), header.index("cuid")
    found = []
    for line in lines[1:]:
        cols = line.split()
        if len(cols) > max(id_col, uid_col, cuid_col):
            found.append((int(cols[id_col]), int(cols[uid_col]), int(cols[cuid_col])))
    return found


def remove_student_ipc(uid: int) -> dict[str, int]:
    """Remove every SysV shm segment, semaphore set and message queue owned/created by ``uid``."""
    libc = ctypes.CDLL(None, use_errno=True)
    removed: dict[str, int] = {}
    for kind in ("shm", "sem", "msg"):
        count = 0
        for ipc_id, owner, creator in _ipc_objects(kind):
            if uid not in (owner, creator):
                continue
            if kind == "shm":
                result = libc.shmctl(ipc_id, _IPC_RMID, None)
            elif kind == "sem":
                result = libc.semctl(ipc_id, 0, _IPC_RMID)
            else:
                result = libc.msgctl(ipc_id, _IPC_RMID, None)
            if result == 0:
                count += 1
        removed[kind] = count
    return removed


def student_ipc_left(uid: int) -> list[str]:
    """SysV IPC objects still owned by ``uid`` (shm segments stay until their last detach)."""
    return [
        f"{kind}:{ipc_id}"
        for kind in ("shm", "sem", "msg")
        for ipc_id, owner, creator in _ipc_objects(kind)
        if uid in (owner, creator)
    ]
