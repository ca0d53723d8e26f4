"""Forwarding the launcher's relay sockets into a VM, without a VM: which sockets are forwarded,
QEMU's restricted user network for them, the per-connection bridge QEMU runs (for real, over a
socketpair as QEMU gives it), sockets left out of the io drive, and the runtime that refuses."""

from __future__ import annotations

import shlex
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from karotte.errors import KarotteError
from karotte.host.runtimes.base import Mount
from karotte.host.vm import drives
from karotte.host.vm.socket_forward import (
    FORWARD_ADDRESS,
    bridge_command,
    find_socket_forwards,
    qemu_network_args,
    refuse_socket_forwards,
)

from .unix_echo import serve_unix_echo


@pytest.fixture
def echo_socket(tmp_path: Path) -> Iterator[Path]:
    """A unix socket answering ``echo:<what it got>`` per connection, like a relay would."""
    relay = tmp_path / "relay"
    relay.mkdir(mode=0o700)
    path = relay / "proxy.sock"
    server = serve_unix_echo(path, b"echo:")
    yield path
    server.close()


def test_only_sockets_at_the_top_of_mounted_directories_are_forwarded(
    tmp_path: Path, echo_socket: Path
) -> None:
    (echo_socket.parent / "token").write_text("secret")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "file.txt").write_text("x")
    forwards = find_socket_forwards(
        [
            Mount(source=plain, target="/data"),
            Mount(source=echo_socket.parent, target="/run/karotte/proxy/"),
            Mount(source=plain / "file.txt", target="/one-file"),
        ]
    )
    assert [(f.host_path, f.guest_path) for f in forwards] == [
        (echo_socket, "/run/karotte/proxy/proxy.sock")
    ]
    assert forwards[0].guest_config() == {
        "path": "/run/karotte/proxy/proxy.sock",
        "address": FORWARD_ADDRESS,
        "port": forwards[0].port,
    }


def test_qemu_network_is_restricted_and_only_there_for_forwards(
    tmp_path: Path, echo_socket: Path
) -> None:
    assert qemu_network_args([]) == []  # no relay, no network device at all
    second = tmp_path / "other,dir"
    second.mkdir()
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(second / "backend.sock"))
    forwards = find_socket_forwards(
        [Mount(source=echo_socket.parent, target="/a"), Mount(source=second, target="/b")]
    )
    args = qemu_network_args(forwards)
    other.close()
    assert args[0] == "-netdev" and args[2:] == [
        "-device",
        "virtio-net-device,netdev=karotte-net",
    ]
    netdev = args[1]
    assert netdev.startswith("user,id=karotte-net,restrict=on,ipv6=off,")
    guestfwds = netdev.split(",guestfwd=")[1:]
    assert len(guestfwds) == 2
    assert guestfwds[0].startswith(f"tcp:{FORWARD_ADDRESS}:{forwards[0].port}-cmd:")
    # a comma in a path is doubled, QEMU's escape, so the option list is not cut there
    assert "other,,dir/backend.sock" in guestfwds[1]
    assert "hostfwd" not in netdev and "smb" not in netdev


def test_bridge_joins_a_connection_to_the_host_socket(echo_socket: Path) -> None:
    # QEMU hands the command one end of a socketpair as stdin, stdout and stderr
    ours, theirs = socket.socketpair()
    argv = shlex.split(bridge_command(echo_socket))
    proc = subprocess.Popen(
        argv, stdin=theirs.fileno(), stdout=theirs.fileno(), stderr=theirs.fileno()
    )
    theirs.close()
    ours.sendall(b"GET / HTTP/1.1\r\n\r\n")
    ours.shutdown(socket.SHUT_WR)
    reply = b""
    ours.settimeout(10)
    while chunk := ours.recv(4096):
        reply += chunk
    assert reply == b"echo:GET / HTTP/1.1\r\n\r\n"  # nothing else in the stream
    assert proc.wait(timeout=10) == 0


def test_bridge_to_a_missing_socket_closes_the_connection(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair()
    argv = shlex.split(bridge_command(tmp_path / "gone.sock"))
    proc = subprocess.Popen(
        argv, stdin=theirs.fileno(), stdout=theirs.fileno(), stderr=theirs.fileno()
    )
    theirs.close()
    ours.settimeout(10)
    assert ours.recv(4096) == b""  # closed, and not a traceback sent to the guest
    assert proc.wait(timeout=10) == 1


@pytest.mark.skipif(shutil.which("mkfs.ext4") is None, reason="e2fsprogs not installed")
def test_io_drive_leaves_sockets_out(tmp_path: Path, echo_socket: Path) -> None:
    (echo_socket.parent / "token").write_text("t")
    manifest = drives.in_drive(
        tmp_path / "in.ext4", {"command": ["true"]}, [(echo_socket.parent, "/run/x", False)]
    )
    assert list(manifest) == ["0/token"]


def test_a_vmm_without_forwarding_refuses_clearly(echo_socket: Path) -> None:
    refuse_socket_forwards("firecracker", [])  # nothing to forward: fine
    forwards = find_socket_forwards([Mount(source=echo_socket.parent, target="/run/karotte/p")])
    with pytest.raises(KarotteError, match=r"(?s)/run/karotte/p/proxy\.sock.*--runtime qemu"):
        refuse_socket_forwards("firecracker", forwards)
