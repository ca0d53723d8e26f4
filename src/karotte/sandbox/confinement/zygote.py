"""A small root process that forks the demoted helpers, so each fork is cheap.

Forking the harness itself costs ~40 ms once litellm and the MCP SDK are loaded (the kernel
copies the page tables of a ~230 MB process); forking this small interpreter costs a few ms.
The zygote runs ``python -I -m karotte.sandbox.confinement.zygote`` as root, reads requests on
stdin and answers on stdout, one at a time; each request runs through
:func:`karotte.sandbox.confinement.demote.run_as` (fork, demote, timeout) here. Only functions
that can be imported by name (module + qualified name) can be sent; the client in
:mod:`demote` falls back to forking the harness for anything else. The zygote exits when its
stdin closes (the harness is gone).

Wire format, both ways: 8-byte big-endian length, then a pickle. Request:
``(identity, module, qualname, args, kwargs, timeout_s, max_result_bytes)``; answer:
``("ok", value)`` or ``("err", exception)``.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
from typing import Any


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks, got = [], 0
    while got < size:
        chunk = os.read(fd, size - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def resolve(module: str, qualname: str) -> Any:
    value: Any = importlib.import_module(module)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def serve(read_fd: int, write_fd: int) -> None:
    from karotte.sandbox.confinement.demote import run_as

    while True:
        header = _read_exact(read_fd, 8)
        if header is None:
            return
        body = _read_exact(read_fd, int.from_bytes(header, "big"))
        if body is None:
            return
        try:
            identity, module, qualname, args, kwargs, timeout_s, max_result = pickle.loads(body)  # noqa: S301 - from the harness
            fn = resolve(module, qualname)
            answer: tuple[str, Any] = (
                "ok",
                run_as(
                    identity, fn, *args, timeout_s=timeout_s, max_result_bytes=max_result, **kwargs
                ),
            )
        except BaseException as exc:
            answer = ("err", exc)
        try:
            data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            data = pickle.dumps(("err", RuntimeError(f"cannot send the result: {exc}")))
        _write_all(write_fd, len(data).to_bytes(8, "big") + data)


if __name__ == "__main__":
    serve(sys.stdin.fileno(), sys.stdout.fileno())
