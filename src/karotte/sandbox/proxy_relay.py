"""Model-API proxy inside a sandbox that has no network: a loopback TCP port relayed to a unix
socket the launcher bind-mounts in (``KAROTTE_PROXY_LISTEN`` / ``KAROTTE_PROXY_SOCKET``).

The launcher's end (:mod:`karotte.host.runtimes.proxy_relay`) connects that socket to the real
proxy. The sandbox keeps ``--network=none``: the only way out is this one relay.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading


def pipe_both_ways(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes a→b and b→a until both sides are done; then close both."""

    def copy(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    other = threading.Thread(target=copy, args=(b, a), daemon=True)
    other.start()
    copy(a, b)
    other.join()
    a.close()
    b.close()


def serve(listener: socket.socket, connect: object) -> None:
    """Accept forever; relay each connection to a fresh socket from ``connect()``."""
    assert callable(connect)
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        try:
            upstream = connect()
        except OSError:
            client.close()
            continue
        threading.Thread(target=pipe_both_ways, args=(client, upstream), daemon=True).start()


def start_from_env() -> socket.socket | None:
    """Start the in-sandbox relay if the launcher asked for one; returns its listener."""
    listen = os.environ.get("KAROTTE_PROXY_LISTEN")
    path = os.environ.get("KAROTTE_PROXY_SOCKET")
    if not listen or not path:
        return None
    host, _, port = listen.rpartition(":")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, int(port)))
    listener.listen(64)

    def connect() -> socket.socket:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.connect(path)
        return upstream

    threading.Thread(target=serve, args=(listener, connect), daemon=True).start()
    return listener
