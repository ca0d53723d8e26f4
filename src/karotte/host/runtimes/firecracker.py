"""``firecracker``: one Firecracker microVM per run, so the student gets its own kernel.

What works today (and is tested with the real binary): the pinned firecracker/jailer/kernel
(:mod:`karotte.host.firecracker.artifacts`), the VMM's API (machine config, boot source, drives,
serial console to a file, ``InstanceStart``, ``SendCtrlAltDel``), the optional jailer (uid/gid,
chroot, cgroup v1/v2 limits), kill and cleanup (no socket, chroot or cgroup left), and a record
of each VMM under the state dir so that :meth:`list_sandboxes`/:meth:`remove` find it again
(also from another process, e.g. ``karotte clean``).

The guest path (export the image to drives, boot, run the harness, stream events over serial)
belongs to the shared VM layer (``karotte.host.vm``) and runs only where the boot probe
(:mod:`karotte.host.boot_probe`) says a guest really boots. Where it does not (here: KVM-PVM,
guests crawl and die), :meth:`availability` says so with the probe's reason, and :meth:`start`
refuses the run before anything starts. Images are built by Docker (the VM layer exports them).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar, NoReturn

from pydantic import BaseModel, ConfigDict, Field

from karotte.errors import RuntimeUnavailableError
from karotte.host.firecracker.api import MachineConfig
from karotte.host.firecracker.artifacts import (
    SETUP_FIX,
    ArtifactError,
    find_binary,
    find_kernel,
    host_supported,
    sha256_file,
)
from karotte.host.firecracker.vmm import (
    CGROUP_ROOT,
    DEFAULT_CHROOT_BASE,
    PARENT_CGROUP,
    FirecrackerVM,
    JailerConfig,
    host_cgroup_version,
    jailer_argv,
)
from karotte.host.runtimes.base import (
    Availability,
    ExecResult,
    OutputCallback,
    Runtime,
    Sandbox,
    SandboxSpec,
    register_runtime,
)
from karotte.host.runtimes.docker import DockerRuntime
from karotte.host.vm.machine import VmLayout, VmRuntime

GIB = 1 << 30
GUEST_KERNEL_OVERHEAD_BYTES = GIB  # the guest kernel + init get 1 GiB on top of the sandbox
DEFAULT_MEMORY_BYTES = 4 * GIB
DEFAULT_BOOT_ARGS = "console=ttyS0 reboot=k panic=1 pci=off i8042.noaux"
NOT_BOOTING_FIX = (
    "run on a host where KVM really runs guests (bare metal, or a VM with nested "
    "virtualization: the CPU shows vmx/svm); here use `--runtime qemu` (a VM with its own "
    "kernel on a software CPU) or `--runtime docker:gvisor`. Re-probe with "
    "`karotte doctor --refresh`."
)


def state_dir() -> Path:
    """Where each running VMM's record lives (``KAROTTE_FIRECRACKER_STATE``)."""
    default = (
        "/run/karotte/firecracker"
        if os.geteuid() == 0
        else f"/tmp/karotte-{os.geteuid()}/firecracker"
    )
    return Path(os.environ.get("KAROTTE_FIRECRACKER_STATE", default))


class VmRecord(BaseModel):
    """What :meth:`FirecrackerRuntime.remove` needs to clean a VMM up, even from another process."""

    model_config = ConfigDict(extra="forbid")

    name: str
    vm_id: str
    pid: int
    pid_start: str  # /proc/<pid>/stat field 22: a recycled pid is not mistaken for the VMM
    labels: dict[str, str] = Field(default_factory=dict)
    workdir: str
    jail_dir: str | None = None
    cgroup_dirs: list[str] = Field(default_factory=list)
    socket: str
    serial: str


