"""A persistent bash session for the student, robust against everything a command can do.

How one command runs:

- The command text is written to a root-owned file; bash (as the student, in its own session)
  reads one *control line* from its stdin pipe::

      { . /dir/cmd; } </dev/null 2>&1 3>&-; \\builtin printf '<nonce>:%s\\n' "$?" >&3

  so ``cd`` and ``export`` persist (the command runs in the shell itself), commands get
  ``/dev/null`` as stdin (they cannot read the control channel) and fd 3, the status channel, is
  closed for them.
- Output (stdout + stderr) goes to an unlinked file the harness created and holds open; bash only
  has a write descriptor. A background process keeping it open cannot block the call, and the
  student cannot redirect what the harness reads (no path to swap for a symlink or FIFO).
- The call ends when the status line with this command's random nonce arrives on the status pipe.
  Lines without it (a background process writing to a saved descriptor) are ignored, so output
  cannot fake the end of a command.
- On timeout, or when bash dies (``exit``, ``set -e``), everything the session started is killed
  (process group, session, descendants, and with a student user every process of that uid), a
  fresh shell is started and the agent is told so.
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
from collections.abc import Callable
from dataclasses import dataclass

from karotte.sandbox.confinement.demote import Identity, preexec_for, run_as

SESSION_MARKER = "KAROTTE_SHELL_ID"
SPILL_CHECK_S = 0.1
RESTART_NOTE = "The shell was restarted; cwd and env were reset and its processes were killed."
_MAX_STATUS_LINE = 4096


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


def truncate_middle(data: bytes, total_size: int, limit_chars: int) -> tuple[str, int]:
    """Decode ``data`` (head and tail of a ``total_size``-byte output) keeping ``limit_chars``.

    Returns the text (with a note in the middle when something was cut) and the number of
    characters (bytes when the middle was never read) that were cut.
    """
    text = data.decode("utf-8", errors="replace")
    if total_size <= len(data) and len(text) <= limit_chars:
        return text, 0
    head_n = limit_chars // 2
    tail_n = limit_chars - head_n
    head, tail = text[:head_n], text[-tail_n:] if tail_n else ""
    cut = max(total_size - len(data), 0) + (len(text) - head_n - tail_n)
    note = f"\n\n[... {cut} characters of output cut (limit {limit_chars}) ...]\n\n"
    return head + note + tail, cut


def _process_table() -> list[tuple[int, int, int, int]]:
    """(pid, ppid, pgid, sid) of every process we can see."""
    rows = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                raw = handle.read()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()
        try:
            rows.append((int(name), int(fields[1]), int(fields[2]), int(fields[3])))
        except (IndexError, ValueError):
            continue
    return rows


def _kill_all_of_uid() -> None:
    # kill(-1) from a process of the student's uid signals every process of that uid but itself
    os.kill(-1, signal.SIGKILL)


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return marker in handle.read().split(b"\0")
    except OSError:
        return False


def kill_session_tree(
    leader: int, identity: Identity | None, *, all_of_uid: bool, marker: bytes | None = None
) -> None:
    """SIGKILL the session led by ``leader``: its process group, session and descendants.

    Also every process whose environment holds ``marker`` (``NAME=value``: set in the shell's
    environment, inherited by everything it starts, so a double-forked ``setsid`` daemon is
    found too), and with ``all_of_uid`` (and a student identity) every process of the
    student's uid, which also catches a process that scrubbed its environment.
    """
    if identity is not None and all_of_uid and identity.uid != os.getuid():
        with contextlib.suppress(Exception):
            run_as(identity, _kill_all_of_uid, timeout_s=5)
    for _ in range(3):  # repeat: a fork racing with the kill can leave a straggler
        table = _process_table()
        doomed = {leader}
        doomed.update(pid for pid, _ppid, pgid, sid in table if pgid == leader or sid == leader)
        if marker is not None:
            doomed.update(pid for pid, *_ in table if _has_marker(pid, marker))
        changed = True
        while changed:
            changed = False
            for pid, ppid, _pgid, _sid in table:
                if ppid in doomed and pid not in doomed and pid != os.getpid():
                    doomed.add(pid)
                    changed = True
        doomed.discard(os.getpid())
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, signal.SIGKILL)
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if len(doomed) <= 1:
            break


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
        self.output_limit_chars = output_limit_chars
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
        self._stdin_w = -1
        self._status_r = -1
        self._out_r = -1
        self._pidfd = -1
        self._buffer = b""
        self.spill_bytes = max(4 * 1024 * 1024, 2 * self._window())
        self._head: bytes | None = None  # the output's head, once the file was spilled
        self._dropped = 0  # bytes dropped from the output file by spilling
        self._spiller: asyncio.Task[None] | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    async def start(self) -> None:
        """Start (or restart) the shell. Idempotent while it runs."""
        if self._proc is not None:
            return
        stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        fd, out_path = tempfile.mkstemp(prefix="out-", dir=self._dir)
        out_w = os.open(out_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        os.close(fd)
        out_r = os.open(out_path, os.O_RDWR | os.O_CLOEXEC)
        os.unlink(out_path)
        home = self.identity.home if self.identity else "/"
        cwd = self.cwd if os.path.isdir(self.cwd) else home  # noqa: ASYNC240 - local, instant
        try:
            # Blocking, but only a fork+exec (a few ms), and only at (re)start.
            proc = subprocess.Popen(  # noqa: ASYNC220
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
        finally:
            os.close(stdin_r)
            os.close(out_w)
            os.close(status_w)  # bash has its own copy, at the same number (pass_fds)
        self._proc = proc
        self._stdin_w, self._status_r, self._out_r = stdin_w, status_r, out_r
        self._pidfd = os.pidfd_open(proc.pid)
        os.set_blocking(status_r, False)
        self._buffer = b""
        self._head, self._dropped = None, 0
        self._spiller = asyncio.get_running_loop().create_task(self._spill_while_idle())
        # Move the status pipe to fd 3, then prove the shell answers.
        setup = f"exec 3>&{status_w} {status_w}>&-\n"
        self._write_control(setup)
        outcome = await self.run("true", timeout_s=10)
        if outcome.exit_code != 0:
            raise RuntimeError(f"the bash session did not start: {outcome.output.strip()!r}")

    def _preexec(self) -> None:
        if self.before_demote is not None:
            self.before_demote()
        preexec_for(self.identity)()

    async def close(self) -> None:
        """Kill the shell and everything it started; remove the session's files."""
        await self._stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    async def _stop(self) -> None:
        proc = self._proc
        if proc is None:
            return
        self._proc = None
        if self._spiller is not None:
            self._spiller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._spiller
            self._spiller = None
        kill_session_tree(
            proc.pid,
            self.identity,
            all_of_uid=self.kill_all_student_processes,
            marker=self._marker.encode(),
        )
        for _ in range(200):
            if proc.poll() is not None:
                break
            await asyncio.sleep(0.005)
        for fd in (self._stdin_w, self._status_r, self._out_r, self._pidfd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._stdin_w = self._status_r = self._out_r = self._pidfd = -1

    async def restart(self) -> None:
        await self._stop()
        await self.start()

    # ---- one command ------------------------------------------------------------------------
    def _write_control(self, line: str) -> None:
        data = line.encode()
        view = memoryview(data)
        while view:
            view = view[os.write(self._stdin_w, view) :]

    async def run(self, command: str, timeout_s: float) -> BashOutcome:
        """Run ``command`` in the shell; never raises for anything the command does."""
        started = time.monotonic()
        if self._proc is None:
            await self.start()
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
        with contextlib.suppress(BrokenPipeError):  # bash is gone: the wait below sees it
            self._write_control(control)
        status = await self._wait_status(nonce, timeout_s)
        outcome = BashOutcome(output="", exit_code=None)
        if isinstance(status, int):
            outcome.exit_code = status
        elif status == "timeout":
            outcome.timed_out = True
        else:
            outcome.shell_exited = self._proc.poll() if self._proc else None
        # Output includes what background processes wrote since the previous call.
        outcome.output, outcome.cut_chars = self._read_output()
        os.ftruncate(self._out_r, 0)
        self._head, self._dropped = None, 0
        outcome.output = outcome.output.replace(f"{self._cmd_path}: ", "bash: ")
        if outcome.exit_code is None:
            await self.restart()
            outcome.restarted = True
        outcome.duration_s = time.monotonic() - started
        return outcome

    async def _wait_status(self, nonce: str, timeout_s: float) -> int | str:
        """The command's exit status, ``"timeout"``, or ``"exited"`` when bash died."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        prefix = f"{nonce}:".encode()
        while True:
            found = self._scan_status(prefix)
            if found is not None:
                return found
            if self._proc is None or self._proc.poll() is not None:
                return "exited"
            self._spill()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return "timeout"
            ready: asyncio.Future[None] = loop.create_future()

            def _wake(fut: asyncio.Future[None] = ready) -> None:
                if not fut.done():
                    fut.set_result(None)

            loop.add_reader(self._status_r, _wake)
            loop.add_reader(self._pidfd, _wake)
            try:
                await asyncio.wait_for(ready, min(remaining, SPILL_CHECK_S))
            except TimeoutError:
                pass
            finally:
                loop.remove_reader(self._status_r)
                loop.remove_reader(self._pidfd)

    def _scan_status(self, prefix: bytes) -> int | None:
        while True:
            try:
                chunk = os.read(self._status_r, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            self._buffer += chunk
            if len(self._buffer) > 4 * _MAX_STATUS_LINE and b"\n" not in self._buffer:
                self._buffer = self._buffer[-_MAX_STATUS_LINE:]  # junk flood without newlines
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            if line.startswith(prefix):
                value = line[len(prefix) :]
                if value.isdigit():
                    return int(value)
        return None

    async def _spill_while_idle(self) -> None:
        """Background processes can write between calls too: keep spilling."""
        while True:
            await asyncio.sleep(SPILL_CHECK_S)
            with contextlib.suppress(OSError):
                self._spill()

    def _spill(self) -> None:
        """Keep the output file small while a command runs: remember its head, drop the rest.

        A command printing gigabytes (``yes``, ``cat /dev/zero``) must not fill the disk before
        its timeout; only the head and the tail are ever shown.
        """
        size = os.fstat(self._out_r).st_size
        if size <= self.spill_bytes:
            return
        if self._head is None:
            self._head = os.pread(self._out_r, self._window(), 0)
        os.ftruncate(self._out_r, 0)
        self._dropped += size

    def _window(self) -> int:
        return self.output_limit_chars * 4  # bytes per character at worst in UTF-8

    def _read_output(self) -> tuple[str, int]:
        limit, window = self.output_limit_chars, self._window()
        size = os.fstat(self._out_r).st_size
        if self._head is None and size <= 2 * window:
            data = os.pread(self._out_r, size, 0)
            return truncate_middle(data, len(data), limit)
        total = self._dropped + size
        head = self._head if self._head is not None else os.pread(self._out_r, window, 0)
        tail = os.pread(self._out_r, window, max(size - window, 0))
        head_text = head.decode("utf-8", errors="replace")[: limit // 2]
        tail_text = tail.decode("utf-8", errors="replace")
        tail_text = tail_text[len(tail_text) - (limit - limit // 2) :]
        cut = max(total - len(head_text.encode()) - len(tail_text.encode()), 0)
        note = f"\n\n[... about {cut} bytes of output cut (limit {limit} characters) ...]\n\n"
        return head_text + note + tail_text, cut


def describe(outcome: BashOutcome, timeout_s: float) -> tuple[str, bool]:
    """The text the agent sees for ``outcome``, and whether it is an error."""
    parts = [outcome.output if outcome.output else "(no output)"]
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
