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
    """Run ``argv`` as ``identity`` (None: the current user) and collect its merged output."""
    marker = secrets.token_hex(16)
    extra = {**(extra_env or {}), MARKER: marker}
    env = demoted_env(identity, extra, inherit_path=identity is None)
    uid = identity.uid if identity is not None else os.getuid()
    started = time.monotonic()
    buffer = _Bounded(limit_chars)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=preexec_for(identity),
            start_new_session=True,
        )
    except OSError as exc:
        return Completed(argv, 127, f"cannot start {argv[0]}: {exc.strerror or exc}", seconds=0.0)
    assert proc.stdout is not None
    timed_out = flooded = False

    async def feed() -> None:
        if stdin is None or proc.stdin is None:
            return
        try:
            proc.stdin.write(stdin)
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            proc.stdin.close()

    async def pump() -> None:
        nonlocal flooded
        while True:
            chunk = await proc.stdout.read(65536)  # type: ignore[union-attr]
            if not chunk:
                return
            buffer.add(chunk)
            if buffer.total > MAX_READ_BYTES:
                flooded = True
                return

    feeder = asyncio.create_task(feed())
    reader = asyncio.create_task(pump())
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.wait({reader}, return_when=asyncio.FIRST_COMPLETED)
            if flooded:
                raise TimeoutError
            await proc.wait()
    except TimeoutError:
        timed_out = not flooded
    finally:
        _kill_all(proc.pid, marker, uid)
        if not reader.done():
            # a background child may hold the pipe open: give it a moment, then stop reading
            try:
                await asyncio.wait_for(asyncio.shield(reader), 0.5)
            except TimeoutError:
                reader.cancel()
        feeder.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 5)
    exit_code = None if timed_out or flooded else proc.returncode
    return Completed(
        argv,
        exit_code,
        buffer.text(),
        timed_out=timed_out,
        flooded=flooded,
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


def make_build_dir(identity: Identity | None) -> str:
    """A fresh private directory under /tmp owned by the student (created as the student)."""
    return run_as(identity, tempfile.mkdtemp, prefix="build-", dir="/tmp", timeout_s=10)


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
