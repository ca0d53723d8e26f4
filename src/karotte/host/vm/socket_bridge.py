"""One guest connection to a forwarded socket, joined to the host's unix socket.

QEMU's user network runs this once per connection the guest opens to a forwarded address
(``guestfwd=…-cmd:``), with that connection as standard input and output (and error). It runs as
``python3 -I -S socket_bridge.py HOST_SOCKET``: standard library only, nothing printed, so that no
stray byte can enter the guest's stream. See :mod:`karotte.host.vm.socket_forward`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading


def copy(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def main(argv: list[str]) -> int:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # standard error is the guest's connection too
    if len(argv) != 2:
        return 2
    guest = socket.socket(fileno=os.dup(0))
    host = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        host.connect(argv[1])
    except OSError:
        return 1
    back = threading.Thread(target=copy, args=(host, guest), daemon=True)
    back.start()
    copy(guest, host)
    back.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
