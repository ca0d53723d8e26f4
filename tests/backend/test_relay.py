"""The sandbox's way to the backend: a unix socket in a root-only directory (with a synced copy
of the token), relayed to the backend's TCP port; a non-root user (the student) can use
neither."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from karotte.backend.relay import HostBackendRelay
from karotte.sandbox.backend_client import BackendConnection, BackendError

from .conftest import Backend


def test_the_harness_reaches_the_backend_over_the_relay_socket(
    backend: Backend, client_token: Path
) -> None:
    relay = HostBackendRelay(backend.url, client_token, sync_interval_s=0.1)
    try:
        assert stat.S_IMODE(relay.socket_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE(relay.token_copy.stat().st_mode) == 0o600
        assert relay.env() == {"KAROTTE_BACKEND_SOCKET": "/run/karotte/backend/backend.sock"}
        # the URI names only the Host; the bytes go through the socket
        conn = BackendConnection(
            "http://backend.invalid", relay.token_copy, socket_path=str(relay.socket_path)
        )
        assert conn.request("GET", "/v1/runs").json() == {"runs": []}
        # rotation on the host reaches the copy inside
        backend.token_file.write_text("secret-2\n")
        client_token.write_text("secret-2\n")
        deadline = time.monotonic() + 5
        while relay.token_copy.read_text() != "secret-2\n" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert conn.request("GET", "/v1/runs").status_code == 200
    finally:
        relay.close()
    assert not relay.socket_dir.exists()
    gone = BackendConnection("http://backend.invalid", socket_path=str(relay.socket_path))
    with pytest.raises(BackendError, match="unreachable"):
        gone.request("GET", "/v1/runs")


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
PYTHON = "/usr/bin/python3"  # the venv's interpreter may live under /root
STUDENT_PROBE = """
import socket, sys
path = sys.argv[1]
try:
    open(path + "/token").read()
    print("read-token")
except PermissionError:
    print("token-denied")
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(path + "/backend.sock")
    print("connected")
except PermissionError:
    print("socket-denied")
"""


@pytest.mark.requires_root
@pytest.mark.skipif(
    not Path(PYTHON).exists(), reason=f"{PYTHON} is needed to run a probe as user nobody"
)
def test_a_non_root_user_can_neither_connect_nor_read_the_token(
    backend: Backend, client_token: Path
) -> None:
    relay = HostBackendRelay(backend.url, client_token)
    try:
        probe = subprocess.run(
            [*NOBODY, PYTHON, "-c", STUDENT_PROBE, str(relay.socket_dir)],
            capture_output=True,
            text=True,
            timeout=30,
            env={"PATH": os.environ.get("PATH", "")},
        )
        assert probe.stdout.split() == ["token-denied", "socket-denied"], probe.stderr
    finally:
        relay.close()