def vm_sizing(spec: SandboxSpec) -> MachineConfig:
    """Guest memory = sandbox memory (default 4 GiB) + 1 GiB for the guest kernel; vCPUs = the
    sandbox's CPUs rounded up (at least 1)."""
    memory = (spec.memory_bytes or DEFAULT_MEMORY_BYTES) + GUEST_KERNEL_OVERHEAD_BYTES
    vcpus = max(1, math.ceil(spec.cpus)) if spec.cpus else 1
    return MachineConfig(vcpu_count=min(vcpus, 32), mem_size_mib=memory // (1 << 20))


def _pid_start(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def vm_layer_available() -> bool:
    return importlib.util.find_spec("karotte.host.vm") is not None


# One serial line carries the kernel console and the channel's frames: the kernel prints only
# critical messages (loglevel=3) so that its lines do not pass for the guest's heartbeat.
GUEST_BOOT_ARGS = (
    "console=ttyS0 reboot=k panic=1 pci=off quiet loglevel=3 i8042.noaux "
    "karotte.root=/dev/vda karotte.scratch=/dev/vdb karotte.in=/dev/vdc karotte.out=/dev/vdd "
    "karotte.channel=/dev/ttyS0"
)


def firecracker_config(layout: VmLayout, kernel: Path) -> dict[str, object]:
    """Firecracker's ``--config-file`` for one VM-layer sandbox: the four drives in the order
    the guest's stage-1 init expects them (``/dev/vda`` … ``vdd``, named on the command line:
    Firecracker's drives carry no serial), no network, serial = the channel."""
    drives = [
        ("root", layout.root, True),
        ("scratch", layout.scratch, False),
        ("in", layout.io_in, True),
        ("out", layout.out, False),
    ]
    return {
        "boot-source": {
            "kernel_image_path": str(kernel),
            "initrd_path": str(layout.kernel.initramfs),
            "boot_args": GUEST_BOOT_ARGS,
        },
        "drives": [
            {
                "drive_id": name,
                "path_on_host": str(path),
                "is_root_device": False,
                "is_read_only": read_only,
            }
            for name, path, read_only in drives
        ],
        "machine-config": {"vcpu_count": layout.vcpus, "mem_size_mib": layout.memory_mib},
    }


class FirecrackerGuests(VmRuntime):
    """The guest path: the shared VM layer (drives, guest init, channel, watchdog, ``/out``)
    with Firecracker as the VMM, started from a config file (``--no-api``) by the supervisor,
    under the jailer when karotte runs as root (the jail lives in the sandbox's directory, so it
    goes with it; its cgroups are removed by :meth:`remove`). The serial console (the guest's
    ``ttyS0``: kernel messages and the channel's frames) is appended to the sandbox's
    ``channel.log``; ``console.log`` points at the same file."""

    name: ClassVar[str] = "firecracker"
    sandbox_kind: ClassVar[str] = "firecracker"

    def __init__(self, use_jailer: bool | None = None) -> None:
        super().__init__()
        self.use_jailer = os.geteuid() == 0 if use_jailer is None else use_jailer

    def availability(self) -> Availability:  # the owning FirecrackerRuntime decides
        return Availability(ok=True)

    @staticmethod
    def vm_id_of(directory: Path) -> str:
        return re.sub(r"[^A-Za-z0-9-]", "-", directory.name)[:64]

    @classmethod
    def vm_id(cls, layout: VmLayout) -> str:
        return cls.vm_id_of(layout.directory)

    def vmm_argv(self, layout: VmLayout) -> list[str]:
        firecracker = find_binary("firecracker")
        kernel = find_kernel()
        if sha256_file(layout.kernel.vmlinux) != kernel.sha256:
            raise RuntimeUnavailableError(
                f"the Firecracker guest kernel {kernel.path} is not the kernel of the VM layer's "
                f"initramfs ({layout.kernel.vmlinux}, {layout.kernel.version}): its modules "
                "would not load\nfix: rerun `sudo scripts/setup-vm.sh`, then "
                "`sudo scripts/setup-firecracker.sh` (it takes the VM layer's kernel)"
            )
        with contextlib.suppress(FileExistsError):
            layout.console_log.symlink_to(layout.channel_log.name)
        # firecracker writes the guest's serial console on its stdout: into the channel log
        wrapper = [
            "/bin/sh",
            "-c",
            'out=$1; shift; exec "$@" >>"$out"',
            "karotte-firecracker",
            str(layout.channel_log),
        ]
        fc_args = ["--no-api", "--level", "Warning"]
        if not self.use_jailer:
            config = layout.directory / "firecracker.json"
            config.write_text(json.dumps(firecracker_config(layout, kernel.path), indent=1))
            log = layout.directory / "firecracker.log"
            log.touch()
            return [
                *wrapper,
                str(firecracker.path),
                "--config-file",
                str(config),
                "--log-path",
                str(log),
                "--id",
                self.vm_id(layout),
                *fc_args,
            ]
        jail = self._jail(layout)
        self._stage_jail(layout, kernel.path, jail)
        version = jail.cgroup_version or host_cgroup_version()
        return [
            *wrapper,
            *jailer_argv(firecracker.path, self.vm_id(layout), jail, version),
            "--",  # firecracker's arguments; paths inside the chroot
            "--config-file",
            "/firecracker.json",
            "--log-path",
            "/firecracker.log",
            *fc_args,
        ]

    def _jail(self, layout: VmLayout) -> JailerConfig:
        return JailerConfig(
            jailer=find_binary("jailer").path,
            chroot_base=layout.directory / "jail",
            memory_bytes=(layout.memory_mib + 256) << 20,
            pids_limit=64,
            cpu_quota=float(layout.vcpus),
        )

    def _stage_jail(self, layout: VmLayout, kernel: Path, jail: JailerConfig) -> Path:
        """The chroot the jailer completes: kernel, initramfs and drives linked (or copied) in,
        what the VMM writes (or may not read otherwise) owned by the jail's user."""
        root = jail.chroot_base / "firecracker" / self.vm_id(layout) / "root"
        root.mkdir(parents=True)
        staged = {
            "vmlinux": (kernel, False),
            "initrd": (layout.kernel.initramfs, True),
            "root.ext4": (layout.root, False),
            "scratch.ext4": (layout.scratch, True),
            "in.ext4": (layout.io_in, True),
            "out.raw": (layout.out, True),
        }
        for name, (source, owned) in staged.items():
            target = root / name
            if source == layout.kernel.initramfs:  # 0600 and shared: a private copy
                shutil.copyfile(source, target)
            else:
                try:
                    os.link(source, target)
                except OSError:
                    shutil.copyfile(source, target)
            if owned:
                os.chown(target, jail.uid, jail.gid)
        config = firecracker_config(layout, Path("/vmlinux"))
        boot = config["boot-source"]
        assert isinstance(boot, dict)
        boot["initrd_path"] = "/initrd"
        drives = config["drives"]
        assert isinstance(drives, list)
        for drive, name in zip(
            drives, ["root.ext4", "scratch.ext4", "in.ext4", "out.raw"], strict=True
        ):
            drive["path_on_host"] = "/" + name
        (root / "firecracker.json").write_text(json.dumps(config, indent=1))
        log = root / "firecracker.log"
        log.touch()
        os.chown(log, jail.uid, jail.gid)
        return root

    def remove(self, sandbox: Sandbox) -> None:
        vm_id = self.vm_id_of(self.sandbox_dir(sandbox.name))
        super().remove(sandbox)
        for cgroup in jail_cgroup_dirs(vm_id):
            _rmdir_cgroup(cgroup)


def jail_cgroup_dirs(vm_id: str, parent: str = PARENT_CGROUP) -> list[Path]:
    """Every cgroup directory a jail ``vm_id`` may have (v1: one per controller; v2: one)."""
    if host_cgroup_version() == 2:
        return [CGROUP_ROOT / parent / vm_id]
    return sorted(CGROUP_ROOT.glob(f"*/{parent}/{vm_id}"))


class FirecrackerRuntime(Runtime):
    name: ClassVar[str] = "firecracker"
    sandbox_kind: ClassVar[str] = "firecracker"
    isolation: ClassVar[str] = "vm"

    def __init__(self, use_jailer: bool | None = None) -> None:
        # the jailer needs root (chroot, cgroups, mknod); it is used whenever we are root
        self.use_jailer = os.geteuid() == 0 if use_jailer is None else use_jailer
        self._images = DockerRuntime()
        self._guest_runtime: FirecrackerGuests | None = None

    # ---- availability ------------------------------------------------------------------------
    def availability(self) -> Availability:
        if (why := host_supported()) is not None:
            return Availability(
                ok=False, reason=why, fix="use docker (or apple-container on macOS)"
            )
        try:
            find_binary("firecracker")
            if self.use_jailer:
                find_binary("jailer")
            find_kernel()
        except ArtifactError as exc:
            reason, _, fix = str(exc).partition("\nfix: ")
            return Availability(ok=False, reason=reason, fix=fix or SETUP_FIX)
        from karotte.host.boot_probe import firecracker_boot_probe

        probe = firecracker_boot_probe()
        if not probe.ok:
            fix = NOT_BOOTING_FIX
            if probe.stage == "no-kvm":
                fix = (
                    "enable hardware virtualization (VT-x/AMD-V) and load kvm_intel/kvm_amd, or "
                    "run as a user in the `kvm` group; " + NOT_BOOTING_FIX
                )
            return Availability(
                ok=False, reason=f"Firecracker guests do not boot here: {probe.reason}", fix=fix
            )
        if not vm_layer_available():
            return Availability(
                ok=False,
                reason="guests boot here, but this karotte has no VM layer (karotte.host.vm) "
                "to run the harness in a guest",
                fix="update karotte; meanwhile use docker or docker:gvisor",
            )
        return Availability(
            ok=True,
            reason=f"Firecracker microVM: {probe.reason} (the guest path shares the VM layer "
            "with qemu; it could not be tested end to end where karotte was developed)",
        )

    def diagnose(self) -> list[dict[str, object]]:
        """Every piece this runtime needs, each with ok, detail and the exact fix."""
        pieces: list[dict[str, object]] = []

        def add(piece: str, ok: bool, detail: str, fix: str = "") -> None:
            pieces.append({"piece": piece, "ok": ok, "detail": detail, "fix": "" if ok else fix})

        if (why := host_supported()) is not None:
            add("host", False, why, "use docker")
            return pieces
        names = ["firecracker", "jailer"] if self.use_jailer else ["firecracker"]
        for name in names:
            try:
                found = find_binary(name)
                add(name, True, f"{found.path} ({found.origin}, SHA-256 verified)")
            except ArtifactError as exc:
                reason, _, fix = str(exc).partition("\nfix: ")
                add(name, False, reason, fix)
        try:
            kernel = find_kernel()
            add(
                "guest kernel",
                True,
                f"{kernel.path} ({kernel.origin}, SHA-256 {kernel.sha256[:12]}…)",
            )
        except ArtifactError as exc:
            reason, _, fix = str(exc).partition("\nfix: ")
            add("guest kernel", False, reason, fix)
        from karotte.host.boot_probe import firecracker_boot_probe, kvm_problem

        kvm = kvm_problem()
        add(
            "/dev/kvm",
            kvm is None,
            kvm or "present and read/writable (which alone proves nothing)",
            "enable VT-x/AMD-V and load kvm_intel/kvm_amd, or join the `kvm` group",
        )
        if all(piece["ok"] for piece in pieces):
            probe = firecracker_boot_probe()
            add("guest boots (probe)", probe.ok, probe.reason, NOT_BOOTING_FIX)
        add(
            "guest path (VM layer)",
            vm_layer_available(),
            "karotte.host.vm (drives, guest init, serial channel, watchdog) with Firecracker "
            "as the VMM"
            if vm_layer_available()
            else "karotte.host.vm is missing",
            "update karotte",
        )
        return pieces

    def _refuse(self, what: str) -> NoReturn:
        availability = self.availability()
        raise RuntimeUnavailableError(
            f"runtime 'firecracker' cannot {what}: {availability.reason}\nfix: {availability.fix}"
        )

    # ---- images: built by Docker, exported to drives by the VM layer -------------------------
    def build(
        self,
        context: Path,
        containerfile: Path,
        tag: str,
        build_args: dict[str, str],
        on_output: OutputCallback | None = None,
    ) -> str:
        return self._images.build(context, containerfile, tag, build_args, on_output)

    def image_exists(self, tag: str) -> bool:
        return self._images.image_exists(tag)

    def import_rootfs(self, tarball: Path, tag: str) -> str:
        return self._images.import_rootfs(tarball, tag)

    # ---- the control plane -------------------------------------------------------------------
    def launch_vmm(
        self,
        spec: SandboxSpec,
        drives: list[tuple[str, Path, bool, bool]] | None = None,
        initrd: Path | None = None,
        boot_args: str = DEFAULT_BOOT_ARGS,
        instance_start: bool = False,
    ) -> tuple[Sandbox, FirecrackerVM]:
        """Start a VMM for ``spec`` (jailed when root), configure it (sizing, kernel, drives,
        serial to a file) and, with ``instance_start``, start the guest. The VMM is recorded in
        the state dir; on any failure it is killed and cleaned up before the error propagates."""
        firecracker = find_binary("firecracker", fetch=True)
        kernel = find_kernel()
        jail = None
        if self.use_jailer:
            jail = JailerConfig(
                jailer=find_binary("jailer", fetch=True).path,
                chroot_base=Path(
                    os.environ.get("KAROTTE_JAILER_CHROOT_BASE") or DEFAULT_CHROOT_BASE
                ),
                memory_bytes=(spec.memory_bytes or DEFAULT_MEMORY_BYTES)
                + GUEST_KERNEL_OVERHEAD_BYTES
                + 256 * (1 << 20),  # the VMM's own memory next to the guest's
                pids_limit=64,
                cpu_quota=spec.cpus,
            )
        vm_id = f"k-{uuid.uuid4().hex[:16]}"
        states = state_dir()
        states.mkdir(parents=True, exist_ok=True, mode=0o700)
        vm = FirecrackerVM(firecracker.path, vm_id, workdir_base=states, jailer=jail)
        try:
            vm.spawn()
            assert vm.pid is not None
            record = VmRecord(
                name=spec.name,
                vm_id=vm_id,
                pid=vm.pid,
                pid_start=_pid_start(vm.pid),
                labels=dict(spec.labels),
                workdir=str(vm.workdir),
                jail_dir=str(vm.chroot_dir.parent) if vm.chroot_dir is not None else None,
                cgroup_dirs=[str(path) for path in vm.cgroup_dirs()],
                socket=str(vm.socket_path),
                serial=str(vm.serial_path),
            )
            (states / f"{vm_id}.json").write_text(record.model_dump_json())
            vm.configure(vm_sizing(spec), kernel.path, boot_args, drives=drives, initrd=initrd)
            if instance_start:
                vm.instance_start()
        except BaseException:
            vm.cleanup()
            (states / f"{vm_id}.json").unlink(missing_ok=True)
            raise
        sandbox = Sandbox(id=vm_id, name=spec.name, runtime=self.name, labels=dict(spec.labels))
        return sandbox, vm

    # ---- sandboxes ---------------------------------------------------------------------------
    def _guests(self) -> FirecrackerGuests:
        if self._guest_runtime is None:
            self._guest_runtime = FirecrackerGuests()
        return self._guest_runtime

    @staticmethod
    def _is_guest(sandbox: Sandbox) -> bool:
        return sandbox.id.startswith("vm-")  # the VM layer's ids; the control plane's are k-…

    def start(self, spec: SandboxSpec) -> Sandbox:
        """Refused (with the probe's reason) unless a Firecracker guest really boots here."""
        if not self.availability().ok:
            self._refuse(f"start sandbox {spec.name}")
        return self._guests().start(spec)

    def exec(
        self,
        sandbox: Sandbox,
        argv: list[str],
        user: str | None = None,
        timeout_s: float | None = None,
    ) -> ExecResult:
        return self._guests().exec(sandbox, argv, user, timeout_s)

    def stream_output(
        self, sandbox: Sandbox, on_stderr: OutputCallback | None = None
    ) -> Iterator[bytes]:
        if not self._is_guest(sandbox):
            raise RuntimeUnavailableError(
                f"{sandbox.name} is a bare Firecracker VMM (control plane): it has no harness "
                "output; its serial console is in its work dir"
            )
        return self._guests().stream_output(sandbox, on_stderr)

    def _records(self) -> list[VmRecord]:
        records = []
        for path in sorted(state_dir().glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                records.append(VmRecord.model_validate(json.loads(path.read_text())))
        return records

    def _record(self, sandbox: Sandbox) -> VmRecord | None:
        path = state_dir() / f"{sandbox.id}.json"
        try:
            return VmRecord.model_validate(json.loads(path.read_text()))
        except (OSError, ValueError):
            return None

    @staticmethod
    def _alive(record: VmRecord) -> bool:
        return record.pid_start != "" and _pid_start(record.pid) == record.pid_start

    def wait(self, sandbox: Sandbox, timeout_s: float | None = None) -> int:
        if self._is_guest(sandbox):
            return self._guests().wait(sandbox, timeout_s)
        record = self._record(sandbox)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while record is not None and self._alive(record):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"VM {sandbox.name} still running after {timeout_s} s")
            time.sleep(0.05)
        return 0 if record is not None else -1

    def stop(self, sandbox: Sandbox, timeout_s: float = 10) -> None:
        if self._is_guest(sandbox):
            self._guests().stop(sandbox, timeout_s)
            return
        record = self._record(sandbox)
        if record is None or not self._alive(record):
            return
        from karotte.host.firecracker.api import FirecrackerApi, FirecrackerApiError

        api = FirecrackerApi(Path(record.socket), timeout_s=2)
        try:
            with contextlib.suppress(FirecrackerApiError):
                if api.instance_info().get("state") == "Running":
                    api.send_ctrl_alt_del()
                    with contextlib.suppress(TimeoutError):
                        self.wait(sandbox, timeout_s)
        finally:
            api.close()
        self._kill(record)

    def _kill(self, record: VmRecord) -> None:
        if self._alive(record):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(record.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(record.pid, signal.SIGKILL)
            for _ in range(200):
                if not self._alive(record) or _zombie(record.pid):
                    break
                time.sleep(0.01)

    def remove(self, sandbox: Sandbox) -> None:
        """Kill the VMM and remove its socket, work dir, jail and cgroups (idempotent)."""
        if self._is_guest(sandbox):
            self._guests().remove(sandbox)
            return
        record = self._record(sandbox)
        if record is None:
            return
        self._kill(record)
        if record.jail_dir:
            shutil.rmtree(record.jail_dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                Path(record.jail_dir).parent.rmdir()
        for cgroup in record.cgroup_dirs:
            _rmdir_cgroup(Path(cgroup))
        shutil.rmtree(record.workdir, ignore_errors=True)
        (state_dir() / f"{record.vm_id}.json").unlink(missing_ok=True)

    def list_sandboxes(self, labels: dict[str, str]) -> list[Sandbox]:
        found = self._guests().list_sandboxes(labels)
        for record in self._records():
            if all(
                record.labels.get(key) == value if value else key in record.labels
                for key, value in labels.items()
            ):
                found.append(
                    Sandbox(
                        id=record.vm_id, name=record.name, runtime=self.name, labels=record.labels
                    )
                )
        return found


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _rmdir_cgroup(path: Path) -> None:
    for _ in range(50):
        if not path.exists():
            break
        try:
            path.rmdir()
            break
        except OSError:
            time.sleep(0.02)
    with contextlib.suppress(OSError):
        path.parent.rmdir()


register_runtime("firecracker")(FirecrackerRuntime)
