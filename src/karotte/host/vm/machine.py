"""VM sandboxes, independent of the VMM: a :class:`VmRuntime` subclass only says how to start its
VMM (:meth:`VmRuntime.vmm_argv`) and whether it works here; drives, the guest config, the
supervisor (watchdog, ``/out``), the event stream, stop/remove and listing are shared.

A sandbox is a directory ``<state>/<name>/`` (mode 0700): ``sandbox.json`` (id, name, labels),
``machine.json`` (for the supervisor), ``channel.log`` (the guest's frames), ``console.log`` (the
serial console), ``exit.json`` once it ended, and the per-run drives while it runs.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from karotte.errors import KarotteError
from karotte.host.runtimes.base import (
    ExecResult,
    OutputCallback,
    Runtime,
    Sandbox,
    SandboxSpec,
)
from karotte.host.runtimes.docker import DockerRuntime
from karotte.host.runtimes.oci_cli import CAPABILITY_NUMBERS
from karotte.host.vm import channel, drives, paths, sizing
from karotte.host.vm.exec_channel import exec_in_guest
from karotte.host.vm.kernel import GuestKernel, prepare_kernel
from karotte.host.vm.socket_forward import (
    GUEST_ADDRESS,
    SocketForward,
    find_socket_forwards,
    refuse_socket_forwards,
)
from karotte.host.vm.supervisor import ExitStatus, MachineConfig

CONSOLE_TAIL_LINES = 30


@dataclass(frozen=True)
class VmLayout:
    """The files of one VM sandbox, handed to :meth:`VmRuntime.vmm_argv`."""

    directory: Path
    kernel: GuestKernel
    root: Path
    scratch: Path
    io_in: Path
    out: Path
    memory_mib: int
    vcpus: int
    socket_forwards: tuple[SocketForward, ...] = ()

    @property
    def channel_log(self) -> Path:
        return self.directory / "channel.log"

    @property
    def console_log(self) -> Path:
        return self.directory / "console.log"

    @property
    def control_socket(self) -> Path:
        return self.directory / "ctl.sock"

    @property
    def exec_socket(self) -> Path:
        return self.directory / "exec.sock"

    @property
    def qmp_socket(self) -> Path:
        return self.directory / "qmp.sock"


def capability_numbers(names: list[str]) -> list[int]:
    """``cap_add`` names as the kernel's numbers (the guest keeps only these, as a container)."""
    numbers = []
    for name in names:
        key = name.upper().removeprefix("CAP_")
        if key not in CAPABILITY_NUMBERS:
            raise KarotteError(f"unknown capability {name!r} in cap_add")
        numbers.append(CAPABILITY_NUMBERS[key])
    return sorted(numbers)


def env_list_to_dict(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key] = value
    return out


