"""Finding the student's processes in ``/proc`` and killing all of them, provably.

A process belongs to the student when any of its real, effective, saved or filesystem uids is the
student's uid (a setuid program started by the student keeps the student's real uid). Zombies are
ignored: they cannot run, hold no memory and disappear when their parent reaps them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from karotte.errors import StudentMisbehaviorError
from karotte.sandbox.confinement.demote import (
    DemotedCallCrashed,
    DemotedCallTimeout,
    Identity,
    run_as,
)


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    uids: tuple[int, ...]
    state: str
    rss_bytes: int


def _read_status(pid: int) -> ProcInfo | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            raw = handle.read(8192)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    except OSError:
        return None
    uids: tuple[int, ...] = ()
    state = "?"
    rss = 0
    for line in raw.decode("ascii", "replace").splitlines():
        if line.startswith("Uid:"):
            uids = tuple(int(part) for part in line.split()[1:5])
        elif line.startswith("State:"):
            parts = line.split()
            state = parts[1] if len(parts) > 1 else "?"
        elif line.startswith("VmRSS:"):
            parts = line.split()
            rss = int(parts[1]) * 1024 if len(parts) > 1 else 0
    return ProcInfo(pid, uids, state, rss)


def all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def processes_of_uid(uid: int, include_zombies: bool = False) -> list[ProcInfo]:
    """Every live process with ``uid`` as its real, effective, saved or filesystem uid."""
    found = []
    for pid in all_pids():
        if pid == os.getpid():
            continue
        info = _read_status(pid)
        if info is None or uid not in info.uids:
            continue
        if not include_zombies and info.state in ("Z", "X"):
            continue
        found.append(info)
    return found


def _kill_minus_one() -> bool:
    # kill(-1) from inside the uid: every process the uid may signal, all at once, atomically
    # with respect to fork (the kernel walks the task list under a lock).
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)
    return True


def kill_all_as(uid: int, gid: int) -> bool:
    """``kill(-1, SIGKILL)`` from a child demoted to ``uid``; False when that child failed."""
    identity = Identity(name=str(uid), uid=uid, gid=gid, home="/")
    try:
        return run_as(identity, _kill_minus_one, timeout_s=2.0)
    except (DemotedCallCrashed, DemotedCallTimeout, OSError, RuntimeError):
        return False


@dataclass
class ReapReport:
    """What killing the student's processes took."""

    rounds: int = 0
    killed_pids: set[int] = field(default_factory=set)
    duration_s: float = 0.0
    mechanisms: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "rounds": self.rounds,
            "killed": len(self.killed_pids),
            "duration_s": round(self.duration_s, 3),
            "mechanisms": self.mechanisms,
        }


def kill_student_processes(
    uid: int,
    gid: int,
    timeout_s: float = 10.0,
    cgroup_kill: Callable[[], None] | None = None,
    exclude: Iterable[int] = (),
) -> ReapReport:
    """Kill every process of ``uid`` and prove none is left, or raise misbehaviour.

    Each round: kill the whole student cgroup (``cgroup_kill``, freeze + SIGKILL), then
    ``kill(-1, SIGKILL)`` from a child demoted to the uid, then SIGKILL to every process a
    ``/proc`` sweep finds. Rounds repeat until a sweep finds nothing (twice in a row, so a fork
    that raced the sweep is caught). A cohort still alive after ``timeout_s`` is misbehaviour.
    """
    if uid == 0:
        raise ValueError("refusing to kill every process of uid 0")
    report = ReapReport()
    excluded = set(exclude)
    started = time.monotonic()
    deadline = started + timeout_s
    clean_sweeps = 0
    while True:
        report.rounds += 1
        if cgroup_kill is not None:
            try:
                cgroup_kill()
            except OSError:
                pass
            else:
                if "cgroup" not in report.mechanisms:
                    report.mechanisms.append("cgroup")
        if kill_all_as(uid, gid) and "kill(-1) as student" not in report.mechanisms:
            report.mechanisms.append("kill(-1) as student")
        survivors = [p for p in processes_of_uid(uid) if p.pid not in excluded]
        for proc in survivors:
            if kill_if_owned(proc.pid, uid):
                report.killed_pids.add(proc.pid)
        if survivors and "/proc sweep" not in report.mechanisms:
            report.mechanisms.append("/proc sweep")
        # give the kernel a moment to tear the killed processes down before the next proof
        _wait_gone([p.pid for p in survivors], 0.2)
        remaining = [p for p in processes_of_uid(uid) if p.pid not in excluded]
        clean_sweeps = clean_sweeps + 1 if not remaining else 0
        if clean_sweeps >= 2:
            break
        if time.monotonic() > deadline:
            pids = ", ".join(str(p.pid) for p in remaining[:20])
            raise StudentMisbehaviorError(
                f"student processes survived {report.rounds} kill rounds in {timeout_s:g}s "
                f"({len(remaining)} left: {pids})"
            )
        if remaining:
            time.sleep(0.01)
    report.duration_s = time.monotonic() - started
    return report


def kill_if_owned(pid: int, uid: int) -> bool:
    """SIGKILL ``pid`` only if it still belongs to ``uid`` (a pidfd pins it against pid reuse)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        info = _read_status(pid)
        if info is None or uid not in info.uids:
            return False
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(pidfd)


def _wait_gone(pids: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(pids)
    while pending and time.monotonic() < deadline:
        pending = [p for p in pending if (info := _read_status(p)) and info.state not in ("Z", "X")]
        if pending:
            time.sleep(0.005)
