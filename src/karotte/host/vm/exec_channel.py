"""``exec`` into a running VM: one command at a time over the ``karotte.exec`` virtio-serial port.

The VMM exposes the port as a unix socket in the sandbox's directory (``exec.sock``; QEMU's
socket chardev, which takes one client at a time). The host sends one JSON line
``{"id", "argv", "user", "timeout_s"}``; the guest's init
(:func:`karotte.host.vm.guest_init.exec_server`) runs the command with the sandbox's
confinement and answers one JSON line ``{"id", "code", "stdout", "stderr", "timed_out"}``
(outputs base64, each cut at 16 MiB). Callers in several processes take turns through a lock
file; an answer to an earlier, abandoned request is recognised by its id and skipped.
"""

from __future__ import annotations

import base64
import fcntl
import json
import socket
import time
import uuid
from pathlib import Path

from karotte.errors import KarotteError
from karotte.host.runtimes.base import ExecResult

# how long a command without its own timeout may run before the host gives up on the answer
DEFAULT_EXEC_TIMEOUT_S = 3600.0
# time for the request and the answer to cross, on top of the command's own timeout (TCG is slow)
CHANNEL_SLACK_S = 30.0


def exec_in_guest(
    socket_path: Path,
    lock_path: Path,
    argv: list[str],
    user: str | None = None,
    timeout_s: float | None = None,
    connect_within_s: float = 180.0,
) -> ExecResult:
    """Run ``argv`` in the guest; ``connect_within_s`` covers a VM still booting (the VMM makes
    the socket when it starts, and the guest reads the request once its init is up)."""
    if not argv:
        raise KarotteError("exec: empty command")
    request_id = uuid.uuid4().hex
    request = {"id": request_id, "argv": argv, "user": user, "timeout_s": timeout_s}
    with open(lock_path, "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with _connect(socket_path, connect_within_s) as sock:
            try:
                sock.sendall(json.dumps(request).encode() + b"\n")
            except OSError as exc:
                raise KarotteError(f"exec: the VM's exec channel broke: {exc}") from exc
            # the guest enforces the timeout; this is the backstop (it may still be booting)
            backstop = (timeout_s or DEFAULT_EXEC_TIMEOUT_S) + CHANNEL_SLACK_S + connect_within_s
            reply = _read_reply(sock, request_id, time.monotonic() + backstop)
    if reply.get("timed_out"):
        raise TimeoutError(f"exec of {argv[0]} in the VM timed out after {timeout_s} s")
    return ExecResult(
        returncode=int(str(reply["code"])),
        stdout=base64.b64decode(str(reply.get("stdout") or "")),
        stderr=base64.b64decode(str(reply.get("stderr") or "")),
    )


def _connect(path: Path, within_s: float) -> socket.socket:
    give_up = time.monotonic() + within_s
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        try:
            sock.connect(str(path))
            return sock
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            if time.monotonic() > give_up:
                raise KarotteError(f"exec: the VM's exec channel is not there: {exc}") from exc
            time.sleep(0.1)
        except OSError as exc:
            sock.close()
            raise KarotteError(f"exec: the VM's exec channel is not there: {exc}") from exc


def _read_reply(sock: socket.socket, request_id: str, deadline: float) -> dict[str, object]:
    buffer = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("exec: no answer from the VM in time")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(1 << 20)
        except TimeoutError:
            continue
        if not chunk:
            raise KarotteError("exec: the VM closed its exec channel (did it stop?)")
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            try:
                reply = json.loads(line)
            except ValueError:
                continue
            if isinstance(reply, dict) and reply.get("id") == request_id:
                return reply


__all__ = ["exec_in_guest"]
