"""Acting as the student: demotion primitives for built-in and custom tools.

The harness runs as root; everything a tool does *on the student's behalf* must happen with the
student's credentials, so that the kernel's permission checks stop the student from reaching what
it could not reach itself (``/root_data/answer``, another user's files, ...).

- :func:`student_identity` looks the student up (uid, gid, home).
- :func:`demoted_env` builds a clean environment for the student: never the harness's own.
- :func:`preexec_for` demotes a child process started with :class:`subprocess.Popen`.
- :func:`run_as` runs a Python function in a forked child that has dropped to the student, with a
  timeout, and returns its (pickled) result. The child is non-dumpable, so the student cannot
  ptrace it or open its ``/proc/<pid>/fd`` entries while it works.
- :func:`read_file_as` / :func:`write_file_as` read or write one *regular* file as the student:
  no FIFOs, devices, directories or final-component symlinks, bounded size, bounded time.

Without an identity (``None``: local runs) the same functions act as the current user but keep
the same safety (regular files only, non-blocking opens, size caps, timeouts).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import pickle
import pwd
import re
import select
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

SYSTEM_PATH_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
DEFAULT_WORKDIR = "/workdir"
MAX_RESULT_BYTES = 256 * 1024 * 1024

_SECRET_NAME = re.compile(
    r"(^KAROTTE_|^LITELLM_|API_?KEY|SECRET|TOKEN|PASSW|CREDENTIAL|^AWS_|^AZURE_|^GOOGLE_APPLICATION"
    r"|^SSH_AUTH_SOCK$|^PRIVATE_KEY)",
    re.IGNORECASE,
)
_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_PDEATHSIG = 1


class DemotionError(RuntimeError):
    """Dropping to the student failed (unknown user, or we lack the privilege to switch)."""


class DemotedCallTimeout(TimeoutError):
    """A :func:`run_as` child did not finish in time; it was killed."""


class DemotedCallCrashed(RuntimeError):
    """A :func:`run_as` child died without returning a result (killed, or result too big)."""


class FileAccessError(OSError):
    """A file could not be opened as a regular file by the acting user. The message says why."""


class FileTooLargeError(FileAccessError):
    """The file is bigger than the allowed size."""


@dataclass(frozen=True)
class Identity:
    """Who a tool acts as: a user name, uid, primary gid and home directory."""

    name: str
    uid: int
    gid: int
    home: str


def _pick_home(pw_dir: str) -> str:
    for candidate in (pw_dir, DEFAULT_WORKDIR):
        if candidate and os.path.isdir(candidate):
            return candidate
    return "/"


def student_identity(name: str) -> Identity:
    """The identity of user ``name`` (from the password database).

    ``home`` is the user's home directory if it exists, else ``/workdir`` if it exists, else ``/``.
    """
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise DemotionError(
            f"student_user {name!r} does not exist in this sandbox (no passwd entry). "
            "Create it in the image (useradd) or unset student_user for local runs."
        ) from None
    if entry.pw_uid == 0:
        raise DemotionError(f"student_user {name!r} has uid 0; the student must be unprivileged")
    return Identity(name=name, uid=entry.pw_uid, gid=entry.pw_gid, home=_pick_home(entry.pw_dir))


def current_identity() -> Identity:
    """The identity of the current process (used when no student user is configured)."""
    uid = os.getuid()
    try:
        entry = pwd.getpwuid(uid)
        name, home = entry.pw_name, _pick_home(entry.pw_dir)
    except KeyError:
        name, home = str(uid), _pick_home(os.environ.get("HOME", ""))
    return Identity(name=name, uid=uid, gid=os.getgid(), home=home)


def is_secret_name(name: str) -> bool:
    """Whether an environment variable name looks like a secret or harness-internal setting,
    or is named secret by a ``karotte.harness_secret_env`` plugin."""
    if _SECRET_NAME.search(name):
        return True
    from karotte.plugins import harness_secret_env

    return name in harness_secret_env()


def safe_system_path() -> list[str]:
    """System binary dirs that exist, are owned by root and writable by nobody else."""
    dirs: list[str] = []
    for path in SYSTEM_PATH_DIRS:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            continue
        real = os.path.realpath(path)
        if any(os.path.realpath(d) == real for d in dirs):
            continue  # merged /usr: /bin -> /usr/bin
        dirs.append(path)
    return dirs


def student_venv_bin(identity: Identity) -> str | None:
    """The student's virtualenv ``bin`` dir (``/workdir/.venv`` or ``~/.venv``), if present."""
    for root in (DEFAULT_WORKDIR, identity.home):
        candidate = os.path.join(root, ".venv", "bin")
        if os.path.isfile(os.path.join(candidate, "python")) or os.path.isdir(candidate):
            return candidate
    return None


