"""The launcher's end of the model-API proxy relay: a unix socket (bind-mounted into the
sandbox at ``/run/karotte/proxy/proxy.sock``) whose connections go to the real proxy's TCP
address. See :mod:`karotte.sandbox.proxy_relay` for the sandbox's end."""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from urllib.parse import urlsplit

from karotte.errors import ConfigError
from karotte.sandbox.proxy_relay import serve


class HostProxyRelay:
    def __init__(self, proxy_url: str) -> None:
        parts = urlsplit(proxy_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ConfigError(
                f"--proxy {proxy_url!r}: expected http://HOST[:PORT] (the relay forwards TCP, so "
                "the proxy must speak plain HTTP; run it next to the launcher)"
            )
        if parts.path not in ("", "/"):
            raise ConfigError(f"--proxy {proxy_url!r}: give the proxy's root URL, without a path")
        self.address = (parts.hostname, parts.port or 80)
        self.socket_dir = Path(tempfile.mkdtemp(prefix="karotte-proxy-"))
        self.socket_dir.chmod(0o700)
        self.socket_path = self.socket_dir / "proxy.sock"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.socket_path))
        self.listener.listen(64)
        self._thread = threading.Thread(
            target=serve, args=(self.listener, self._connect), daemon=True
        )
        self._thread.start()

    def _connect(self) -> socket.socket:
        upstream = socket.create_connection(self.address, timeout=30)
        upstream.settimeout(None)  # model answers may take minutes
        return upstream

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.close()
        shutil.rmtree(self.socket_dir, ignore_errors=True)
