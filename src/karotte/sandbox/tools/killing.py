"""Killing everything a shell session started, including what escaped its process group."""

from __future__ import annotations

import contextlib
import os
import signal

from karotte.sandbox.confinement.demote import Identity, run_as


def process_table() -> list[tuple[int, int, int, int]]:
    """(pid, ppid, pgid, sid) of every process we can see."""
    rows = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                raw = handle.read()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()
        try:
            rows.append((int(name), int(fields[1]), int(fields[2]), int(fields[3])))
        except (IndexError, ValueError):
            continue
    return rows


def _kill_all_of_uid() -> None:
    # kill(-1) from a process of the student's uid signals every process of that uid but itself
    os.kill(-1, signal.SIGKILL)


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return marker in handle.read().split(b"\0")
    except OSError:
        return False


def kill_session_tree(
    leader: int, identity: Identity | None, *, all_of_uid: bool, marker: bytes | None = None
) -> None:
    """SIGKILL the session led by ``leader``: its process group, session and descendants.

    Also every process whose environment holds ``marker`` (``NAME=value``: set in the shell's
    environment, inherited by everything it starts, so a double-forked ``setsid`` daemon is
    found too), and with ``all_of_uid`` (and a student identity) every process of the
    student's uid, which also catches a process that scrubbed its environment.

    ``leader`` must not have been reaped yet (a zombie is fine): its pid, which is also the
    process group and session id, must not be reusable while we kill by it.
    """
    if identity is not None and all_of_uid and identity.uid != os.getuid():
        with contextlib.suppress(Exception):
            run_as(identity, _kill_all_of_uid, timeout_s=5)
    me = os.getpid()
    for _ in range(3):  # repeat: a fork racing with the kill can leave a straggler
        table = process_table()
        doomed = {leader}
        doomed.update(pid for pid, _ppid, pgid, sid in table if leader in (pgid, sid))
        if marker is not None:
            doomed.update(pid for pid, *_ in table if _has_marker(pid, marker))
        changed = True
        while changed:
            changed = False
            for pid, ppid, _pgid, _sid in table:
                if ppid in doomed and pid not in doomed:
                    doomed.add(pid)
                    changed = True
        doomed.discard(me)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, signal.SIGKILL)
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if len(doomed) <= 1:
            break