def demoted_env(
    identity: Identity | None,
    extra: Mapping[str, str] | None = None,
    *,
    inherit_path: bool = False,
) -> dict[str, str]:
    """A clean environment for ``identity`` (``None``: the current user).

    Nothing is passed through from the harness's own environment, except the caller's ``PATH``
    when ``inherit_path`` is set (local runs). ``extra`` is added, minus anything whose name looks
    like a secret (``*_API_KEY``, ``*TOKEN*``, ``KAROTTE_*``, ...).
    """
    who = identity or current_identity()
    path = []
    venv = student_venv_bin(who)
    if venv:
        path.append(venv)
    path.extend(safe_system_path())
    if inherit_path:
        path.extend(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p not in path)
    env = {
        "HOME": who.home,
        "USER": who.name,
        "LOGNAME": who.name,
        "SHELL": "/bin/bash",
        "PATH": os.pathsep.join(path),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "PYTHONUNBUFFERED": "1",
        "DEBIAN_FRONTEND": "noninteractive",
    }
    if venv:
        env["VIRTUAL_ENV"] = os.path.dirname(venv)
    for key, value in (extra or {}).items():
        if not is_secret_name(key):
            env[key] = str(value)
    return env


_libc: ctypes.CDLL | None = None


def _prctl(option: int, arg: int) -> int:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return int(_libc.prctl(option, arg, 0, 0, 0))


def set_no_new_privs() -> None:
    """Forbid gaining privileges through setuid binaries (``sudo``, ``su``) from now on."""
    if _prctl(_PR_SET_NO_NEW_PRIVS, 1) != 0:
        raise DemotionError(f"prctl(PR_SET_NO_NEW_PRIVS) failed: errno {ctypes.get_errno()}")


def set_parent_death_signal(signum: int) -> None:
    """Have the kernel send ``signum`` to this process when its parent thread exits.

    Call it *after* :func:`demote_current_process`: a change of credentials clears it.
    """
    _prctl(_PR_SET_PDEATHSIG, signum)


def is_dumpable() -> bool:
    """Whether this process can be ptraced / have its /proc entries read by its own uid."""
    return _prctl(_PR_GET_DUMPABLE, 0) == 1


def demote_current_process(identity: Identity | None, *, no_new_privs: bool = True) -> None:
    """Drop this process to ``identity``: no supplementary groups, its gid, its uid (all three).

    ``None`` keeps the current user. The process is left non-dumpable (not ptrace-able by the
    student) until it execs. Raises :class:`DemotionError` when the switch is impossible or did
    not take effect.
    """
    if identity is not None and (os.getuid(), os.geteuid()) != (identity.uid, identity.uid):
        if os.geteuid() != 0:
            raise DemotionError(
                f"cannot act as {identity.name!r} (uid {identity.uid}): the harness runs as "
                f"uid {os.geteuid()}, not root"
            )
        os.setgroups([])
        os.setresgid(identity.gid, identity.gid, identity.gid)
        os.setresuid(identity.uid, identity.uid, identity.uid)
        if os.getresuid() != (identity.uid,) * 3 or os.getresgid() != (identity.gid,) * 3:
            raise DemotionError(f"demotion to {identity.name!r} did not take effect")
        if os.getgroups() not in ([], [identity.gid]):
            raise DemotionError("supplementary groups were not dropped")
    _prctl(_PR_SET_DUMPABLE, 0)
    if no_new_privs:
        set_no_new_privs()


