"""A private PID and IPC namespace for each student session (the bash tool's shell).

:func:`wrap_student_command` turns ``argv`` into::

    unshare --ipc --pid --fork --kill-child -- \\
        setpriv --reuid=U --regid=G --clear-groups --no-new-privs -- argv...

started *as root* (``unshare`` needs ``CAP_SYS_ADMIN``; ``setpriv`` then drops to the student for
good). The session's first process is PID 1 of its namespace: when it dies, or when the ``unshare``
parent is killed with :func:`kill_session`, the kernel kills every process of the session,
however it forked. (``--kill-child`` alone is not enough: the kernel clears the parent-death
signal when ``setpriv`` changes the uid, so :func:`kill_session` kills the namespace's PID 1.)
``kill(-1)`` inside a session reaches only that session. SysV IPC objects made inside the
session live in its own IPC namespace and vanish with it; the harness's are out of reach.

When namespaces are unavailable (not root, no ``unshare``, a runtime that forbids them) the
function returns ``argv`` unchanged and ``demoted=False``: the caller must then demote the child
itself (``demote.preexec_for``). Either way, run the confinement preexec (``limits.preexec``:
cgroup, rlimits, oom_score_adj) in the child.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess

from pydantic import BaseModel, ConfigDict

from karotte.sandbox.confinement.demote import Identity
from karotte.sandbox.confinement.sanitize import UntrustedBinaryError, resolve_system_binary


class NamespaceSupport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pid: bool
    ipc: bool
    detail: str


@functools.cache
def namespace_support() -> NamespaceSupport:
    """Probe once whether ``unshare --pid --ipc`` works here (as this process's user)."""
    if os.geteuid() != 0:
        return NamespaceSupport(pid=False, ipc=False, detail="not root")
    try:
        unshare = resolve_system_binary("unshare")
        resolve_system_binary("setpriv")
    except UntrustedBinaryError as exc:
        return NamespaceSupport(pid=False, ipc=False, detail=str(exc))
    results = {}
    for name, flags in (("ipc", ["--ipc"]), ("pid", ["--pid", "--fork", "--kill-child"])):
        probe = subprocess.run(
            [unshare, *flags, "--", "/bin/true"], capture_output=True, timeout=10, check=False
        )
        results[name] = probe.returncode == 0
    failed = [n for n, ok in results.items() if not ok]
    detail = "unshare works" if not failed else f"unshare --{'/--'.join(failed)} refused here"
    return NamespaceSupport(pid=results["pid"], ipc=results["ipc"], detail=detail)


def wrap_student_command(
    argv: list[str], identity: Identity, *, pid: bool = True, ipc: bool = True
) -> tuple[list[str], bool]:
    """``(command, demoted)``: ``argv`` inside fresh PID/IPC namespaces, dropped to the student.

    Start the result as root with ``preexec_fn=limits.preexec`` (no demotion in the preexec
    when ``demoted`` is True) and ``start_new_session=True``. End the session with
    :func:`kill_session` on the returned process's pid: the whole namespace dies with it.
    """
    support = namespace_support()
    flags = []
    if ipc and support.ipc:
        flags.append("--ipc")
    if pid and support.pid:
        flags += ["--pid", "--fork", "--kill-child"]
    if not flags:
        return list(argv), False
    unshare = resolve_system_binary("unshare")
    setpriv = resolve_system_binary("setpriv")
    command = [
        unshare,
        *flags,
        "--",
        setpriv,
        f"--reuid={identity.uid}",
        f"--regid={identity.gid}",
        "--clear-groups",
        "--no-new-privs",
        "--",
        *argv,
    ]
    return command, True


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as handle:
                found += [int(c) for c in handle.read().split()]
        except OSError:
            continue
    return found


def kill_session(pid: int) -> None:
    """SIGKILL a session started from :func:`wrap_student_command` and everything in it.

    Kills the namespace's PID 1 (the child of ``unshare``), which makes the kernel kill every
    process of the PID namespace, then ``unshare`` itself. Does not wait; the caller reaps ``pid``.
    """
    for child in _children(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
