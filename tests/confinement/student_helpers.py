"""Helpers for confinement tests: run code as the throwaway student."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from karotte.sandbox.confinement.demote import Identity as StudentIdentity


def demote_preexec(identity: StudentIdentity, before: object = None):  # type: ignore[no-untyped-def]
    """A preexec_fn: optional setup as root, then drop to the student."""

    def run() -> None:
        if callable(before):
            before()
        os.setgroups([])
        os.setresgid(identity.gid, identity.gid, identity.gid)
        os.setresuid(identity.uid, identity.uid, identity.uid)

    return run


def as_student(
    identity: StudentIdentity,
    script: str,
    before: object = None,
    timeout: float = 60,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a shell script as the student (and wait for it)."""
    return subprocess.run(
        ["/bin/sh", "-c", script],
        preexec_fn=demote_preexec(identity, before),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or identity.home,
        env={"PATH": "/usr/bin:/bin", "HOME": identity.home},
        check=False,
    )


def spawn_student(
    identity: StudentIdentity, script: str, before: object = None
) -> subprocess.Popen[str]:
    """Start a shell script as the student in the background."""
    return subprocess.Popen(
        ["/bin/sh", "-c", script],
        preexec_fn=demote_preexec(identity, before),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=identity.home,
        env={"PATH": "/usr/bin:/bin", "HOME": identity.home},
        start_new_session=True,
    )


def wait_until(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False