def preexec_for(identity: Identity | None, *, no_new_privs: bool = True) -> Callable[[], None]:
    """A ``preexec_fn`` for :class:`subprocess.Popen` that demotes the child to ``identity``.

    Combine with ``start_new_session=True`` and ``env=demoted_env(identity)``; never pass the
    harness's own environment.
    """

    def _preexec() -> None:
        demote_current_process(identity, no_new_privs=no_new_privs)

    return _preexec


# ---- run_as: a function in a demoted forked child -------------------------------------------


def _portable_exception(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))  # noqa: S301 - round trip of our own object
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def _child_main(
    identity: Identity | None, write_fd: int, fn: Callable[..., Any], args: Any, kwargs: Any
) -> None:
    # Only this thread exists in the child. Never return into the caller's code.
    try:
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(signum, signal.SIG_DFL)
        try:
            demote_current_process(identity)
            payload: tuple[str, Any] = ("ok", fn(*args, **kwargs))
        except BaseException as exc:
            payload = ("err", _portable_exception(exc))
        try:
            data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            data = pickle.dumps(("err", RuntimeError(f"result is not picklable: {exc}")))
        view = memoryview(data)
        while view:
            view = view[os.write(write_fd, view) :]
    finally:
        os._exit(0)


def _reap_later(pid: int) -> None:
    def _reap() -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)

    threading.Thread(target=_reap, name=f"karotte-reap-{pid}", daemon=True).start()


def _kill_and_reap(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    for _ in range(20):
        try:
            done, _status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(0.001)
    _reap_later(pid)  # stuck in the kernel (D state): don't block the caller on it


def run_as(
    identity: Identity | None,
    fn: Callable[..., T],
    *args: Any,
    timeout_s: float = 30.0,
    max_result_bytes: int = MAX_RESULT_BYTES,
    **kwargs: Any,
) -> T:
    """Run ``fn(*args, **kwargs)`` in a forked child acting as ``identity``; return its result.

    ``timeout_s`` and ``max_result_bytes`` are for ``run_as`` itself. The child drops
    supplementary groups, gid and uid, is non-dumpable and has ``no_new_privs``. ``fn`` needs no
    pickling (fork shares memory); its result and exceptions do. An exception raised by ``fn``
    is re-raised here. Raises :class:`DemotedCallTimeout` when the child overruns (it is
    SIGKILLed) and :class:`DemotedCallCrashed` when it dies without a result.

    Blocking: from async code call it through ``asyncio.to_thread``.
    """
    max_result = max_result_bytes
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    try:
        pid = os.fork()
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        raise
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read_fd)
        _child_main(identity, write_fd, fn, args, kwargs)
    os.close(write_fd)
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    size = 0
    finished = False
    try:
        poller = select.poll()
        poller.register(read_fd, select.POLLIN | select.POLLHUP)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if not poller.poll(remaining * 1000):
                continue
            chunk = os.read(read_fd, 1 << 20)
            if not chunk:
                finished = True
                break
            size += len(chunk)
            if size > max_result:
                break
            chunks.append(chunk)
    finally:
        os.close(read_fd)
        if finished:  # EOF: the child closed its end, i.e. it is exiting
            os.waitpid(pid, 0)
        else:
            _kill_and_reap(pid)
    if not finished:
        if size > max_result:
            raise DemotedCallCrashed(f"result of {_name(fn)} exceeds {max_result} bytes")
        raise DemotedCallTimeout(f"{_name(fn)} did not finish within {timeout_s:g}s (killed)")
    if not chunks:
        raise DemotedCallCrashed(f"{_name(fn)} died without a result (killed by a signal?)")
    status, value = pickle.loads(b"".join(chunks))  # noqa: S301 - our own non-dumpable child
    if status == "err":
        raise value
    return value  # type: ignore[no-any-return]


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", repr(fn))


