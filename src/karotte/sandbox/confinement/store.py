"""A root-only key/value store that passes values from hooks to judges, out of the student's reach.

Values are JSON. The directory is ``0700`` and each value a ``0600`` file owned by the harness's
user; every open refuses symlinks, and writes are atomic (temp file + rename), so a reader never
sees half a value. Location, first match wins: the ``path`` argument, ``KAROTTE_STORE_DIR``,
``/intermediate_data/.karotte-store`` inside a sandbox (``KAROTTE_SANDBOX`` set), else a private
directory in the system temp dir for local runs.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from karotte.errors import KarotteError

SANDBOX_STORE_DIR = Path("/intermediate_data/.karotte-store")
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MISSING = object()


class StoreError(KarotteError):
    """The protected store is unsafe (wrong owner, a symlink) or a key or value is invalid."""


def default_store_dir() -> Path:
    explicit = os.environ.get("KAROTTE_STORE_DIR")
    if explicit:
        return Path(explicit)
    if os.environ.get("KAROTTE_SANDBOX"):
        return SANDBOX_STORE_DIR
    return Path(tempfile.gettempdir()) / f"karotte-store-{os.geteuid()}"


class ProtectedStore:
    """Root-only key/value store (JSON values): ``store["key"] = {...}``; ``store.get("key")``."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(os.path.abspath(path if path is not None else default_store_dir()))
        self._ensure_dir()

    # ---- safety --------------------------------------------------------------------------------
    def _ensure_dir(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.path, 0o700)
        fd = self._open_dir()
        os.close(fd)

    def _open_dir(self) -> int:
        try:
            fd = os.open(self.path, _DIR_FLAGS)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise StoreError(f"store {self.path} is a symlink or not a directory") from exc
            raise StoreError(f"store {self.path}: {exc.strerror or exc}") from exc
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            os.close(fd)
            raise StoreError(f"store {self.path} is owned by uid {st.st_uid}, not by us")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
        return fd

    @staticmethod
    def _check_key(key: str) -> str:
        if not isinstance(key, str) or not _KEY.match(key):
            raise StoreError(
                f"invalid store key {key!r}: use letters, digits, '.', '_' or '-' "
                "(up to 128 characters, not starting with '.', '_' or '-')"
            )
        return key

    # ---- API -----------------------------------------------------------------------------------
    def set(self, key: str, value: Any) -> None:
        """Store a JSON-serialisable value under ``key`` (atomically)."""
        name = self._check_key(key) + ".json"
        try:
            data = json.dumps(value, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise StoreError(f"value for key {key!r} is not JSON-serialisable: {exc}") from exc
        fd = self._open_dir()
        tmp = f".tmp-{secrets.token_hex(8)}"
        try:
            out = os.open(
                tmp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=fd,
            )
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(out, view) :]
                os.fsync(out)
            finally:
                os.close(out)
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=fd)
            raise
        finally:
            os.close(fd)

    def get(self, key: str, default: Any = None) -> Any:
        """The value stored under ``key``, or ``default``."""
        name = self._check_key(key) + ".json"
        fd = self._open_dir()
        try:
            try:
                handle = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                return default
            except OSError as exc:
                raise StoreError(f"store key {key!r}: {exc.strerror or exc}") from exc
            try:
                st = os.fstat(handle)
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                    raise StoreError(f"store key {key!r} is not a regular file of ours")
                with os.fdopen(os.dup(handle), "rb") as reader:
                    return json.loads(reader.read())
            finally:
                os.close(handle)
        finally:
            os.close(fd)

    def delete(self, key: str) -> None:
        name = self._check_key(key) + ".json"
        fd = self._open_dir()
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)

    def keys(self) -> list[str]:
        fd = self._open_dir()
        try:
            return sorted(
                name[: -len(".json")]
                for name in os.listdir(fd)
                if name.endswith(".json") and _KEY.match(name[: -len(".json")])
            )
        finally:
            os.close(fd)

    def __getitem__(self, key: str) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __setitem__(self, key: str, value: Any) -> None:
        self.set(key, value)

    def __delitem__(self, key: str) -> None:
        self.delete(key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key, _MISSING) is not _MISSING

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())
