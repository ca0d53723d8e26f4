"""A clean environment for the root harness, and system binaries only from trusted directories.

:func:`sanitize_and_reexec` runs first thing at harness start: it removes every directory the
student could write to (and every relative or empty entry) from ``PATH`` and
``LD_LIBRARY_PATH``, every untrusted library from ``LD_PRELOAD`` and ``LD_AUDIT``, drops the
Python variables that make the interpreter import or run other code (``PYTHONPATH``,
``PYTHONHOME``, ``PYTHONSTARTUP``, ...), sets ``PYTHONSAFEPATH=1`` (no current directory on
``sys.path``), and re-executes the process when anything changed, so that nothing already
imported came from a student-controlled place. A marker variable stops exec loops.

A directory is *trusted* when it and every directory above it is owned by root (or by the
harness's own user), is not writable by others, and is group-writable only for group root.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping

from karotte.errors import KarotteError

PATH_LIKE = ("PATH", "LD_LIBRARY_PATH")
FILE_LISTS = ("LD_PRELOAD", "LD_AUDIT")
DROPPED = (
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
    "PYTHONBREAKPOINT",
    "PYTHONEXECUTABLE",
    "PYTHONINSPECT",
    "PYTHONPYCACHEPREFIX",
)
REEXEC_MARKER = "KAROTTE_SANITIZED"
SYSTEM_BIN_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


class UntrustedBinaryError(KarotteError):
    """No trusted copy of a system binary exists (or the only one is in an unsafe place)."""


def _owner_ok(st: os.stat_result, owners: set[int]) -> bool:
    if st.st_uid not in owners:
        return False
    if stat.S_ISLNK(st.st_mode):
        return True  # a symlink's own mode means nothing; its directory was checked
    if st.st_mode & stat.S_IWOTH:
        return False
    return not (st.st_mode & stat.S_IWGRP and st.st_gid != 0)


def _chain_trusted(path: str, owners: set[int]) -> bool:
    current = "/"
    for part in [p for p in path.split("/") if p]:
        current = os.path.join(current, part)
        try:
            st = os.lstat(current)
        except OSError:
            return False
        if not _owner_ok(st, owners):
            return False
    try:
        return _owner_ok(os.lstat("/"), owners)
    except OSError:
        return False


def is_trusted_path(path: str, owners: set[int] | None = None) -> bool:
    """Whether ``path`` (absolute) and its real location can only be changed by ``owners``.

    Default owners: root and the current effective user.
    """
    if not path or not os.path.isabs(path):
        return False
    allowed = owners if owners is not None else {0, os.geteuid()}
    normal = os.path.normpath(path)
    return _chain_trusted(normal, allowed) and _chain_trusted(os.path.realpath(normal), allowed)


def _clean_dirs(value: str, owners: set[int]) -> str:
    kept: list[str] = []
    for entry in value.split(":"):
        if entry and is_trusted_path(entry, owners) and entry not in kept:
            kept.append(entry)
    return ":".join(kept)


def _clean_files(value: str, owners: set[int]) -> str:
    kept = []
    for entry in value.replace(" ", ":").split(":"):
        if entry and is_trusted_path(entry, owners):
            kept.append(entry)
    return ":".join(kept)


def sanitized_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without student-controlled search paths or Python start-up hooks."""
    owners = {0, os.geteuid()}
    clean = dict(env)
    for name in DROPPED:
        clean.pop(name, None)
    for name in PATH_LIKE:
        if name in clean:
            value = _clean_dirs(clean[name], owners)
            if value:
                clean[name] = value
            else:
                del clean[name]
    for name in FILE_LISTS:
        if name in clean:
            value = _clean_files(clean[name], owners)
            if value:
                clean[name] = value
            else:
                del clean[name]
    if "PATH" not in clean:
        clean["PATH"] = ":".join(d for d in SYSTEM_BIN_DIRS if is_trusted_path(d, {0}))
    clean["PYTHONSAFEPATH"] = "1"
    return clean


def sanitize_and_reexec(argv: list[str] | None = None) -> bool:
    """Clean the environment and re-exec if it changed. Returns False when nothing changed.

    Call it first thing in the harness's entry point (before importing the environment's code).
    On the second pass (marker set) it never execs again: it cleans ``os.environ`` in place.
    """
    clean = sanitized_environment(os.environ)
    current = {k: v for k, v in os.environ.items() if k != REEXEC_MARKER}
    if clean == current:
        return False
    if os.environ.get(REEXEC_MARKER):
        os.environ.clear()
        os.environ.update(clean)
        return True
    clean[REEXEC_MARKER] = "1"
    args = argv if argv is not None else list(sys.orig_argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *args[1:]], clean)  # noqa: S606
    raise AssertionError("unreachable")  # pragma: no cover


def resolve_system_binary(name: str, search: tuple[str, ...] = SYSTEM_BIN_DIRS) -> str:
    """Absolute path of a system binary found only in root-owned, non-writable directories.

    The binary itself must be a root-owned regular file that nobody else can write. Raises
    :class:`UntrustedBinaryError` naming every place looked at.
    """
    if "/" in name or not name:
        raise UntrustedBinaryError(f"binary name {name!r} must be a bare name")
    for directory in search:
        candidate = os.path.join(directory, name)
        if not is_trusted_path(directory, {0}):
            continue
        try:
            st = os.stat(candidate)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111:
            continue
        if not is_trusted_path(candidate, {0}):
            continue
        return candidate
    raise UntrustedBinaryError(
        f"{name}: no root-owned executable in a root-owned directory ({', '.join(search)}); "
        "install it in the image (apt-get) or check the permissions of those directories"
    )
