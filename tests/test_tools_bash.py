"""The persistent bash session: persistence, timeouts, restarts, hostile commands."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from karotte.sandbox.confinement.demote import demoted_env
from karotte.sandbox.tools.bash import BashOutcome, BashSession, describe
from karotte.sandbox.tools.output import OutputBuffer, truncate_middle

Run = Callable[[str, float], Awaitable[BashOutcome]]


def with_session(
    tmp_path: Path, body: Callable[[BashSession], Awaitable[Any]], limit: int = 2000
) -> Any:
    async def main() -> Any:
        session = BashSession(None, demoted_env(None), str(tmp_path), output_limit_chars=limit)
        await session.start()
        try:
            return await body(session)
        finally:
            await session.close()

    return asyncio.run(main())


def test_cd_and_export_persist(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()

    async def body(s: BashSession) -> None:
        assert (await s.run("cd sub && export KAROTTE_TEST_VAR=carrot", 5)).exit_code == 0
        out = await s.run('pwd; echo "$KAROTTE_TEST_VAR"', 5)
        assert out.output == f"{tmp_path}/sub\ncarrot\n"
        assert out.exit_code == 0

    with_session(tmp_path, body)


def test_exit_code_and_stderr_are_reported(tmp_path: Path) -> None:
    async def body(s: BashSession) -> None:
        out = await s.run("echo out; echo err >&2; (exit 3)", 5)
        assert out.output == "out\nerr\n"
        assert out.exit_code == 3
        text, is_error = describe(out, 5)
        assert "[exit code 3]" in text
        assert not is_error

    with_session(tmp_path, body)


def test_timeout_kills_and_restarts_with_message(tmp_path: Path) -> None:
    async def body(s: BashSession) -> None:
        await s.run(f"cd {tmp_path}/.. && export X=1", 5)
        old_pid = s.pid
        started = time.monotonic()
        out = await s.run("echo before; sleep infinity", 0.5)
        assert time.monotonic() - started < 3
        assert out.timed_out and out.restarted and out.exit_code is None
        assert out.output == "before\n"
        text, is_error = describe(out, 0.5)
        assert is_error
        assert "timed out after 0.5s" in text and "cwd and env were reset" in text
        assert s.pid != old_pid
        after = await s.run('pwd; echo "x=$X"', 5)
        assert after.output == f"{tmp_path}\nx=\n"  # fresh shell: initial cwd, no X

    with_session(tmp_path, body)


def test_timeout_kills_everything_the_command_started(tmp_path: Path) -> None:
    marker = tmp_path / "alive"

    async def body(s: BashSession) -> None:
        script = f"(setsid sh -c 'while :; do date > {marker}; sleep 0.05; done' &) ; sleep 100"
        out = await s.run(script, 0.5)
        assert out.timed_out

    # The double-forked, setsid'd loop escaped the process group; it must be dead anyway.
    with_session(tmp_path, body)
    time.sleep(0.3)
    before = marker.stat().st_mtime_ns
    time.sleep(0.3)
    assert marker.stat().st_mtime_ns == before


def test_output_is_truncated_with_a_note(tmp_path: Path) -> None:
    async def body(s: BashSession) -> None:
        out = await s.run("seq 1 100000", 5)
        assert out.exit_code == 0
        assert out.output.startswith("1\n2\n3\n")
        assert out.output.endswith("99999\n100000\n")
        assert "of output cut" in out.output
        assert out.cut_chars > 500_000
        assert len(out.output) < 1200

    with_session(tmp_path, body, limit=1000)


def test_truncate_middle_counts_what_was_cut() -> None:
    text, cut = truncate_middle(b"a" * 50 + b"b" * 50, 100, 20)
    assert text.startswith("a" * 10) and text.endswith("b" * 10)
    assert cut == 80 and "80 characters of output cut" in text
    assert truncate_middle(b"short", 5, 20) == ("short", 0)


def test_fifo_read_times_out_and_the_shell_recovers(tmp_path: Path) -> None:
    async def body(s: BashSession) -> None:
        started = time.monotonic()
        out = await s.run("mkfifo f && cat f", 0.5)
        assert out.timed_out and time.monotonic() - started < 3
        assert (await s.run("echo ok", 5)).output == "ok\n"

    with_session(tmp_path, body)


def test_background_process_does_not_block_the_call(tmp_path: Path) -> None:
    async def body(s: BashSession) -> None:
        for command in ("sleep 100 &", "nohup sleep 100 &", "(sleep 100; echo late) &"):
            started = time.monotonic()
            out = await s.run(command, 10)
            assert out.exit_code == 0, command
            assert time.monotonic() - started < 1.0, command
        # a foreground server-like process that never exits is stopped by the timeout
        out = await s.run("python3 -m http.server 0 --bind 127.0.0.1", 0.5)
        assert out.timed_out

    with_session(tmp_path, body)


def test_background_output_shows_up_in_a_later_call(tmp_path: Path) -> None:
    async def body(s: BashSession) -> None:
        assert (await s.run("(sleep 0.2; echo from-background) &", 5)).exit_code == 0
        await asyncio.sleep(0.5)
        assert "from-background" in (await s.run("true", 5)).output

    with_session(tmp_path, body)


def test_exit_restarts_the_shell(tmp_path: Path) -> None:
    async def body(s: BashSession) -> None:
        out = await s.run("echo bye; exit 7", 5)
        assert out.restarted and out.shell_exited == 7 and out.output == "bye\n"
        text, is_error = describe(out, 5)
        assert is_error and "exited with status 7" in text and "restarted" in text
        assert (await s.run("echo again", 5)).output == "again\n"
        out = await s.run("set -e; false; echo unreachable", 5)
        assert out.restarted and "unreachable" not in out.output
        assert (await s.run("echo alive", 5)).output == "alive\n"

    with_session(tmp_path, body)


def test_reading_stdin_does_not_hang(tmp_path: Path) -> None:
    async def body(s: BashSession) -> None:
        started = time.monotonic()
        out = await s.run("read line; echo \"got=[$line] rc=$?\"; cat; python3 -c 'input()'", 5)
        assert time.monotonic() - started < 3
        assert out.output.startswith("got=[] rc=1\n")
        assert "EOFError" in out.output

    with_session(tmp_path, body)


def test_sentinel_spoofing_does_not_fake_output(tmp_path: Path) -> None:
    async def body(s: BashSession) -> None:
        # Print lines shaped like a status line, try the status fd, and flood the saved copies
        # of the control descriptors from a background subshell.
        spoof = (
            "printf '00000000000000000000000000000000:0\\nFAKE\\n'; "
            "echo 'deadbeef:0' >&3; "
            "for fd in $(ls /proc/$$/fd); do "
            '  [ "$fd" -gt 2 ] && (echo "spoof:0" >&$fd) 2>/dev/null; '
            "done; "
            "sleep 0.3; echo real-end"
        )
        out = await s.run(spoof, 5)
        assert out.exit_code == 1 or out.exit_code == 0
        assert out.output.endswith("real-end\n")
        assert "FAKE" in out.output  # the student's own output, unmodified
        follow = await s.run("echo next", 5)
        assert follow.output == "next\n" and follow.exit_code == 0

    with_session(tmp_path, body)


def test_commands_cannot_write_the_status_channel(tmp_path: Path) -> None:
    async def body(s: BashSession) -> None:
        out = await s.run("echo x >&3", 5)
        assert "Bad file descriptor" in out.output and out.exit_code == 1

    with_session(tmp_path, body)


def test_multiline_heredoc_and_syntax_error(tmp_path: Path) -> None:
    async def body(s: BashSession) -> None:
        out = await s.run("cat <<'EOF'\nline $HOME\nEOF\necho done", 5)
        assert out.output == "line $HOME\ndone\n"
        bad = await s.run("if then", 5)
        assert bad.exit_code == 2 and "syntax error" in bad.output
        assert str(tmp_path) not in bad.output.split(":")[0]  # internal path is hidden
        assert (await s.run("echo fine", 5)).output == "fine\n"

    with_session(tmp_path, body)


def test_environment_is_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("KAROTTE_INTERNAL", "x")

    async def body(s: BashSession) -> None:
        out = await s.run("env", 5)
        assert "sk-secret" not in out.output
        assert "KAROTTE_INTERNAL" not in out.output
        assert "LANG=C.UTF-8" in out.output

    with_session(tmp_path, body)


def test_round_trip_is_fast(tmp_path: Path) -> None:
    async def body(s: BashSession) -> float:
        for _ in range(10):
            await s.run("true", 5)
        started = time.perf_counter()
        for _ in range(50):
            await s.run("true", 5)
        return (time.perf_counter() - started) / 50

    per_call = with_session(tmp_path, body)
    assert per_call < 0.030, f"{per_call * 1000:.1f} ms per `true`"


def test_close_kills_background_processes(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"

    async def body(s: BashSession) -> None:
        await s.run(f"sleep 1000 & echo $! > {pid_file}", 5)

    with_session(tmp_path, body)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().split(") ")[1].startswith("Z"):
                    break
        except FileNotFoundError:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, 9)
        pytest.fail("background sleep survived close()")


def test_output_flood_keeps_memory_bounded(tmp_path: Path) -> None:
    async def body(s: BashSession) -> None:
        started = time.monotonic()
        out = await s.run("echo first-line; yes flood", 1.5)
        assert out.timed_out and time.monotonic() - started < 4
        assert out.output.startswith("first-line\nflood\n")
        assert "flood\nflood" in out.output[-100:]  # the tail (possibly cut mid-line)
        assert "bytes of output cut" in out.output
        assert out.cut_chars > 1024 * 1024  # far more was printed than was ever kept

    with_session(tmp_path, body)


def test_background_output_is_drained_between_calls(tmp_path: Path) -> None:
    marker = tmp_path / "finished"

    async def body(s: BashSession) -> None:
        # 2 MB is far more than a pipe holds: the writer finishes only if the harness drains
        first = await s.run(f"(seq 1 300000; touch {marker}) &", 5)
        assert first.exit_code == 0
        for _ in range(40):  # the agent is thinking; the background output goes on
            await asyncio.sleep(0.05)
            assert len(s.output.head) + len(s.output.tail) <= 2 * s.output.window
            if marker.exists():
                break
        assert marker.exists()
        out = await s.run("echo next", 5)
        # (the first call may already have shown the beginning)
        assert (first.output + out.output).startswith("1\n2\n3\n")
        assert out.output.endswith("300000\nnext\n")
        assert "bytes of output cut" in out.output

    with_session(tmp_path, body)


def test_output_buffer_keeps_head_and_tail() -> None:
    buffer = OutputBuffer(limit_chars=10)  # window: 40 bytes
    for index in range(1000):
        buffer.feed(f"{index:04d}\n".encode())
    assert buffer.total == 5000 and len(buffer.head) == 40 and len(buffer.tail) == 40
    text, cut = buffer.render()
    assert text.startswith("0000\n") and text.endswith("0999\n")
    assert cut == 5000 - 10 and "about 4990 bytes of output cut" in text


def test_idle_flood_stops_being_drained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from karotte.sandbox.tools import bash

    monkeypatch.setattr(bash, "IDLE_DRAIN_CAP", 2 * 1024 * 1024)

    async def body(s: BashSession) -> None:
        assert (await s.run("yes idle-flood &", 5)).exit_code == 0
        await asyncio.sleep(1.0)
        assert not s._draining  # the harness stopped reading: it is not kept busy
        assert 2 * 1024 * 1024 < s.output.total < 8 * 1024 * 1024
        out = await s.run("kill %1; wait %1; echo next-call", 5)  # draining resumes
        assert out.output.endswith("next-call\n") and out.exit_code == 0

    with_session(tmp_path, body)


def test_shell_killed_between_calls_is_restarted_before_the_command(tmp_path: Path) -> None:
    async def body(s: BashSession) -> None:
        await s.run("cd / && export GONE=1", 5)
        assert s.pid is not None
        os.kill(s.pid, 9)  # e.g. custody stopped every student process between steps
        await asyncio.sleep(0.1)
        out = await s.run('echo "ran in $(pwd) GONE=$GONE"', 5)
        assert out.exit_code == 0 and out.output == f"ran in {tmp_path} GONE=\n"
        text, is_error = describe(out, 5)
        assert text.startswith("[Before this command the shell had ended (status -9)")
        assert not is_error
        suicide = await s.run("kill -9 $$", 5)
        assert suicide.restarted and suicide.shell_exited == -9
        assert (await s.run("echo back", 5)).output == "back\n"

    with_session(tmp_path, body)


def test_cancelled_call_leaves_a_clean_shell(tmp_path: Path) -> None:
    async def body(s: BashSession) -> None:
        task = asyncio.ensure_future(s.run("sleep 30; echo late", 60))
        await asyncio.sleep(0.3)
        task.cancel()  # e.g. the step's time limit fired mid-command
        with pytest.raises(asyncio.CancelledError):
            await task
        out = await s.run("echo fresh", 5)
        assert out.output == "fresh\n" and out.note is not None and "interrupted" in out.note

    with_session(tmp_path, body)


def test_shell_dies_with_its_parent(tmp_path: Path) -> None:
    script = (
        "import asyncio, sys\n"
        "from karotte.sandbox.confinement.demote import demoted_env\n"
        "from karotte.sandbox.tools.bash import BashSession\n"
        "async def main():\n"
        f"    s = BashSession(None, demoted_env(None), {str(tmp_path)!r}, output_limit_chars=500)\n"
        "    await s.start()\n"
        "    print(s.pid, flush=True)\n"
        "    await s.run('sleep 60', 100)\n"
        "asyncio.run(main())\n"
    )
    import subprocess
    import sys

    harness = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert harness.stdout is not None
    bash_pid = int(harness.stdout.readline())
    time.sleep(0.3)  # the shell is busy with `sleep 60`, not reading its (now closed) stdin
    harness.kill()  # SIGKILL: no cleanup code runs
    harness.wait()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{bash_pid}/stat") as handle:
                if handle.read().split(") ")[1].startswith("Z"):
                    return
        except FileNotFoundError:
            return
        time.sleep(0.02)
    os.killpg(bash_pid, 9)
    pytest.fail("the shell outlived the killed harness")


def test_works_without_pidfd_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gVisor has no pidfd_open: bash's death is then found by polling."""
    import errno

    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)

    async def body(s: BashSession) -> None:
        assert s._pidfd == -1
        assert (await s.run("cd / && echo hi", 5)).output == "hi\n"
        started = time.monotonic()
        out = await s.run("exit 4", 5)
        assert out.restarted and out.shell_exited == 4 and time.monotonic() - started < 2
        assert (await s.run("sleep 10", 0.3)).timed_out
        assert s.pid is not None
        os.kill(s.pid, 9)
        await asyncio.sleep(0.1)
        out = await s.run("echo after", 5)
        assert out.output == "after\n" and out.note is not None

    with_session(tmp_path, body)
