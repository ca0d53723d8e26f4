"""Per-session PID and IPC namespaces for the student's shell."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from student_helpers import spawn_student, wait_until

from karotte.sandbox.confinement.cleanup import student_ipc_left
from karotte.sandbox.confinement.demote import Identity
from karotte.sandbox.confinement.namespaces import (
    kill_session,
    namespace_support,
    wrap_student_command,
)
from karotte.sandbox.confinement.processes import processes_of_uid

pytestmark = pytest.mark.requires_root


@pytest.fixture(autouse=True)
def _need_namespaces() -> None:
    support = namespace_support()
    if not (support.pid and support.ipc):
        pytest.skip(f"no PID/IPC namespaces here: {support.detail}")


def _session(student: Identity, script: str) -> subprocess.Popen[str]:
    command, demoted = wrap_student_command(["/bin/sh", "-c", script], student)
    assert demoted
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=student.home,
        env={"PATH": "/usr/bin:/bin"},
    )


def test_session_runs_as_the_student_in_its_own_namespaces(student: Identity) -> None:
    session = _session(
        student,
        "id -u; echo $$; readlink /proc/self/ns/ipc; readlink /proc/self/ns/pid; "
        "grep NoNewPrivs /proc/self/status",
    )
    out, err = session.communicate(timeout=30)
    uid, pid, ipc_ns, pid_ns, nnp = out.split("\n")[:5]
    assert uid == str(student.uid), err
    assert pid == "1"  # PID 1 of its own namespace
    assert ipc_ns != os.readlink("/proc/self/ns/ipc")
    assert pid_ns != os.readlink("/proc/self/ns/pid")
    assert nnp.split()[-1] == "1"


def test_killing_the_session_kills_every_process_in_it(student: Identity) -> None:
    session = _session(student, "(sleep 100 &) ; setsid sleep 100 & sleep 100")
    assert wait_until(lambda: len(processes_of_uid(student.uid)) >= 4, 10)
    kill_session(session.pid)
    session.wait(timeout=10)
    assert wait_until(lambda: not processes_of_uid(student.uid), 10), processes_of_uid(student.uid)


def test_kill_minus_one_in_a_session_does_not_reach_other_student_processes(
    student: Identity,
) -> None:
    outside = spawn_student(student, "sleep 100")
    try:
        session = _session(student, "sleep 0.2; kill -9 -1; echo survived")
        session.communicate(timeout=30)
        time.sleep(0.2)
        assert outside.poll() is None  # the other process of the same uid is untouched
    finally:
        outside.kill()
        outside.wait()


def test_sysv_ipc_of_a_session_is_private_and_dies_with_it(student: Identity) -> None:
    session = _session(student, "ipcmk -M 4096 >/dev/null && ipcs -m | grep -c 0x; sleep 100")
    assert session.stdout is not None
    first = session.stdout.readline()
    assert first.strip() == "1"  # the session sees only its own segment
    assert student_ipc_left(student.uid) == []  # the harness's namespace never sees it
    kill_session(session.pid)
    session.wait(timeout=10)
