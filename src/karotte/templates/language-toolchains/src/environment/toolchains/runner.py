"""Compile and run a program AS THE STUDENT, with time and output limits.

Used by the `build` tool (on the student's file) and by `ProgramOutputJudge` (on the custody
copy). Every process runs demoted to the student (`karotte.tools.preexec_for`: uid, gid, no
supplementary groups, no_new_privs) in its own session with a clean environment
(`demoted_env`). On a timeout, and after every command, the process group and every process
that carries this call's marker variable are killed, so a program that forks into the
background does not outlive its call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass

from karotte.tools import Identity, demoted_env, preexec_for, run_as, write_file_as

from environment.toolchains import Toolchain

MARKER = "TOOLCHAIN_RUN_ID"
MAX_READ_BYTES = 64 * 1024 * 1024  # stop reading (and kill) after this much output


@dataclass
class Completed:
    argv: list[str]
    exit_code: int | None  # None: killed on timeout or output flood
    output: str
    timed_out: bool = False
    flooded: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def describe(self) -> str:
        if self.timed_out:
            return "[timed out and killed]"
        if self.flooded:
            return f"[killed: more than {MAX_READ_BYTES} bytes of output]"
        return f"[exit code {self.exit_code}]"


class _Bounded:
    """Keeps the head and the tail of a stream, at most ``limit`` characters in all."""

    def __init__(self, limit: int) -> None:
        self.limit = max(100, limit)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.limit // 2 - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > self.limit // 2:
            del self.tail[: len(self.tail) - self.limit // 2]

    def text(self) -> str:
        kept = len(self.head) + len(self.tail)
        head = self.head.decode("utf-8", "replace")
        tail = self.tail.decode("utf-8", "replace")
        if self.total > kept:
            cut = self.total - kept
            return f"{head}\n[... {cut} bytes of output cut (limit {self.limit}) ...]\n{tail}"
        return head + tail


def _kill_marked(marker: str, uid: int | None) -> None:
    """SIGKILL every process whose environment carries ``MARKER=marker`` (and has ``uid``)."""
    needle = f"{MARKER}={marker}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if uid is not None and os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    os.kill(int(entry), signal.SIGKILL)
        except (OSError, ValueError):
            continue


def _kill_all(pgid: int, marker: str, uid: int | None) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    _kill_marked(marker, uid)


async def run_student(
    argv: list[str],
    *,
    identity: Identity | None,
    cwd: str,
    timeout_s: float,
    limit_chars: int,
    stdin: bytes | None = None,
    extra_env: dict[str, str] | None = None,
) -> Completed:
    """Run ``argv`` as ``identity`` (None: the current user) and collect its merged output.

    stdout and stderr share one pipe that is read as data arrives, into a bounded head + tail
    buffer. The call ends when the process exits (children it left behind are killed then, so
    they cannot hold the call open), on ``timeout_s``, or when more than ``MAX_READ_BYTES``
    arrive; everything it started is killed in every case.
    """
    loop = asyncio.get_running_loop()
    marker = secrets.token_hex(16)
    extra = {**(extra_env or {}), MARKER: marker}
    env = demoted_env(identity, extra, inherit_path=identity is None)
    uid = identity.uid if identity is not None else os.getuid()
    started = time.monotonic()
    buffer = _Bounded(limit_chars)
    read_fd, write_fd = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            preexec_fn=preexec_for(identity),
            start_new_session=True,
        )
    except OSError as exc:
        os.close(read_fd)
        return Completed(argv, 127, f"cannot start {argv[0]}: {exc.strerror or exc}")
    finally:
        os.close(write_fd)
    os.set_blocking(read_fd, False)
    eof = asyncio.Event()
    flood = asyncio.Event()

    def on_readable() -> None:
        while True:
            try:
                chunk = os.read(read_fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                loop.remove_reader(read_fd)
                eof.set()
                return
            buffer.add(chunk)
            if buffer.total > MAX_READ_BYTES:
                loop.remove_reader(read_fd)  # stop reading: the writer blocks until killed
                flood.set()
                return

    loop.add_reader(read_fd, on_readable)

    async def feed() -> None:
        if stdin is None or proc.stdin is None:
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(stdin)
            await proc.stdin.drain()
        proc.stdin.close()

    async def exited() -> None:
        while proc.returncode is None:
            await asyncio.sleep(0.02)

    feeder = asyncio.create_task(feed())
    waiter = asyncio.create_task(exited())
    flooded = asyncio.create_task(flood.wait())
    timed_out = False
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.wait({waiter, flooded}, return_when=asyncio.FIRST_COMPLETED)
    except TimeoutError:
        timed_out = True
    finally:
        _kill_all(proc.pid, marker, uid)
        if not flood.is_set() and not eof.is_set():
            # what the killed writers left in the pipe is still read, briefly
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(eof.wait(), 0.5)
        loop.remove_reader(read_fd)
        os.close(read_fd)
        for task in (feeder, waiter, flooded):
            task.cancel()
        if proc.stdin is not None:
            proc.stdin.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 5)
    was_flooded = flood.is_set()
    timed_out = timed_out and not was_flooded
    return Completed(
        argv,
        None if timed_out or was_flooded else proc.returncode,
        buffer.text(),
        timed_out=timed_out,
        flooded=was_flooded,
        seconds=time.monotonic() - started,
    )


@dataclass
class BuildResult:
    toolchain: str
    compiled: Completed | None  # None: the toolchain has no separate compile step
    ran: Completed | None  # None: not run (compile failed, or not asked)

    @property
    def compile_ok(self) -> bool:
        return self.compiled is None or self.compiled.ok


def _can_execute_in(directory: str) -> bool:
    """Whether a program in ``directory`` can be executed (tried: gVisor's statvfs does not
    report noexec)."""
    probe = os.path.join(directory, "exec-probe")
    with open(probe, "w", encoding="ascii") as handle:
        handle.write("#!/bin/sh\nexit 0\n")
    os.chmod(probe, 0o700)
    try:
        return subprocess.run([probe], env={}, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        os.unlink(probe)


def _make_build_dir(home: str) -> str:
    """Runs as the student: a fresh directory in the first place the student may write to
    where programs may run (sandboxes mount /tmp noexec)."""
    for place in ("/tmp", "/var/tmp", os.path.join(home, ".build")):
        try:
            if place.endswith("/.build") and not os.path.isdir(place):
                os.mkdir(place, 0o700)
            if not os.path.isdir(place) or os.statvfs(place).f_flag & os.ST_NOEXEC:
                continue
            directory = tempfile.mkdtemp(prefix="build-", dir=place)
        except OSError:
            continue
        if _can_execute_in(directory):
            return directory
        shutil.rmtree(directory, ignore_errors=True)
    raise RuntimeError("no place the student may write to allows executing programs")


def make_build_dir(identity: Identity | None) -> str:
    """A fresh private build directory, created as the student, where programs may run."""
    home = identity.home if identity is not None else os.path.expanduser("~")
    return run_as(identity, _make_build_dir, home, timeout_s=10)


def remove_build_dir(identity: Identity | None, directory: str) -> None:
    """Remove a build directory as the student (never follows the student's symlinks)."""
    run_as(identity, shutil.rmtree, directory, ignore_errors=True, timeout_s=30)


async def compile_and_run(
    toolchain: Toolchain,
    source_name: str,
    source: bytes,
    *,
    identity: Identity | None,
    stdin: bytes | None,
    compile_timeout_s: float,
    run_timeout_s: float,
    limit_chars: int,
    run: bool = True,
    keep_dir: bool = False,
) -> tuple[BuildResult, str]:
    """Write ``source`` into a fresh build dir as the student, compile it, run it."""
    directory = await asyncio.to_thread(make_build_dir, identity)
    src = os.path.join(directory, os.path.basename(source_name))
    out = os.path.join(directory, "program")
    await asyncio.to_thread(write_file_as, identity, src, source, create=True, mode=0o644)
    try:
        compiled = None
        argv = toolchain.command("compile", src=src, out=out, directory=directory)
        if argv is not None:
            compiled = await run_student(
                argv,
                identity=identity,
                cwd=directory,
                timeout_s=compile_timeout_s,
                limit_chars=limit_chars,
                extra_env=toolchain.env,
            )
        ran = None
        if run and (compiled is None or compiled.ok):
            argv = toolchain.command("run", src=src, out=out, directory=directory)
            assert argv is not None
            ran = await run_student(
                argv,
                identity=identity,
                cwd=directory,
                timeout_s=run_timeout_s,
                limit_chars=limit_chars,
                stdin=stdin if stdin is not None else b"",
                extra_env=toolchain.env,
            )
        return BuildResult(toolchain.name, compiled, ran), directory
    finally:
        if not keep_dir:
            await asyncio.to_thread(remove_build_dir, identity, directory)
