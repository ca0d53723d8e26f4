"""The host side of the host↔guest channel (no vsock needed).

The guest's init (:mod:`karotte.host.vm.guest_init`) writes one frame per line,
``\\x1ek<kind> <payload>``, to a virtio-serial port (QEMU) or a serial line (Firecracker); the VMM
appends them to ``channel.log`` in the sandbox's directory. Lines without the frame marker (a
kernel message on a shared serial line) are console noise. Kinds: ``O`` the command's stdout line,
``E`` its stderr line, ``L`` a log line of the init, ``H`` a heartbeat, ``X`` the exit code.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

FRAME = b"\x1ek"
KINDS = frozenset("OELHX")


@dataclass(frozen=True)
class Frame:
    kind: str  # O E L H X, or "" for a line that is not a frame
    payload: bytes


def parse_line(line: bytes) -> Frame:
    line = line.rstrip(b"\r\n")
    start = line.find(FRAME)
    at = start + len(FRAME)
    if start < 0 or len(line) <= at:
        return Frame("", line)
    kind = chr(line[at])
    if kind not in KINDS or line[at + 1 : at + 2] not in (b" ", b""):
        return Frame("", line)
    return Frame(kind, line[at + 2 :])


def encode(kind: str, payload: bytes = b"") -> bytes:
    return FRAME + kind.encode() + b" " + payload.replace(b"\n", b" ") + b"\n"


def follow(
    path: Path, done: Callable[[], bool], poll_s: float = 0.02, max_wait_s: float | None = None
) -> Iterator[Frame]:
    """Frames of ``path`` as they are appended, until ``done()`` and everything is read."""
    offset = 0
    pending = b""
    started = time.monotonic()
    while True:
        finished = done()  # checked before reading: nothing written before it is missed
        chunk = b""
        try:
            with open(path, "rb") as handle:
                handle.seek(offset)
                chunk = handle.read()
        except FileNotFoundError:
            pass
        offset += len(chunk)
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield parse_line(line)
        if not chunk:
            if finished:
                if pending:
                    yield parse_line(pending)
                return
            if max_wait_s is not None and time.monotonic() - started > max_wait_s:
                return
            time.sleep(poll_s)


def read_frames(path: Path) -> list[Frame]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    return [parse_line(line) for line in data.split(b"\n") if line]


def exit_code(frames: list[Frame]) -> int | None:
    for frame in reversed(frames):
        if frame.kind == "X":
            try:
                return int(frame.payload)
            except ValueError:
                return None
    return None
