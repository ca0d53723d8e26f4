"""Firecracker's HTTP API over its unix socket (stdlib ``http.client``; no extra dependency).

Only the calls karotte needs: machine config, boot source, drives, logger, actions
(``InstanceStart``, ``SendCtrlAltDel``) and the instance info. A non-2xx answer raises
:class:`FirecrackerApiError` with Firecracker's ``fault_message``.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from karotte.errors import KarotteError


class FirecrackerApiError(KarotteError):
    """Firecracker refused an API call (or its socket did not answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class MachineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    vcpu_count: int = Field(ge=1, le=32)
    mem_size_mib: int = Field(ge=128)
    smt: bool = False


class BootSource(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kernel_image_path: str
    boot_args: str = ""
    initrd_path: str | None = None


class Drive(BaseModel):
    model_config = ConfigDict(extra="forbid")

    drive_id: str
    path_on_host: str
    is_root_device: bool = False
    is_read_only: bool = False


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(str(self.socket_path))
        self.sock = sock


class FirecrackerApi:
    """A client of one Firecracker process's API socket."""

    def __init__(self, socket_path: Path, timeout_s: float = 10.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._short_dir: Path | None = None

    def _connect_path(self) -> Path:
        """``socket_path``, or a short alias of it: a unix socket address holds at most 107
        bytes, and a jail's socket (``BASE/firecracker/ID/root/run/api.sock``) can be longer.
        The alias is a symlink to the socket's directory in a private temp dir."""
        if len(os.fsencode(self.socket_path)) < 100:
            return self.socket_path
        if self._short_dir is None:
            self._short_dir = Path(tempfile.mkdtemp(prefix="kfc-", dir="/tmp"))
            (self._short_dir / "d").symlink_to(self.socket_path.parent)
        return self._short_dir / "d" / self.socket_path.name

    def close(self) -> None:
        if self._short_dir is not None:
            shutil.rmtree(self._short_dir, ignore_errors=True)
            self._short_dir = None

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        conn = _UnixHTTPConnection(self._connect_path(), self.timeout_s)
        try:
            payload = json.dumps(body).encode() if body is not None else None
            headers = {"Accept": "application/json"}
            if payload is not None:
                headers["Content-Type"] = "application/json"
            try:
                conn.request(method, path, body=payload, headers=headers)
                response = conn.getresponse()
                raw = response.read()
            except OSError as exc:
                raise FirecrackerApiError(
                    f"Firecracker API {method} {path} on {self.socket_path}: {exc}"
                ) from exc
        finally:
            conn.close()
        text = raw.decode(errors="replace")
        data: Any = json.loads(text) if text.strip() else None
        if not 200 <= response.status < 300:
            fault = data.get("fault_message", text) if isinstance(data, dict) else text
            raise FirecrackerApiError(
                f"Firecracker refused {method} {path} (HTTP {response.status}): {fault}",
                status=response.status,
            )
        return data

    # ---- the calls ---------------------------------------------------------------------------
    def instance_info(self) -> dict[str, Any]:
        info = self.request("GET", "/")
        return info if isinstance(info, dict) else {}

    def put_machine_config(self, config: MachineConfig) -> None:
        self.request("PUT", "/machine-config", config.model_dump())

    def get_machine_config(self) -> dict[str, Any]:
        data = self.request("GET", "/machine-config")
        return data if isinstance(data, dict) else {}

    def put_boot_source(self, boot: BootSource) -> None:
        self.request("PUT", "/boot-source", boot.model_dump(exclude_none=True))

    def put_drive(self, drive: Drive) -> None:
        self.request("PUT", f"/drives/{drive.drive_id}", drive.model_dump())

    def get_vm_config(self) -> dict[str, Any]:
        data = self.request("GET", "/vm/config")
        return data if isinstance(data, dict) else {}

    def instance_start(self) -> None:
        self.request("PUT", "/actions", {"action_type": "InstanceStart"})

    def send_ctrl_alt_del(self) -> None:
        self.request("PUT", "/actions", {"action_type": "SendCtrlAltDel"})

    def wait_ready(self, timeout_s: float = 5.0) -> float:
        """Wait until the API answers; return the seconds it took."""
        started = time.monotonic()
        deadline = started + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.socket_path.exists():
                try:
                    self.instance_info()
                    return time.monotonic() - started
                except FirecrackerApiError as exc:
                    last = exc
            time.sleep(0.002)
        raise FirecrackerApiError(
            f"Firecracker's API socket {self.socket_path} did not answer within {timeout_s} s"
            + (f": {last}" if last else "")
        )
