"""A unix socket that stands in for one of the launcher's relays in the VM tests: each
connection is read to its end and answered with ``prefix`` + what arrived."""

from __future__ import annotations

import socket
import threading
from pathlib import Path


def serve_unix_echo(path: Path, prefix: bytes) -> socket.socket:
    """Listen at ``path`` in a daemon thread; close the returned socket to stop."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)

    def answer() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                data = b""
                while chunk := conn.recv(4096):
                    data += chunk
                conn.sendall(prefix + data)

    threading.Thread(target=answer, daemon=True).start()
    return server