# ---- the zygote: cheap forks for importable functions ------------------------------------


class _Zygote:
    """Client of :mod:`karotte.sandbox.confinement.zygote` (one request at a time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the zygote if it is not running (returns at once; it boots meanwhile)."""
        if self._proc is not None and self._proc.poll() is None:
            return
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-m", "karotte.sandbox.confinement.zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        )

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()

    def call(self, request: bytes, deadline_s: float, max_answer: int) -> tuple[str, Any]:
        with self._lock:
            for attempt in range(2):
                self.start()
                proc = self._proc
                assert proc is not None and proc.stdin is not None and proc.stdout is not None
                try:
                    proc.stdin.write(len(request).to_bytes(8, "big") + request)
                    proc.stdin.flush()
                except (BrokenPipeError, OSError):
                    self.stop()  # died since the last call: one fresh try
                    continue
                answer = self._read_answer(proc.stdout.fileno(), deadline_s, max_answer)
                if answer is None:
                    self.stop()
                    if attempt == 0 and time.monotonic() < deadline_s:
                        continue
                    raise DemotedCallCrashed("the zygote died or sent a bad answer")
                if answer == b"timeout":
                    self.stop()
                    raise DemotedCallTimeout("the zygote did not answer in time (restarted)")
                status, value = pickle.loads(answer)  # noqa: S301 - our own root process
                return str(status), value
            raise DemotedCallCrashed("the zygote could not be started")

    @staticmethod
    def _read_answer(fd: int, deadline_s: float, max_answer: int) -> bytes | None:
        buffer = b""
        need: int | None = None
        while need is None or len(buffer) < need + 8:
            remaining = deadline_s - time.monotonic()
            if remaining <= 0:
                return b"timeout"
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None
            buffer += chunk
            if need is None and len(buffer) >= 8:
                need = int.from_bytes(buffer[:8], "big")
                if need > max_answer:
                    return None
        return buffer[8 : 8 + need]


_zygote = _Zygote()


def start_zygote() -> None:
    """Boot the zygote ahead of the first :func:`call_as` (optional; it starts on demand)."""
    _zygote.start()


def stop_zygote() -> None:
    _zygote.stop()


def _importable(fn: Callable[..., Any]) -> tuple[str, str] | None:
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname or "<" in qualname or module == "__main__":
        return None
    return module, qualname


def call_as(
    identity: Identity | None,
    fn: Callable[..., T],
    *args: Any,
    timeout_s: float = 30.0,
    max_result_bytes: int = MAX_RESULT_BYTES,
    **kwargs: Any,
) -> T:
    """:func:`run_as`, forked from the small zygote process when ``fn`` is importable by name.

    Same semantics and errors as :func:`run_as` (which it falls back to for closures and
    lambdas), but a fork costs a few ms instead of tens of ms in a big harness. ``args``,
    ``kwargs`` and the result must be picklable.
    """
    where = _importable(fn)
    if where is None or os.environ.get("KAROTTE_NO_ZYGOTE"):
        return run_as(
            identity, fn, *args, timeout_s=timeout_s, max_result_bytes=max_result_bytes, **kwargs
        )
    request = pickle.dumps(
        (identity, where[0], where[1], args, kwargs, timeout_s, max_result_bytes),
        protocol=pickle.HIGHEST_PROTOCOL,
    )
    # grace: booting a fresh zygote (~0.5 s) plus the fork and the answer
    deadline = time.monotonic() + timeout_s + 10.0
    status, value = _zygote.call(request, deadline, max_result_bytes + (1 << 20))
    if status == "err":
        raise value
    return value  # type: ignore[no-any-return]


# ---- opening files safely (call these inside run_as) -----------------------------------------

_KIND = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFLNK: "a symbolic link",
}


def _kind(mode: int) -> str:
    return _KIND.get(stat.S_IFMT(mode), "not a regular file")


