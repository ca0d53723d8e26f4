"""One Firecracker VMM process, started directly or under the jailer, and everything it leaves
behind (API socket, work dir, the jailer's chroot and cgroups) removed again.

Direct: ``firecracker --api-sock DIR/api.sock --id ID --log-path DIR/firecracker.log``, serial
console (the guest's ``ttyS0``) on its stdout into ``DIR/serial.log``.

Jailed: ``jailer --id ID --exec-file FIRECRACKER --uid U --gid G --chroot-base-dir BASE
--cgroup-version 1|2 --parent-cgroup karotte --cgroup … -- --api-sock /run/api.sock …``; the jailer
copies firecracker into ``BASE/firecracker/ID/root``, makes ``/dev/kvm`` there, puts itself in
``<cgroupfs>/<controller>/karotte/ID`` with the given limits, chroots, drops to U:G and execs
firecracker (same pid). Files the guest needs (kernel, drives) are hard-linked (or copied) into the
chroot and named by their path inside it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

from pydantic import BaseModel, ConfigDict, Field

from karotte.errors import KarotteError
from karotte.host.firecracker.api import (
    BootSource,
    Drive,
    FirecrackerApi,
    FirecrackerApiError,
    MachineConfig,
)

CGROUP_ROOT = Path("/sys/fs/cgroup")
DEFAULT_CHROOT_BASE = Path("/var/lib/karotte/jailer")
PARENT_CGROUP = "karotte-firecracker"  # apart from the launcher's karotte/ run dirs
_ID_RE = re.compile(r"^[A-Za-z0-9-]{1,64}$")


class VmmError(KarotteError):
    """Starting, configuring or stopping a Firecracker process failed."""


def host_cgroup_version() -> int:
    """2 on a pure cgroup v2 host, 1 on v1 and hybrid hosts (v2 there holds no controllers)."""
    return 2 if (CGROUP_ROOT / "cgroup.controllers").exists() else 1


class JailerConfig(BaseModel):
    """How to jail the VMM. ``memory_bytes``/``pids`` become the jail's cgroup limits."""

    model_config = ConfigDict(extra="forbid")

    jailer: Path
    uid: int = Field(default=65534, ge=0)
    gid: int = Field(default=65534, ge=0)
    chroot_base: Path = DEFAULT_CHROOT_BASE
    cgroup_version: int | None = None  # None: the host's
    parent_cgroup: str = PARENT_CGROUP
    memory_bytes: int | None = None
    pids_limit: int | None = None
    cpu_quota: float | None = None  # cpus
    no_file: int = 2048


def cgroup_settings(jail: JailerConfig, cgroup_version: int) -> list[str]:
    """The jailer's ``--cgroup FILE=VALUE`` settings for the jail's limits."""
    settings: list[str] = []
    if cgroup_version == 2:
        if jail.memory_bytes is not None:
            settings += [f"memory.max={jail.memory_bytes}", "memory.swap.max=0"]
        if jail.pids_limit is not None:
            settings.append(f"pids.max={jail.pids_limit}")
        if jail.cpu_quota is not None:
            settings.append(f"cpu.max={int(jail.cpu_quota * 100000)} 100000")
    else:
        if jail.memory_bytes is not None:
            settings.append(f"memory.limit_in_bytes={jail.memory_bytes}")
        if jail.pids_limit is not None:
            settings.append(f"pids.max={jail.pids_limit}")
        if jail.cpu_quota is not None:
            settings += [
                "cpu.cfs_period_us=100000",
                f"cpu.cfs_quota_us={int(jail.cpu_quota * 100000)}",
            ]
    return settings


def jailer_argv(
    firecracker: Path, vm_id: str, jail: JailerConfig, cgroup_version: int
) -> list[str]:
    """The jailer's own arguments (firecracker's follow after ``--``)."""
    argv = [
        str(jail.jailer),
        "--id",
        vm_id,
        "--exec-file",
        str(firecracker),
        "--uid",
        str(jail.uid),
        "--gid",
        str(jail.gid),
        "--chroot-base-dir",
        str(jail.chroot_base),
        "--cgroup-version",
        str(cgroup_version),
        "--parent-cgroup",
        jail.parent_cgroup,
        "--resource-limit",
        f"no-file={jail.no_file}",
    ]
    for setting in cgroup_settings(jail, cgroup_version):
        argv += ["--cgroup", setting]
    return argv


