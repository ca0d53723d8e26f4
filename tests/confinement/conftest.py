"""Fixtures for confinement tests: a throwaway unprivileged user, and running code as it."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from karotte.sandbox.confinement.demote import Identity as StudentIdentity
from karotte.sandbox.confinement.demote import student_identity
from karotte.sandbox.confinement.processes import kill_student_processes, processes_of_uid


def _free_uid() -> int:
    import pwd

    for _ in range(50):
        uid = 200_000 + secrets.randbelow(700_000)
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise RuntimeError("no free uid found")


@pytest.fixture
def student(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StudentIdentity]:
    """A fresh user with a random high uid, removed (with every process of it) afterwards."""
    if os.geteuid() != 0:
        pytest.skip("requires_root: needs root to create a throwaway user")
    uid = _free_uid()
    name = f"kst{uid}"
    home = tmp_path_factory.mktemp(f"home-{uid}")
    subprocess.run(["groupadd", "-g", str(uid), name], check=True, capture_output=True, timeout=30)
    subprocess.run(
        ["useradd", "-u", str(uid), "-g", str(uid), "-M", "-d", str(home), "-s", "/bin/sh", name],
        check=True,
        capture_output=True,
        timeout=30,
    )
    os.chown(home, uid, uid)
    os.chmod(home, 0o755)
    # the pytest tmp root is 0700 root: let the student traverse to its home
    for parent in home.parents:
        if str(parent).startswith("/tmp/pytest-of-") or parent == home.parent:
            os.chmod(parent, os.stat(parent).st_mode | 0o711)
    identity = student_identity(name)
    try:
        yield identity
    finally:
        if processes_of_uid(uid):
            kill_student_processes(uid, uid, timeout_s=10)
        subprocess.run(["userdel", name], check=False, capture_output=True, timeout=30)
        subprocess.run(["groupdel", name], check=False, capture_output=True, timeout=30)
        shutil.rmtree(home, ignore_errors=True)
