"""Reaching the run backend from a sandbox that has no network (``--network=none``).

The launcher's end, :class:`HostBackendRelay`, listens on a unix socket in a fresh directory of
mode 0700 and relays each connection to the backend's TCP address (the same relay loop as the
model proxy's, :func:`karotte.sandbox.proxy_relay.serve`). The directory also holds ``token``, a
copy (mode 0600) of the bearer token file, kept up to date once a second so that rotation on the
host reaches running sandboxes. The launcher bind-mounts the directory at
:data:`SANDBOX_DIR`; the harness (root) then talks HTTP over the socket
(``KAROTTE_BACKEND_SOCKET``, see :class:`karotte.sandbox.backend_client.BackendConnection`) and
reads the token from ``SANDBOX_DIR/token``. The student (not root) can neither enter the
directory, so neither connect to the socket nor read the token, nor reach the backend over TCP:
the sandbox has no network interface but loopback, and nothing listens there for the backend.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from urllib.parse import urlsplit

from karotte.errors import ConfigError
from karotte.io import write_bytes_atomic
from karotte.sandbox.backend_client import SOCKET_ENV
from karotte.sandbox.proxy_relay import serve

SANDBOX_DIR = "/run/karotte/backend"
SOCKET_NAME = "backend.sock"
TOKEN_NAME = "token"  # noqa: S105 (a file name)


class HostBackendRelay:
    def __init__(self, backend_uri: str, token_file: Path | None, sync_interval_s: float = 1.0):
        parts = urlsplit(backend_uri)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"backend_uri {backend_uri!r}: expected http(s)://HOST[:PORT]")
        default_port = 443 if parts.scheme == "https" else 80
        self.address = (parts.hostname, parts.port or default_port)
        self.token_file = token_file
        self.socket_dir = Path(tempfile.mkdtemp(prefix="karotte-backend-"))
        self.socket_dir.chmod(0o700)
        self.socket_path = self.socket_dir / SOCKET_NAME
        self.token_copy = self.socket_dir / TOKEN_NAME
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.socket_path))
        self.listener.listen(64)
        self._stop = threading.Event()
        self.sync_token()
        threading.Thread(target=serve, args=(self.listener, self._connect), daemon=True).start()
        if token_file is not None:
            threading.Thread(target=self._sync_loop, args=(sync_interval_s,), daemon=True).start()

    def _connect(self) -> socket.socket:
        upstream = socket.create_connection(self.address, timeout=30)
        upstream.settimeout(None)  # long polls hold the connection
        return upstream

    def sync_token(self) -> None:
        """Copy the token file into the relay directory (0600) when it changed."""
        if self.token_file is None:
            return
        try:
            data = self.token_file.read_bytes()
        except OSError:
            return  # the harness reports the unreadable or missing token clearly
        with contextlib.suppress(OSError):
            if self.token_copy.read_bytes() == data:
                return
        write_bytes_atomic(self.token_copy, data, mode=0o600)

    def _sync_loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.sync_token()

    # ---- what the launcher puts into the sandbox -----------------------------------------
    def env(self) -> dict[str, str]:
        return {SOCKET_ENV: f"{SANDBOX_DIR}/{SOCKET_NAME}"}

    def sandbox_token_file(self) -> Path | None:
        return None if self.token_file is None else Path(SANDBOX_DIR) / TOKEN_NAME

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.listener.close()
        shutil.rmtree(self.socket_dir, ignore_errors=True)
