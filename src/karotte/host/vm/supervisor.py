"""One host process per VM sandbox: runs the VMM, is the watchdog, brings ``/out`` back.

Started detached (its own session) by the runtime as ``python -m karotte.host.vm.supervisor DIR``
so that the sandbox outlives nothing it should not and survives nothing it should not: like a
container engine's shim, it keeps the VM's state in ``DIR`` (``machine.json`` in, ``exit.json``
out) for the runtime's ``wait``/``stream_output``/``remove``.

The watchdog: the guest's init sends a heartbeat every second. No frame at all within
``boot_timeout_s`` of the start, or silence for ``watchdog_s`` after that, and the VMM is killed;
``exit.json`` then says why (the launcher turns it into an ``infra`` error with the events that
streamed back). SIGTERM kills the VMM at once (``stop`` asks the guest nicely first).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from karotte.host.vm import channel, drives


class MachineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    vmm_argv: list[str]
    hold_fds: list[int] = Field(default_factory=list)
    boot_timeout_s: float = 180.0
    watchdog_s: float = 60.0
    out_sources: dict[int, str] = Field(default_factory=dict)  # mount index -> host path
    out_max_bytes: int = 4 * 1024**3
    manifest: dict[str, str] = Field(default_factory=dict)


class ExitStatus(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: int
    reason: str = ""  # why the VM ended without its command's exit code (watchdog, crash …)
    problems: list[str] = Field(default_factory=list)  # files of /out that were not taken back
    finished_at: float = 0.0


def _write_json(path: Path, data: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(data)
    os.replace(tmp, path)


def supervise(directory: Path) -> int:
    config = MachineConfig.model_validate_json((directory / "machine.json").read_text())
    log = directory / "channel.log"
    stopped = {"signal": 0}

    def on_signal(signum: int, _frame: Any) -> None:
        stopped["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with open(directory / "vmm.log", "wb") as vmm_log:
        vmm = subprocess.Popen(
            config.vmm_argv,
            stdin=subprocess.DEVNULL,
            stdout=vmm_log,
            stderr=subprocess.STDOUT,
            pass_fds=config.hold_fds,
        )
    (directory / "vmm.pid").write_text(str(vmm.pid))
    started = time.monotonic()
    last_size, last_change, seen_frame = 0, started, False
    reason = ""
    while vmm.poll() is None:
        time.sleep(0.25)
        if stopped["signal"]:
            reason = "stopped by the host"
            vmm.kill()
            break
        now = time.monotonic()
        with contextlib.suppress(OSError):
            size = log.stat().st_size
            if size != last_size:
                last_size, last_change, seen_frame = size, now, True
        if not seen_frame and now - started > config.boot_timeout_s:
            reason = f"the guest did not start within {config.boot_timeout_s:.0f} s; VM killed"
            vmm.kill()
            break
        if seen_frame and now - last_change > config.watchdog_s:
            reason = (
                f"watchdog: the guest stopped answering (no heartbeat for "
                f"{now - last_change:.0f} s); VM killed"
            )
            vmm.kill()
            break
    vmm.wait()
    frames = channel.read_frames(log)
    code = channel.exit_code(frames)
    problems: list[str] = []
    if code is None:
        code = 137 if reason else 255
        if not reason:
            reason = f"the VM ended (VMM exit code {vmm.returncode}) before its command did"
    elif config.out_sources:
        sources = {int(k): Path(v) for k, v in config.out_sources.items()}
        problems = drives.extract_out(
            directory / "out.raw", sources, config.manifest, config.out_max_bytes
        )
    for name in ("in.ext4", "scratch.ext4", "out.raw"):
        (directory / name).unlink(missing_ok=True)
    status = ExitStatus(code=code, reason=reason, problems=problems, finished_at=time.time())
    _write_json(directory / "exit.json", status.model_dump_json())
    return 0


def main() -> None:
    directory = Path(sys.argv[1])
    try:
        supervise(directory)
    except Exception as exc:  # always leave an exit status behind
        status = ExitStatus(code=255, reason=f"VM supervisor failed: {type(exc).__name__}: {exc}")
        _write_json(directory / "exit.json", json.dumps(status.model_dump()))
        raise


if __name__ == "__main__":
    main()
