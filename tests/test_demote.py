"""Demotion for real: a throwaway user, tools acting as it, and what it must not reach."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_tools_mcp import make_task

from karotte.config import EvaluationRunConfig
from karotte.errors import ConfigError
from karotte.sandbox.confinement.demote import (
    DemotedCallTimeout,
    FileAccessError,
    FileTooLargeError,
    Identity,
    demoted_env,
    is_dumpable,
    read_file_as,
    run_as,
    safe_system_path,
    student_identity,
    write_file_as,
)
from karotte.sandbox.tools import open_toolbox
from karotte.sandbox.tools.base import ToolResult

pytestmark = pytest.mark.requires_root


def _uids_processes(uid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    pids.append(int(name))
            except FileNotFoundError:
                pass
    return pids


@pytest.fixture(scope="module")
def student() -> Iterator[Identity]:
    """A throwaway user (uid 1990 + random), deleted with its processes afterwards."""
    if os.geteuid() != 0:
        pytest.skip("requires_root: needs root to create a throwaway user")
    for _ in range(50):
        uid = 1990 + secrets.randbelow(8000)
        try:
            pwd.getpwuid(uid)
        except KeyError:
            break
    name = f"kt{uid}"
    home = Path(tempfile.mkdtemp(prefix=f"karotte-home-{uid}-", dir="/tmp"))
    subprocess.run(["groupadd", "-g", str(uid), name], check=True, capture_output=True)
    subprocess.run(
        ["useradd", "-u", str(uid), "-g", str(uid), "-M", "-d", str(home), "-s", "/bin/sh", name],
        check=True,
        capture_output=True,
    )
    os.chown(home, uid, uid)
    os.chmod(home, 0o755)
    try:
        yield student_identity(name)
    finally:
        for pid in _uids_processes(uid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        subprocess.run(["userdel", name], check=False, capture_output=True)
        subprocess.run(["groupdel", name], check=False, capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A root-only answer key, outside the student's reach."""
    root_data = Path(tempfile.mkdtemp(prefix="karotte-root-data-", dir="/tmp"))
    os.chmod(root_data, 0o755)
    answer = root_data / "answer"
    answer.write_text("THE-ANSWER-42\n")
    os.chmod(answer, 0o600)
    yield answer
    shutil.rmtree(root_data, ignore_errors=True)


@pytest.fixture
def workdir(student: Identity) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="karotte-work-", dir="/tmp"))
    os.chown(path, student.uid, student.gid)
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _credentials() -> tuple[tuple[int, int, int], tuple[int, int, int], list[int], bool]:
    return os.getresuid(), os.getresgid(), os.getgroups(), is_dumpable()


# ---- primitives -----------------------------------------------------------------------------


def test_run_as_drops_uid_gid_groups_and_dumpability(student: Identity) -> None:
    uids, gids, groups, dumpable = run_as(student, _credentials, timeout_s=10)
    assert uids == (student.uid,) * 3
    assert gids == (student.gid,) * 3
    assert groups in ([], [student.gid])
    assert dumpable is False  # the student cannot ptrace the helper


def _raise_permission() -> None:
    raise PermissionError("nope")


def test_run_as_reraises_and_times_out(student: Identity) -> None:
    with pytest.raises(PermissionError, match="nope"):
        run_as(student, _raise_permission, timeout_s=10)
    started = time.monotonic()
    with pytest.raises(DemotedCallTimeout):
        run_as(student, time.sleep, 30, timeout_s=0.3)
    assert time.monotonic() - started < 2


def test_read_file_as_refuses_what_the_student_cannot_or_must_not_read(
    student: Identity, secret: Path, workdir: Path
) -> None:
    with pytest.raises(FileAccessError, match="permission denied"):
        read_file_as(student, str(secret), max_bytes=1000)
    link = workdir / "answer_link"
    os.symlink(secret, link)
    with pytest.raises(FileAccessError, match="symbolic link"):
        read_file_as(student, str(link), max_bytes=1000)
    fifo = workdir / "fifo"
    os.mkfifo(fifo)
    os.chown(fifo, student.uid, student.gid)
    started = time.monotonic()
    with pytest.raises(FileAccessError, match="FIFO"):
        read_file_as(student, str(fifo), max_bytes=1000, timeout_s=5)
    assert time.monotonic() - started < 2
    with pytest.raises(FileAccessError, match="character device"):
        read_file_as(student, "/dev/zero", max_bytes=1000)
    big = workdir / "big"
    big.write_bytes(b"x" * 5000)
    with pytest.raises(FileTooLargeError):
        read_file_as(student, str(big), max_bytes=4096)
    ok = workdir / "ok.txt"
    ok.write_text("fine")
    assert read_file_as(student, str(ok), max_bytes=100) == b"fine"


