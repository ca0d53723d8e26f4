"""Who the student is, and running a small function as the student.

The tools layer owns the general demotion primitives (``karotte.sandbox.confinement.demote``);
confinement only needs two small things of its own, kept here so that custody works without the
tools layer: look the student up, and run one short function as the student in a forked child.
"""

from __future__ import annotations

import grp
import os
import pwd
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from karotte.errors import KarotteError


class StudentLookupError(KarotteError):
    """The configured student user does not exist (an image or config problem)."""


@dataclass(frozen=True)
class StudentIdentity:
    """The unprivileged user the student acts as."""

    name: str
    uid: int
    gid: int
    home: str
    groups: tuple[int, ...] = ()

    @classmethod
    def lookup(cls, user: str | int) -> StudentIdentity:
        """Look a user up by name or uid; refuse root (the student is never uid 0)."""
        try:
            entry = pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(user)
        except KeyError as exc:
            raise StudentLookupError(
                f"student user {user!r} does not exist in this sandbox "
                "(the image must create it; see docs/confinement.md)"
            ) from exc
        if entry.pw_uid == 0 or entry.pw_gid == 0:
            raise StudentLookupError(f"student user {user!r} has uid/gid 0; refusing to use root")
        groups = tuple(
            sorted({g.gr_gid for g in grp.getgrall() if entry.pw_name in g.gr_mem} - {0})
        )
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir, groups)


def drop_to(uid: int, gid: int, groups: tuple[int, ...] = ()) -> None:
    """Irrevocably become ``uid``/``gid`` (real, effective and saved). For forked children only."""
    os.setgroups(list(groups))
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise OSError("privilege drop did not take effect")


def run_as_child(
    uid: int, gid: int, fn: Callable[[], int], timeout_s: float = 10.0
) -> int:
    """Fork, drop to ``uid``/``gid``, run ``fn`` and return its exit status (0..255).

    The child only makes plain system calls and leaves with ``os._exit``; it never returns into
    the caller's code. A child that outlives ``timeout_s`` is killed and reported as 255.
    """
    pid = os.fork()
    if pid == 0:  # child
        status = 255
        try:
            os.setsid()
            drop_to(uid, gid)
            status = int(fn()) & 0xFF
        except BaseException:
            status = 254
        finally:
            os._exit(status)
    deadline = time.monotonic() + timeout_s
    while True:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(wait_status) & 0xFF
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return 255
        time.sleep(0.005)