class VmRuntime(Runtime, abc.ABC):
    """A runtime whose sandboxes are VMs booted from the image's root drive."""

    build_engine: ClassVar[str] = "docker"
    # does the VMM carry the karotte.exec port (exec into a running VM)?
    has_exec_channel: ClassVar[bool] = False
    # can the VMM forward the host's unix sockets (the launcher's relays) into the guest?
    forwards_sockets: ClassVar[bool] = False
    kernel_cmdline: ClassVar[str] = "console=ttyS0 reboot=t panic=-1 quiet"

    def __init__(self) -> None:
        self.engine = DockerRuntime()
        self._children: list[subprocess.Popen[bytes]] = []

    # -- VMM specifics --
    @abc.abstractmethod
    def vmm_argv(self, layout: VmLayout) -> list[str]:
        """The VMM's command line for this sandbox (run by the supervisor)."""

    def watchdog_s(self) -> float:
        return float(os.environ.get("KAROTTE_VM_WATCHDOG_S", "60"))

    def boot_timeout_s(self) -> float:
        return float(os.environ.get("KAROTTE_VM_BOOT_TIMEOUT_S", "180"))

    # -- images: built and stored by the build engine (docker) --
    def build(
        self,
        context: Path,
        containerfile: Path,
        tag: str,
        build_args: dict[str, str],
        on_output: OutputCallback | None = None,
    ) -> str:
        return self.engine.build(context, containerfile, tag, build_args, on_output)

    def image_exists(self, tag: str) -> bool:
        return self.engine.image_exists(tag)

    def import_rootfs(self, tarball: Path, tag: str) -> str:
        return self.engine.import_rootfs(tarball, tag)

    # -- sandboxes --
    def sandbox_dir(self, name: str) -> Path:
        # hashed: unix socket paths in it must stay short (108 bytes), whatever the run id
        return paths.state_dir() / hashlib.sha256(name.encode()).hexdigest()[:16]

    def start(self, spec: SandboxSpec) -> Sandbox:
        directory = self.sandbox_dir(spec.name)
        if directory.exists():
            raise KarotteError(f"a VM sandbox named {spec.name} exists already ({directory})")
        self.ensure_available()  # the VMM, the kernel and the image engine, each with its fix
        forwards = tuple(find_socket_forwards(spec.mounts))
        if not self.forwards_sockets:
            refuse_socket_forwards(self.name, list(forwards))
        kernel = prepare_kernel()
        cache = paths.cache_dir()
        root = drives.root_drive(spec.image, cache, self.build_engine)
        max_cache = int(float(os.environ.get("KAROTTE_VM_CACHE_GIB", "20")) * sizing.GIB)
        drives.evict(cache, max_cache, keep=root.path)
        directory.mkdir(parents=True, mode=0o700)
        sandbox = Sandbox(
            id=f"vm-{uuid.uuid4().hex[:16]}", name=spec.name, runtime=self.name, labels=spec.labels
        )
        (directory / "sandbox.json").write_text(sandbox.model_dump_json())
        lock_fd = -1
        try:
            disk = spec.disk_bytes or 4 * sizing.GIB
            layout = VmLayout(
                directory=directory,
                kernel=kernel,
                root=root.path,
                scratch=directory / "scratch.ext4",
                io_in=directory / "in.ext4",
                out=directory / "out.raw",
                memory_mib=sizing.guest_memory_mib(spec.memory_bytes),
                vcpus=sizing.guest_vcpus(spec.cpus),
                socket_forwards=forwards,
            )
            drives.scratch_drive(layout.scratch, disk)
            drives.out_drive(layout.out, disk)
            env = env_list_to_dict(root.env)
            env.update(spec.env)
            tmpfs = {k: v for k, v in spec.tmpfs.items() if k != "/dev/shm"}
            vm_config = {
                "command": spec.command,
                "env": env,
                "workdir": spec.workdir or root.workdir or "/",
                "memory_bytes": spec.memory_bytes or sizing.DEFAULT_SANDBOX_MEMORY,
                "pids_limit": spec.pids_limit,
                "tmpfs": tmpfs,
                "shm_bytes": spec.tmpfs.get("/dev/shm", 64 * sizing.MIB),
                "hostname": spec.name[:63],
                "heartbeat_s": 1.0,
                "cap_keep": capability_numbers(spec.cap_add),
                "guest_address": GUEST_ADDRESS,
                "socket_forwards": [f.guest_config() for f in layout.socket_forwards],
            }
            mounts = [(m.source, m.target, m.read_only) for m in spec.mounts]
            manifest = drives.in_drive(layout.io_in, vm_config, mounts)
            lock_fd = drives.hold(root.path)
            machine = MachineConfig(
                vmm_argv=self.vmm_argv(layout),
                hold_fds=[lock_fd],
                boot_timeout_s=self.boot_timeout_s(),
                watchdog_s=self.watchdog_s(),
                out_sources={
                    i: str(m.source) for i, m in enumerate(spec.mounts) if not m.read_only
                },
                out_max_bytes=disk,
                manifest=manifest,
            )
            (directory / "machine.json").write_text(machine.model_dump_json())
            proc = subprocess.Popen(
                [sys.executable, "-m", "karotte.host.vm.supervisor", str(directory)],
                stdin=subprocess.DEVNULL,
                stdout=open(directory / "supervisor.log", "wb"),  # noqa: SIM115
                stderr=subprocess.STDOUT,
                pass_fds=[lock_fd],
                start_new_session=True,
            )
            (directory / "supervisor.pid").write_text(str(proc.pid))
            self._children.append(proc)
            marker = str(directory).encode()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and proc.poll() is None:
                with contextlib.suppress(OSError):
                    if marker in Path(f"/proc/{proc.pid}/cmdline").read_bytes():
                        break  # exec'd: from now on liveness is checked by its command line
                time.sleep(0.005)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        finally:
            if lock_fd >= 0:
                os.close(lock_fd)
        return sandbox

    def _exit_status(self, sandbox: Sandbox) -> ExitStatus | None:
        path = self.sandbox_dir(sandbox.name) / "exit.json"
        try:
            return ExitStatus.model_validate_json(path.read_text())
        except (OSError, ValueError):
            return None

    def _supervisor_alive(self, sandbox: Sandbox) -> bool:
        for child in self._children:
            child.poll()  # reap the supervisors this process started
        pid = _read_pid(self.sandbox_dir(sandbox.name) / "supervisor.pid")
        if pid is None:
            return False
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        return str(self.sandbox_dir(sandbox.name)).encode() in cmdline

    def _finished(self, sandbox: Sandbox) -> bool:
        return self._exit_status(sandbox) is not None or not self._supervisor_alive(sandbox)

    def exec(
        self,
        sandbox: Sandbox,
        argv: list[str],
        user: str | None = None,
        timeout_s: float | None = None,
    ) -> ExecResult:
        if not self.has_exec_channel:
            raise KarotteError(
                f"{self.name}: running a command in a running VM is not supported (no exec "
                "channel into the guest); the VM runs exactly its command"
            )
        if self._finished(sandbox):
            raise KarotteError(f"exec: the VM {sandbox.name} is not running")
        directory = self.sandbox_dir(sandbox.name)
        return exec_in_guest(
            directory / "exec.sock",
            directory / "exec.lock",
            argv,
            user,
            timeout_s,
            connect_within_s=self.boot_timeout_s(),
        )

    def stream_output(
        self, sandbox: Sandbox, on_stderr: OutputCallback | None = None
    ) -> Iterator[bytes]:
        directory = self.sandbox_dir(sandbox.name)
        for frame in channel.follow(directory / "channel.log", lambda: self._finished(sandbox)):
            if frame.kind == "O":
                yield frame.payload + b"\n"
            elif frame.kind == "E" and on_stderr is not None:
                on_stderr(frame.payload.decode(errors="replace"))
            elif frame.kind == "L" and on_stderr is not None:
                on_stderr(f"[vm] {frame.payload.decode(errors='replace')}")
        status = self._exit_status(sandbox)
        if on_stderr is None:
            return
        if status is None:
            on_stderr(f"[vm] the VM supervisor of {sandbox.name} is gone without an exit status")
            return
        if status.reason:
            on_stderr(f"[vm] {status.reason}")
            for line in console_tail(directory / "console.log"):
                on_stderr(f"[vm console] {line}")
        for problem in status.problems:
            on_stderr(f"[vm] /out: {problem}")

    def wait(self, sandbox: Sandbox, timeout_s: float | None = None) -> int:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            status = self._exit_status(sandbox)
            if status is not None:
                return status.code
            if not self._supervisor_alive(sandbox):
                status = self._exit_status(sandbox)
                return status.code if status is not None else 255
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{sandbox.name} still running after {timeout_s} s")
            time.sleep(0.1)

    def _control(self, sandbox: Sandbox, command: bytes) -> bool:
        path = self.sandbox_dir(sandbox.name) / "ctl.sock"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(2)
                sock.connect(str(path))
                sock.sendall(command + b"\n")
                time.sleep(0.1)  # the VMM forwards before the socket closes
        except OSError:
            return False
        return True

    def stop(self, sandbox: Sandbox, timeout_s: float = 10) -> None:
        if self._exit_status(sandbox) is not None:
            return
        if self._control(sandbox, b"TERM"):
            with contextlib.suppress(TimeoutError):
                self.wait(sandbox, timeout_s)
                return
        self._kill(sandbox)

    def _kill(self, sandbox: Sandbox) -> None:
        directory = self.sandbox_dir(sandbox.name)
        pid = _read_pid(directory / "supervisor.pid")
        if pid is not None and self._supervisor_alive(sandbox):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                self.wait(sandbox, 15)
                return
        vmm = _read_pid(directory / "vmm.pid")
        if vmm is not None:
            with contextlib.suppress(OSError):
                os.kill(vmm, signal.SIGKILL)
        if pid is not None and self._supervisor_alive(sandbox):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, sandbox: Sandbox) -> None:
        directory = self.sandbox_dir(sandbox.name)
        if not directory.exists():
            return
        if self._exit_status(sandbox) is None:
            self._kill(sandbox)
        shutil.rmtree(directory, ignore_errors=True)

    def list_sandboxes(self, labels: dict[str, str]) -> list[Sandbox]:
        found: list[Sandbox] = []
        base = paths.state_dir()
        if not base.is_dir():
            return found
        for entry in sorted(base.iterdir()):
            try:
                sandbox = Sandbox.model_validate_json((entry / "sandbox.json").read_text())
            except (OSError, ValueError):
                continue
            if sandbox.runtime != self.name:
                continue
            if all(
                key in sandbox.labels and (not value or sandbox.labels[key] == value)
                for key, value in labels.items()
            ):
                found.append(sandbox)
        return found


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def console_tail(path: Path, lines: int = CONSOLE_TAIL_LINES) -> list[str]:
    try:
        text = path.read_bytes().decode(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


__all__ = ["VmLayout", "VmRuntime", "console_tail", "env_list_to_dict"]
