"""Unix sockets of the host inside a VM: the model proxy's and the run backend's relays.

A container gets the launcher's relay sockets by a bind mount of their directory; a VM cannot
share a socket. The VM layer therefore *forwards* them: every unix socket at the top of a mounted
directory becomes a socket at the same path in the guest, joined to the host's one by

* the guest's init (:func:`karotte.host.vm.guest_init.start_socket_forwards`): a root-only unix
  listener at the guest path whose connections go to ``FORWARD_ADDRESS:<port>``, the only address
  the guest's one network interface can reach;
* QEMU's user network in ``restrict=on`` mode (nothing of the host or the outside is reachable),
  with one ``guestfwd`` per socket that runs :mod:`karotte.host.vm.socket_bridge` for each
  connection the guest opens, which connects it to the host's socket.

The guest has no route anywhere else, and the harness's firewall keeps the student off the
interface (``strict`` allows loopback only), so the sandbox still reaches nothing but the relays.
"""

from __future__ import annotations

import shlex
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from karotte.errors import KarotteError
from karotte.host.runtimes.base import Mount

FORWARD_ADDRESS = "10.0.2.100"
GUEST_ADDRESS = "10.0.2.15/24"
FIRST_PORT = 10000
BRIDGE_SCRIPT = Path(__file__).with_name("socket_bridge.py")


@dataclass(frozen=True)
class SocketForward:
    host_path: Path
    guest_path: str
    port: int

    def guest_config(self) -> dict[str, object]:
        return {"path": self.guest_path, "address": FORWARD_ADDRESS, "port": self.port}


def find_socket_forwards(mounts: list[Mount]) -> list[SocketForward]:
    """The unix sockets at the top of each mounted directory, in a stable order."""
    forwards: list[SocketForward] = []
    for mount in mounts:
        if not mount.source.is_dir():
            continue
        for entry in sorted(mount.source.iterdir()):
            try:
                mode = entry.lstat().st_mode
            except OSError:
                continue
            if stat.S_ISSOCK(mode):
                guest_path = f"{mount.target.rstrip('/')}/{entry.name}"
                forwards.append(SocketForward(entry, guest_path, FIRST_PORT + len(forwards)))
    return forwards


def bridge_command(host_path: Path) -> str:
    """The command QEMU runs per guest connection (parsed by GLib's shell-like splitter)."""
    return shlex.join([sys.executable, "-I", "-S", str(BRIDGE_SCRIPT), str(host_path)])


def qemu_network_args(forwards: list[SocketForward]) -> list[str]:
    """QEMU arguments for a guest whose only network is the forwards (none when there are none)."""
    if not forwards:
        return []
    netdev = "user,id=karotte-net,restrict=on,ipv6=off"
    for forward in forwards:
        command = bridge_command(forward.host_path).replace(",", ",,")  # QEMU's comma escape
        netdev += f",guestfwd=tcp:{FORWARD_ADDRESS}:{forward.port}-cmd:{command}"
    return ["-netdev", netdev, "-device", "virtio-net-device,netdev=karotte-net"]


def refuse_socket_forwards(runtime: str, forwards: list[SocketForward]) -> None:
    """For a VMM that cannot forward sockets: a clear stop instead of a run that cannot call out."""
    if forwards:
        names = ", ".join(f.guest_path for f in forwards)
        raise KarotteError(
            f"{runtime}: the sandbox needs the host's unix socket(s) {names} (the model proxy or "
            f"the run backend), and {runtime} cannot forward sockets into its guest yet\n"
            "fix: use --runtime qemu or a container runtime for runs with --proxy or a backend"
        )


__all__ = [
    "FORWARD_ADDRESS",
    "GUEST_ADDRESS",
    "SocketForward",
    "bridge_command",
    "find_socket_forwards",
    "qemu_network_args",
    "refuse_socket_forwards",
]