def test_hardlink_to_root_file_is_not_readable(
    student: Identity, secret: Path, workdir: Path
) -> None:
    # protected_hardlinks forbids the student making it; root making it still leaks nothing
    link = workdir / "hard"
    os.link(secret, link)
    with pytest.raises(FileAccessError, match="permission denied"):
        read_file_as(student, str(link), max_bytes=1000)


def test_write_file_as_never_writes_through_a_symlink(
    student: Identity, secret: Path, workdir: Path
) -> None:
    link = workdir / "evil"
    os.symlink(secret, link)
    with pytest.raises(FileAccessError, match="symbolic link"):
        write_file_as(student, str(link), b"overwritten")
    assert secret.read_text() == "THE-ANSWER-42\n"
    with pytest.raises(FileAccessError, match="permission denied"):
        write_file_as(student, str(secret), b"overwritten")
    created = workdir / "new.txt"
    assert write_file_as(student, str(created), b"hello") == 5
    st = os.stat(created)
    assert (st.st_uid, st.st_gid) == (student.uid, student.gid)
    assert stat.S_ISREG(st.st_mode)


def test_demoted_env_is_clean(student: Identity, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-secret")
    env = demoted_env(student, {"MY_TOKEN": "t", "GOOD": "1", "KAROTTE_X": "y"})
    assert env["HOME"] == student.home and env["USER"] == student.name
    assert env["GOOD"] == "1"
    assert not {"MY_TOKEN", "KAROTTE_X", "ANTHROPIC_API_KEY"} & set(env)
    for entry in safe_system_path():
        st = os.stat(entry)
        assert st.st_uid == 0 and not st.st_mode & 0o022


# ---- the tools, acting as the student -------------------------------------------------------


def run_tools(
    student: Identity, workdir: Path, calls: list[tuple[str, dict[str, Any]]], **cfg: Any
) -> list[ToolResult]:
    async def main() -> list[ToolResult]:
        config = EvaluationRunConfig(task_id="tool-task", student_user=student.name, **cfg)
        task = make_task(
            ["bash", "view_lines_in_file", "replace_in_file", "view_image_file"],
            {"bash": {"cwd": str(workdir)}},
        )(config)
        async with open_toolbox(config, task) as box:
            return [await box.call(name, args) for name, args in calls]

    return asyncio.run(main())


def test_bash_runs_as_the_student_with_a_clean_env(
    student: Identity, secret: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-harness-secret")
    ids, cat, env, sudo, reopen = run_tools(
        student,
        workdir,
        [
            ("bash", {"command": "id -u; id -g; id -G; pwd"}),
            ("bash", {"command": f"cat {secret}"}),
            ("bash", {"command": "env"}),
            ("bash", {"command": "grep NoNewPrivs /proc/self/status"}),
            ("bash", {"command": "echo to-stderr > /dev/stderr; echo to-stdout | tee /dev/stdout"}),
        ],
    )
    assert ids.output.split() == [
        str(student.uid),
        str(student.gid),
        str(student.gid),
        str(workdir),
    ]
    assert "Permission denied" in cat.output and "THE-ANSWER" not in cat.output
    assert "sk-harness-secret" not in env.output and f"HOME={student.home}" in env.output
    assert "NoNewPrivs:\t1" in sudo.output
    # the student may reopen its own output through /dev/stdout and /dev/stderr
    assert reopen.output == "to-stderr\nto-stdout\nto-stdout\n", reopen.output


def test_file_tools_as_student_refuse_planted_links_fifo_and_devices(
    student: Identity, secret: Path, workdir: Path
) -> None:
    results = run_tools(
        student,
        workdir,
        [
            ("bash", {"command": f"ln -s {secret} link && mkfifo pipe && ln -s /dev/zero z"}),
            ("view_lines_in_file", {"path": str(workdir / "link")}),
            ("view_lines_in_file", {"path": str(secret)}),
            ("view_lines_in_file", {"path": str(workdir / "pipe")}),
            ("view_lines_in_file", {"path": "/dev/zero"}),
            ("view_image_file", {"path": str(workdir / "z")}),
            ("replace_in_file", {"path": str(workdir / "link"), "old": "THE", "new": "X"}),
            ("replace_in_file", {"path": str(secret), "old": "THE", "new": "X"}),
        ],
    )
    setup, link, direct, pipe, zero, image, replace_link, replace_direct = results
    assert setup.output == "(no output)", setup.output
    assert "symbolic link" in link.output
    assert "permission denied" in direct.output
    assert "FIFO" in pipe.output
    assert "character device" in zero.output
    assert "symbolic link" in image.output
    assert "symbolic link" in replace_link.output
    assert "permission denied" in replace_direct.output
    for result in results[1:]:
        assert result.is_error and "THE-ANSWER" not in result.output
    assert secret.read_text() == "THE-ANSWER-42\n"


def test_file_tools_as_student_edit_the_students_files(student: Identity, workdir: Path) -> None:
    edit, view, owner = run_tools(
        student,
        workdir,
        [
            ("bash", {"command": "printf 'a = 1\\nb = 2\\n' > conf.py"}),
            ("replace_in_file", {"path": str(workdir / "conf.py"), "old": "b = 2", "new": "b = 3"}),
            ("view_lines_in_file", {"path": str(workdir / "conf.py")}),
            ("bash", {"command": "stat -c %u conf.py"}),
        ],
    )[1:]
    assert "+b = 3" in edit.output
    assert "     2\tb = 3" in view.output
    assert owner.output.strip() == str(student.uid)


def test_timeout_restart_kills_every_student_process(student: Identity, workdir: Path) -> None:
    first, second = run_tools(
        student,
        workdir,
        [
            (
                "bash",
                {"command": "(setsid sleep 1000 &); env -i sleep 1001 & sleep 100", "timeout": 1},
            ),
            ("bash", {"command": "pgrep -u $(id -u) -f 'sleep 100[01]' | wc -l"}),
        ],
    )
    assert first.is_error and "timed out" in first.output
    assert second.output.strip() == "0"


def test_unknown_student_user_is_a_config_error() -> None:
    async def main() -> None:
        config = EvaluationRunConfig(task_id="tool-task", student_user="no_such_user_kx")
        async with open_toolbox(config, make_task(["bash"])(config)):
            pass

    with pytest.raises(ConfigError, match="does not exist"):
        asyncio.run(main())


# ---- the zygote (cheap forks for importable functions) ---------------------------------------


def test_call_as_forks_from_the_zygote_and_demotes(student: Identity) -> None:
    from karotte.sandbox.confinement import demote

    assert demote.call_as(None, os.getppid, timeout_s=30) != os.getpid()  # forked by the zygote
    assert demote.call_as(student, os.getresuid, timeout_s=30) == (student.uid,) * 3
    assert demote.call_as(student, is_dumpable, timeout_s=30) is False
    # a closure cannot be sent by name: it is forked from this process instead
    assert demote.call_as(None, lambda: os.getppid(), timeout_s=30) == os.getpid()
    with pytest.raises(FileAccessError, match="no such file"):
        demote.call_as(student, demote.read_regular_file, "/nonexistent/x", 10, timeout_s=30)


def test_zygote_timeouts_and_restarts(student: Identity) -> None:
    from karotte.sandbox.confinement import demote

    started = time.monotonic()
    with pytest.raises(DemotedCallTimeout):
        demote.call_as(student, time.sleep, 30, timeout_s=0.3)
    assert time.monotonic() - started < 3
    assert demote.call_as(student, os.getuid, timeout_s=30) == student.uid  # still serving
    zygote = demote._zygote._proc
    assert zygote is not None
    zygote.kill()  # died between calls (e.g. the OOM killer): the next call starts a new one
    zygote.wait()
    assert demote.call_as(student, os.getuid, timeout_s=30) == student.uid
    assert demote._zygote._proc is not zygote


def test_bash_runs_under_the_runs_student_limits(student: Identity, workdir: Path) -> None:
    from karotte.sandbox.confinement.limits import LimitsOptions, apply_limits, set_active_limits

    applied = apply_limits(student, LimitsOptions(file_size_bytes=5 * 1024 * 1024, pids=256))
    set_active_limits(applied)
    try:
        (out,) = run_tools(
            student, workdir, [("bash", {"command": "ulimit -f; cat /proc/self/oom_score_adj"})]
        )
    finally:
        set_active_limits(None)
        applied.close()
    assert out.output.split() == ["5120", "1000"], out.output
