"""Running the dashboard: bind a socket first (so the URL is known, also for port 0), then serve
the app on it with uvicorn."""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import uvicorn

from karotte.host.dashboard.app import _loopback_names, create_app


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    return host in ("0.0.0.0", "::", "")  # noqa: S104


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port). Raises ``OSError``."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and is_wildcard(host):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(128)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


def url_of(sock: socket.socket, host: str) -> str:
    port = sock.getsockname()[1]
    shown = "127.0.0.1" if is_wildcard(host) else host
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/"


def allowed_hosts_for(host: str) -> set[str] | None:
    """Host names the app accepts: the bound one (and loopback aliases); any for a wildcard."""
    return None if is_wildcard(host) else _loopback_names(host)


def serve(
    root: Path,
    sock: socket.socket,
    host: str,
    on_ready: Callable[[], None] | None = None,
    log_level: str = "warning",
) -> None:
    """Serve the dashboard over ``root`` on ``sock`` until interrupted."""
    app = create_app(root, allowed_hosts=allowed_hosts_for(host))
    # read the directory's summaries while the browser starts
    threading.Thread(target=app.state.index.runs, name="dashboard-warm", daemon=True).start()
    config = uvicorn.Config(
        app, log_level=log_level, access_log=False, lifespan="off", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    if on_ready is not None:
        original = server.startup

        async def startup(sockets: list[socket.socket] | None = None) -> None:
            await original(sockets)
            on_ready()

        server.startup = startup  # type: ignore[method-assign]
    server.run(sockets=[sock])
