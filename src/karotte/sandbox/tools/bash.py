"""A persistent bash session for the student, robust against everything a command can do.

How one command runs:

- The command text is written to a root-owned file; bash (as the student, in its own session)
  reads one *control line* from its stdin pipe::

      { . /dir/cmd; } </dev/null 2>&1 3>&-; \\builtin printf '<nonce>:%s\\n' "$?" >&3

  so ``cd`` and ``export`` persist (the command runs in the shell itself), commands get
  ``/dev/null`` as stdin (they cannot read the control channel) and fd 3, the status channel, is
  closed for them.
- Output (stdout + stderr) goes to a pipe that the harness drains all the time, during and
  between calls, into a bounded head + tail buffer (:class:`OutputBuffer`). The harness never
  waits for the pipe's end, so a background process holding it cannot block a call; a flood
  cannot fill memory or disk; the pipe belongs to the student, so ``echo x > /dev/stderr``
  works as in a terminal.
- The call ends when the status line with this command's random nonce arrives on the status
  pipe; all the command's output is in the output pipe by then. Lines without the nonce (a
  background process writing to a saved descriptor) are ignored, so output cannot fake the end
  of a command.
- On timeout, or when bash dies (``exit``, ``set -e``), everything the session started is killed
  (:func:`kill_session_tree`), a fresh shell is started and the agent is told so.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass

from karotte.sandbox.confinement.demote import Identity, preexec_for, set_parent_death_signal
from karotte.sandbox.tools.killing import kill_session_tree
from karotte.sandbox.tools.output import OutputBuffer

SESSION_MARKER = "KAROTTE_SHELL_ID"
RESTART_NOTE = "The shell was restarted; cwd and env were reset and its processes were killed."
_MAX_STATUS_LINE = 4096
_READ_CHUNK = 1 << 16
_EXIT_POLL_S = 0.05  # how often to check whether bash died, where pidfd_open is missing
_DRAIN_PER_WAKEUP = 1 << 20  # bytes read per event-loop wakeup: a flood cannot starve the loop
IDLE_DRAIN_CAP = 16 << 20  # between calls, stop draining after this much (writers then block)


@dataclass
class BashOutcome:
    """What one command produced. ``exit_code`` is None when it did not finish normally."""

    output: str
    exit_code: int | None
    timed_out: bool = False
    shell_exited: int | None = None  # bash's own exit status when the command ended the shell
    restarted: bool = False
    cut_chars: int = 0
    duration_s: float = 0.0
    note: str | None = None  # e.g. the shell had died between calls and was started afresh


class BashSession:
    """One persistent ``bash --noprofile --norc`` acting as ``identity`` (None: current user)."""

    def __init__(
        self,
        identity: Identity | None,
        env: dict[str, str],
        cwd: str,
        *,
        output_limit_chars: int,
        kill_all_student_processes: bool = True,
        bash_path: str | None = None,
        before_demote: Callable[[], None] | None = None,
    ) -> None:
        self.identity = identity
        self.env = env
        self.cwd = cwd
        self.kill_all_student_processes = kill_all_student_processes
        self.before_demote = before_demote  # e.g. enter the student cgroup, set rlimits
        found = bash_path or shutil.which("bash", path="/usr/bin:/bin") or shutil.which("bash")
        if found is None:
            raise FileNotFoundError("bash is not installed (the bash tool needs /bin/bash)")
        self.bash_path = found
        self._dir = tempfile.mkdtemp(prefix="karotte-bash-")
        os.chmod(self._dir, 0o711)  # noqa: S103 - the student may read the command file, nothing else
        self._cmd_path = os.path.join(self._dir, "cmd")
        self._marker = f"{SESSION_MARKER}={secrets.token_hex(8)}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._stdin_w = self._status_r = self._out_r = self._pidfd = -1
        self._status_buffer = b""
        self.output = OutputBuffer(output_limit_chars)
        self._running = False  # a command is running
        self._interrupted = False  # a call was cancelled mid-command
        self._draining = False  # the output pipe is registered with the event loop

    # ---- lifecycle -------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    async def start(self) -> None:
        """Start (or restart) the shell and check it answers. Idempotent while it runs.

        Raises :class:`RuntimeError` when a fresh shell does not answer ``true`` within 10 s.
        """
        if self._proc is not None:
            return
        self._launch()
        status = await self._execute("true", 10)
        if status != 0:
            output, _cut = self.output.render()
            await self._stop()
            raise RuntimeError(f"the bash session did not start ({status}): {output.strip()!r}")

    def _launch(self) -> None:
        stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
        status_r, low_status_w = os.pipe2(os.O_CLOEXEC)
        # bash gets it at this same number, then moves it to 3: keep it clear of 0-3
        status_w = fcntl.fcntl(low_status_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(low_status_w)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        if self.identity is not None and os.geteuid() == 0:
            # The student may reopen its own output (`echo err > /dev/stderr`), as in a terminal.
            # Best effort: gVisor refuses to chown a pipe (then only that reopening fails).
            with contextlib.suppress(OSError):
                os.fchown(out_w, self.identity.uid, self.identity.gid)
        home = self.identity.home if self.identity else "/"
        cwd = self.cwd if os.path.isdir(self.cwd) else home
        try:
            # Blocking, but only a fork+exec (a few ms), and only at (re)start.
            proc = subprocess.Popen(
                [self.bash_path, "--noprofile", "--norc"],
                stdin=stdin_r,
                stdout=out_w,
                stderr=out_w,
                pass_fds=(status_w,),
                cwd=cwd,
                env={**self.env, SESSION_MARKER: self._marker.split("=", 1)[1]},
                start_new_session=True,
                preexec_fn=self._preexec,
            )
        except BaseException:
            for fd in (stdin_w, status_r, out_r):
                os.close(fd)
            raise
        finally:
            for fd in (stdin_r, status_w, out_w):  # bash has its own copies
                os.close(fd)
        self._proc = proc
        self._stdin_w, self._status_r, self._out_r = stdin_w, status_r, out_r
        try:
            self._pidfd = os.pidfd_open(proc.pid)  # wakes us when bash dies
        except OSError:  # gVisor has no pidfd_open: poll instead (see _wait_status)
            self._pidfd = -1
        os.set_blocking(status_r, False)
        os.set_blocking(out_r, False)
        self._status_buffer = b""
        self.output.reset()
        self._resume_draining()
        # Move the status pipe to fd 3 (start() then proves the shell answers).
        self._write_control(f"exec 3>&{status_w} {status_w}>&-\n")

    def _preexec(self) -> None:
        if self.before_demote is not None:
            self.before_demote()
        preexec_for(self.identity)()
        # after the demotion (changing credentials clears it): if the harness dies, so does
        # the shell (the parent is the event-loop thread, which lives as long as the session)
        set_parent_death_signal(signal.SIGKILL)

    async def close(self) -> None:
        """Kill the shell and everything it started; remove the session's files."""
        await self._stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    async def _stop(self) -> None:
        proc = self._proc
        if proc is None:
            return
        self._proc = None
        self._pause_draining()
        kill_session_tree(
            proc.pid,
            self.identity,
            all_of_uid=self.kill_all_student_processes,
            marker=self._marker.encode(),
        )
        for _ in range(200):
            if proc.poll() is not None:  # reaped only now, after the kill by its pid
                break
            await asyncio.sleep(0.005)
        for fd in (self._stdin_w, self._status_r, self._out_r, self._pidfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._stdin_w = self._status_r = self._out_r = self._pidfd = -1

    async def restart(self) -> None:
        await self._stop()
        await self.start()

    # ---- output ------------------------------------------------------------------------------
    def _resume_draining(self) -> None:
        if not self._draining and self._out_r >= 0:
            asyncio.get_running_loop().add_reader(self._out_r, self._drain)
            self._draining = True

    def _pause_draining(self) -> None:
        if self._draining:
            asyncio.get_running_loop().remove_reader(self._out_r)
            self._draining = False

    def _drain(self, limit: int = _DRAIN_PER_WAKEUP) -> None:
        """Move what is in the output pipe into the buffer (event-loop callback, non-blocking).

        Between calls, after :data:`IDLE_DRAIN_CAP` bytes the harness stops reading until the
        next call (like a terminal nobody scrolls): a background flood cannot keep the
        harness busy for the rest of the run.
        """
        taken = 0
        while taken < limit:
            try:
                chunk = os.read(self._out_r, _READ_CHUNK)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                chunk = b""
            if not chunk:  # every writer is gone (bash died, no background process left)
                self._pause_draining()
                return
            self.output.feed(chunk)
            taken += len(chunk)
        if not self._running and self.output.total > IDLE_DRAIN_CAP:
            self._pause_draining()

    def _pending_output(self) -> int:
        try:
            raw = fcntl.ioctl(self._out_r, termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return _DRAIN_PER_WAKEUP
        return int.from_bytes(raw, sys.byteorder)

    # ---- one command ------------------------------------------------------------------------
    def _write_control(self, line: str) -> None:
        view = memoryview(line.encode())
        while view:
            view = view[os.write(self._stdin_w, view) :]

    async def run(self, command: str, timeout_s: float) -> BashOutcome:
        """Run ``command`` in the shell; never raises for anything the command does."""
        started = time.monotonic()
        note = None
        if self._interrupted:  # the previous call was cancelled while its command ran
            self._interrupted = False
            await self.restart()
            note = (
                "[The previous command was interrupted; the shell was restarted: cwd and env "
                "were reset.]"
            )
        elif self._proc is not None and self._exited():  # killed between calls (e.g. custody)
            status_before = self._exit_status()
            await self.restart()
            note = (
                f"[Before this command the shell had ended (status {status_before}); "
                "a fresh shell was started: cwd and env were reset.]"
            )
        if self._proc is None:
            await self.start()
        try:
            status = await self._execute(command, timeout_s)
        except asyncio.CancelledError:
            self._interrupted = True  # the command may still run: start afresh next time
            raise
        outcome = BashOutcome(output="", exit_code=None, note=note)
        if isinstance(status, int):
            outcome.exit_code = status
        elif status == "timeout":
            outcome.timed_out = True
        else:
            outcome.shell_exited = self._exit_status()
        # What the command wrote is in the pipe now: read exactly that much, not what a
        # background process keeps writing after it.
        self._drain(limit=self._pending_output())
        # Output includes what background processes wrote since the previous call.
        outcome.output, outcome.cut_chars = self.output.render()
        self.output.reset()
        outcome.output = outcome.output.replace(f"{self._cmd_path}: ", "bash: ")
        if outcome.exit_code is None:
            await self.restart()
            outcome.restarted = True
        outcome.duration_s = time.monotonic() - started
        return outcome

    async def _execute(self, command: str, timeout_s: float) -> int | str:
        """Send one command; its exit status, ``"timeout"`` or ``"exited"`` (bash died)."""
        nonce = secrets.token_hex(16)
        tmp = f"{self._cmd_path}.{secrets.token_hex(4)}"
        text = command if command.endswith("\n") else command + "\n"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.fchmod(fd, 0o644)  # whatever the umask
            view = memoryview(text.encode("utf-8", errors="surrogateescape"))
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, self._cmd_path)
        control = (
            f"{{ . {self._cmd_path}; }} </dev/null 2>&1 3>&-; "
            f"\\builtin printf '{nonce}:%s\\n' \"$?\" >&3\n"
        )
        self._running = True
        self._resume_draining()
        try:
            with contextlib.suppress(BrokenPipeError):  # bash is gone: the wait below sees it
                self._write_control(control)
            return await self._wait_status(nonce, timeout_s)
        finally:
            self._running = False

    def _exited(self) -> bool:
        """Whether bash has exited. Does not reap it: a zombie keeps its pid (and process
        group id) from being reused before the session is killed."""
        if self._pidfd >= 0:
            return bool(select.select([self._pidfd], [], [], 0)[0])
        return self._exit_status() is not None

    def _exit_status(self) -> int | None:
        """bash's exit status (or -signal), without reaping it (None while it runs)."""
        if self._proc is None:
            return None
        try:
            info = os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except OSError:
            return None
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    async def _wait_status(self, nonce: str, timeout_s: float) -> int | str:
        """The command's exit status, ``"timeout"``, or ``"exited"`` when bash died."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        prefix = f"{nonce}:".encode()
        while True:
            found = self._scan_status(prefix)
            if found is not None:
                return found
            if self._proc is None or self._exited():
                return "exited"
            remaining = deadline - loop.time()
            if remaining <= 0:
                return "timeout"
            ready: asyncio.Future[None] = loop.create_future()

            def _wake(fut: asyncio.Future[None] = ready) -> None:
                if not fut.done():
                    fut.set_result(None)

            loop.add_reader(self._status_r, _wake)
            if self._pidfd >= 0:
                loop.add_reader(self._pidfd, _wake)
            else:
                remaining = min(remaining, _EXIT_POLL_S)  # no pidfd: look again soon
            try:
                await asyncio.wait_for(ready, remaining)
            except TimeoutError:
                pass
            finally:
                loop.remove_reader(self._status_r)
                if self._pidfd >= 0:
                    loop.remove_reader(self._pidfd)

    def _scan_status(self, prefix: bytes) -> int | None:
        """Read the status pipe; the status in this command's line, if it has arrived.

        Anything else there (junk from a background process) is dropped, a chunk at a time.
        """
        while True:
            try:
                chunk = os.read(self._status_r, 65536)
            except BlockingIOError:
                chunk = b""
            *lines, rest = (self._status_buffer + chunk).split(b"\n")
            self._status_buffer = rest[-_MAX_STATUS_LINE:]
            for line in lines:
                value = line[len(prefix) :] if line.startswith(prefix) else b""
                if value.isdigit():
                    return int(value)
            if not chunk:
                return None


def describe(outcome: BashOutcome, timeout_s: float) -> tuple[str, bool]:
    """The text the agent sees for ``outcome``, and whether it is an error."""
    parts = [outcome.note] if outcome.note else []
    parts.append(outcome.output if outcome.output else "(no output)")
    if outcome.exit_code not in (None, 0):
        parts.append(f"[exit code {outcome.exit_code}]")
    if outcome.timed_out:
        parts.append(
            f"[The command timed out after {timeout_s:g}s and was killed. {RESTART_NOTE} "
            "Run long jobs in the background with output to a file, e.g. "
            "`nohup cmd > log 2>&1 &`.]"
        )
    elif outcome.restarted:
        status = f" with status {outcome.shell_exited}" if outcome.shell_exited is not None else ""
        parts.append(f"[The shell exited{status}. {RESTART_NOTE}]")
    return "\n".join(parts), outcome.timed_out or outcome.restarted