class FirecrackerVM:
    """A Firecracker process and its API. Use as a context manager or call :meth:`cleanup`."""

    def __init__(
        self,
        firecracker: Path,
        vm_id: str,
        workdir_base: Path | None = None,
        jailer: JailerConfig | None = None,
    ) -> None:
        if not _ID_RE.match(vm_id):
            raise VmmError(f"Firecracker VM id {vm_id!r}: letters, digits and '-' only, <= 64")
        self.firecracker = firecracker
        self.vm_id = vm_id
        self.jailer = jailer
        self.workdir = Path(tempfile.mkdtemp(prefix=f"karotte-fc-{vm_id}-", dir=workdir_base))
        self.serial_path = self.workdir / "serial.log"
        self.stderr_path = self.workdir / "stderr.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.api: FirecrackerApi | None = None
        self.socket_ready_s: float | None = None
        self.instance_start_s: float | None = None
        self.started = False
        self._files: list[IO[bytes]] = []
        self._cgroup_version = (
            (jailer.cgroup_version or host_cgroup_version()) if jailer is not None else None
        )

    # ---- paths -------------------------------------------------------------------------------
    @property
    def chroot_dir(self) -> Path | None:
        """``BASE/firecracker/ID/root`` under the jailer, else None."""
        if self.jailer is None:
            return None
        return self.jailer.chroot_base / self.firecracker.name / self.vm_id / "root"

    @property
    def socket_path(self) -> Path:
        root = self.chroot_dir
        return root / "run" / "api.sock" if root is not None else self.workdir / "api.sock"

    @property
    def log_path(self) -> Path:
        root = self.chroot_dir
        return root / "firecracker.log" if root is not None else self.workdir / "firecracker.log"

    def cgroup_dirs(self) -> list[Path]:
        """The cgroup directories the jailer makes for this VM (may not exist yet/any more)."""
        if self.jailer is None:
            return []
        tail = Path(self.jailer.parent_cgroup) / self.vm_id
        if self._cgroup_version == 2:
            return [CGROUP_ROOT / tail]
        return [CGROUP_ROOT / ctrl / tail for ctrl in self._cgroup_controllers()]

    def _cgroup_settings(self) -> list[str]:
        assert self.jailer is not None and self._cgroup_version is not None
        return cgroup_settings(self.jailer, self._cgroup_version)

    def _cgroup_controllers(self) -> list[str]:
        return sorted({setting.split(".", 1)[0] for setting in self._cgroup_settings()})

    def leftovers(self) -> list[Path]:
        """What this VM may leave on the host; all of it is gone after :meth:`cleanup`."""
        paths = [self.workdir, *self.cgroup_dirs()]
        root = self.chroot_dir
        if root is not None:
            paths.append(root.parent)
        return [path for path in paths if path.exists()]

    # ---- lifecycle ---------------------------------------------------------------------------
    def command(self) -> list[str]:
        fc_args = ["--level", "Info"]
        if self.jailer is None:
            fc_args = ["--id", self.vm_id, *fc_args]  # the jailer passes --id itself
            return [
                str(self.firecracker),
                "--api-sock",
                str(self.socket_path),
                "--log-path",
                str(self.log_path),
                *fc_args,
            ]
        assert self._cgroup_version is not None
        argv = jailer_argv(self.firecracker, self.vm_id, self.jailer, self._cgroup_version)
        # paths after "--" are inside the chroot
        return [
            *argv,
            "--",
            "--api-sock",
            "/run/api.sock",
            "--log-path",
            "/firecracker.log",
            *fc_args,
        ]

    def spawn(self, ready_timeout_s: float = 5.0) -> float:
        """Start the process and wait for the API socket; return the seconds until it answered."""
        if self.process is not None:
            raise VmmError("this Firecracker VM was already started")
        root = self.chroot_dir
        if root is not None:
            if root.parent.exists():
                raise VmmError(f"a jail for {self.vm_id} exists already: {root.parent}")
            # firecracker opens --log-path without creating it: make it (owned by the jail's
            # user) in the chroot the jailer then completes
            assert self.jailer is not None
            root.mkdir(parents=True)
            self.log_path.touch()
            os.chown(self.log_path, self.jailer.uid, self.jailer.gid)
        else:
            self.log_path.touch()
        serial = self.serial_path.open("wb")
        stderr = self.stderr_path.open("wb")
        self._files += [serial, stderr]
        started = time.monotonic()
        try:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=serial,
                stderr=stderr,
                start_new_session=True,
            )
        except OSError as exc:
            self.cleanup()
            raise VmmError(f"could not start {self.command()[0]}: {exc}") from exc
        self.api = FirecrackerApi(self.socket_path)
        try:
            self._wait_socket(started, ready_timeout_s)
        except VmmError:
            self.cleanup()
            raise
        self.socket_ready_s = time.monotonic() - started
        return self.socket_ready_s

    def _wait_socket(self, started: float, timeout_s: float) -> None:
        assert self.api is not None and self.process is not None
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise VmmError(
                    f"firecracker exited ({self.process.returncode}) before its API answered: "
                    f"{self.diagnostics()}"
                )
            if self.socket_path.exists():
                with contextlib.suppress(FirecrackerApiError):
                    self.api.instance_info()
                    return
            time.sleep(0.001)
        raise VmmError(
            f"firecracker's API socket did not answer within {timeout_s} s: {self.diagnostics()}"
        )

    def stage(self, source: Path, name: str) -> str:
        """Make ``source`` visible to the VMM; return the path to give the API."""
        root = self.chroot_dir
        if root is None:
            return str(source)
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)
        return "/" + name

    def configure(
        self,
        machine: MachineConfig,
        kernel: Path,
        boot_args: str,
        drives: list[tuple[str, Path, bool, bool]] | None = None,
        initrd: Path | None = None,
    ) -> None:
        """Machine config, boot source and drives ``(id, path, is_root, read_only)``."""
        api = self._require_api()
        api.put_machine_config(machine)
        boot = BootSource(
            kernel_image_path=self.stage(kernel, "vmlinux"),
            boot_args=boot_args,
            initrd_path=self.stage(initrd, "initrd") if initrd is not None else None,
        )
        api.put_boot_source(boot)
        for drive_id, path, is_root, read_only in drives or []:
            staged = self.stage(path, f"drive-{drive_id}")
            if self.chroot_dir is not None and not read_only and self.jailer is not None:
                os.chown(self.chroot_dir / staged.lstrip("/"), self.jailer.uid, self.jailer.gid)
            api.put_drive(
                Drive(
                    drive_id=drive_id,
                    path_on_host=staged,
                    is_root_device=is_root,
                    is_read_only=read_only,
                )
            )

    def instance_start(self) -> float:
        api = self._require_api()
        started = time.monotonic()
        api.instance_start()
        self.started = True
        self.instance_start_s = time.monotonic() - started
        return self.instance_start_s

    def _require_api(self) -> FirecrackerApi:
        if self.api is None or self.process is None:
            raise VmmError("spawn() the Firecracker process first")
        return self.api

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait(self, timeout_s: float | None = None) -> int:
        if self.process is None:
            raise VmmError("not started")
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(
                f"firecracker {self.vm_id} still running after {timeout_s} s"
            ) from exc

    def stop(self, grace_s: float = 5.0) -> int | None:
        """Ask the guest to shut down (SendCtrlAltDel), then kill the VMM if it is still there."""
        if not self.running():
            return self.process.returncode if self.process is not None else None
        if self.started and self.api is not None:
            with contextlib.suppress(FirecrackerApiError):
                self.api.send_ctrl_alt_del()
            with contextlib.suppress(TimeoutError):
                return self.wait(grace_s)
        return self.kill()

    def kill(self) -> int | None:
        """SIGKILL the VMM's whole process group and reap it."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        return self.process.wait(timeout=30)

    def serial_output(self) -> str:
        try:
            return self.serial_path.read_bytes().decode(errors="replace")
        except OSError:
            return ""

    def log_output(self) -> str:
        try:
            return self.log_path.read_bytes().decode(errors="replace")
        except OSError:
            return ""

    def diagnostics(self) -> str:
        parts = []
        for label, text in (
            ("stderr", _read(self.stderr_path)),
            ("log", self.log_output()),
            ("serial", self.serial_output()),
        ):
            lines = [line for line in text.splitlines() if line.strip()]
            if lines:
                parts.append(f"{label}: " + " | ".join(lines[-5:]))
        return "; ".join(parts) or "no output"

    def cleanup(self) -> None:
        """Kill the VMM if needed and remove its socket, work dir, chroot and cgroups."""
        self.kill()
        if self.api is not None:
            self.api.close()
        for handle in self._files:
            with contextlib.suppress(OSError):
                handle.close()
        self._files.clear()
        root = self.chroot_dir
        if root is not None:
            shutil.rmtree(root.parent, ignore_errors=True)
            with contextlib.suppress(OSError):  # BASE/firecracker, when no other jail is there
                root.parent.parent.rmdir()
        for cgroup in self.cgroup_dirs():
            _remove_cgroup(cgroup)
            with contextlib.suppress(OSError):  # the parent, when no other VM is in it
                cgroup.parent.rmdir()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> FirecrackerVM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def _remove_cgroup(path: Path) -> None:
    """rmdir a cgroup (retrying briefly: the kernel frees it just after its last task exits)."""
    for _ in range(50):
        if not path.exists():
            return
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(0.02)


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode(errors="replace")
    except OSError:
        return ""