def _describe_os_error(path: str, exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return f"{path}: no such file or directory"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{path}: permission denied"
    if exc.errno == errno.ENOTDIR:
        return f"{path}: a component of the path is not a directory"
    return f"{path}: {exc.strerror or exc}"


def open_regular_file(
    path: str,
    *,
    write: bool = False,
    create: bool = False,
    mode: int = 0o644,
    max_bytes: int | None = None,
) -> int:
    """Open ``path`` as a regular file and return the fd; refuse anything else.

    Refuses symlinks (final component), FIFOs, devices, sockets and directories without blocking
    (``O_NOFOLLOW | O_NONBLOCK``, ``lstat`` before and ``fstat`` after the open), and files bigger
    than ``max_bytes``. Errors are :class:`FileAccessError` with a message fit for the model.
    Meant to run inside :func:`run_as`, so the kernel checks the student's permissions.
    """
    try:
        before: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        if not (write and create):
            raise FileAccessError(f"{path}: no such file or directory") from None
        before = None
    except OSError as exc:
        raise FileAccessError(_describe_os_error(path, exc)) from None
    if before is not None and stat.S_ISLNK(before.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        raise FileAccessError(
            f"{path}: is a symbolic link (to {target}); refusing to follow it. "
            "Use the target path directly."
        )
    if before is not None and not stat.S_ISREG(before.st_mode):
        raise FileAccessError(f"{path}: is {_kind(before.st_mode)}, not a regular file")
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    flags |= os.O_WRONLY if write else os.O_RDONLY
    if write and create:
        flags |= os.O_CREAT
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileAccessError(f"{path}: is a symbolic link; refusing to follow it") from None
        raise FileAccessError(_describe_os_error(path, exc)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileAccessError(f"{path}: is {_kind(st.st_mode)}, not a regular file")
        if before is not None and (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise FileAccessError(f"{path}: changed while being opened; try again")
        if max_bytes is not None and st.st_size > max_bytes and not write:
            raise FileTooLargeError(
                f"{path}: is {st.st_size} bytes, more than the limit of {max_bytes} bytes"
            )
        if not write:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular_file(path: str, max_bytes: int) -> bytes:
    """Read a whole regular file of at most ``max_bytes`` (see :func:`open_regular_file`)."""
    fd = open_regular_file(path, max_bytes=max_bytes)
    try:
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise FileTooLargeError(f"{path}: is more than the limit of {max_bytes} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_regular_file(path: str, data: bytes, *, create: bool = True, mode: int = 0o644) -> int:
    """Replace the content of a regular file (created if missing and ``create``); bytes written."""
    fd = open_regular_file(path, write=True, create=create, mode=mode)
    try:
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        return len(data)
    finally:
        os.close(fd)


def read_file_as(
    identity: Identity | None, path: str, *, max_bytes: int, timeout_s: float = 10.0
) -> bytes:
    """Read a regular file as ``identity``: a symlink, FIFO, device or oversized file is refused."""
    return call_as(identity, read_regular_file, path, max_bytes, timeout_s=timeout_s)


def write_file_as(
    identity: Identity | None,
    path: str,
    data: bytes,
    *,
    create: bool = True,
    mode: int = 0o644,
    timeout_s: float = 10.0,
) -> int:
    """Write a regular file as ``identity`` (never through a symlink); returns bytes written."""
    return call_as(
        identity, write_regular_file, path, data, create=create, mode=mode, timeout_s=timeout_s
    )


__all__ = [
    "DemotedCallCrashed",
    "DemotedCallTimeout",
    "DemotionError",
    "FileAccessError",
    "FileTooLargeError",
    "Identity",
    "call_as",
    "current_identity",
    "demote_current_process",
    "demoted_env",
    "is_dumpable",
    "is_secret_name",
    "open_regular_file",
    "preexec_for",
    "read_file_as",
    "read_regular_file",
    "run_as",
    "safe_system_path",
    "set_no_new_privs",
    "set_parent_death_signal",
    "start_zygote",
    "stop_zygote",
    "student_identity",
    "student_venv_bin",
    "write_file_as",
    "write_regular_file",
]
