"""A real reference backend (uvicorn on a loopback port, in a thread) and a TCP proxy in front
of it that can drop every connection for a while (an outage)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from karotte.backend.server import create_app

ENVS = Path(__file__).parent / "envs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerThread:
    def __init__(self, app: Any, port: int) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@dataclass
class Backend:
    db: Path
    token_file: Path
    port: int
    clock_offset: list[float] = field(default_factory=lambda: [0.0])
    upload_ttl_s: float = 300.0
    server: ServerThread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def clock(self) -> float:
        return time.time() + self.clock_offset[0]

    def start(self) -> None:
        app = create_app(self.db, self.token_file, upload_ttl_s=self.upload_ttl_s, clock=self.clock)
        self.server = ServerThread(app, self.port)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[Backend]:
    token = tmp_path / "server-token"
    token.write_text("secret-1\n")
    server = Backend(db=tmp_path / "backend.db", token_file=token, port=free_port())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def client_token(tmp_path: Path) -> Path:
    path = tmp_path / "client-token"
    path.write_text("secret-1\n")
    path.chmod(0o600)
    return path


class DroppingProxy:
    """Relays TCP to ``target``; while ``dropping``, every connection (new or open) is cut."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = free_port()
        self.dropping = False
        self.dropped = 0
        self.relayed = 0
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def drop_for(self, seconds: float) -> None:
        self.dropping = True
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        timer = threading.Timer(seconds, self._resume)
        timer.daemon = True  # a long outage must not keep the test process alive
        timer.start()

    def _resume(self) -> None:
        self.dropping = False

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.dropping:
                self.dropped += 1
                client.close()
                continue
            self.relayed += 1
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._copy, args=(a, b), daemon=True).start()

    def _copy(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self.dropping:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def proxy(backend: Backend) -> Iterator[DroppingProxy]:
    relay = DroppingProxy(backend.port)
    yield relay
    relay.close()
