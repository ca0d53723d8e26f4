"""``qemu``: each run in a QEMU ``microvm`` with its own (Debian) kernel.

The VM layer (:mod:`karotte.host.vm`) does the drives, the guest init, the channel, the watchdog
and ``/out``; this module is QEMU's command line, the accelerator choice and the availability
probe. KVM is used only when a cached boot probe shows a guest really boots with it (on nested
hosts ``/dev/kvm`` can exist and still not run a guest); otherwise TCG, QEMU's software CPU:
the isolation is the same (a separate guest kernel), but guest code runs many times slower.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from karotte.host.runtimes.base import Availability, register_runtime
from karotte.host.vm import paths
from karotte.host.vm.kernel import GuestKernel, KernelMissingError, prepare_kernel
from karotte.host.vm.machine import VmLayout, VmRuntime
from karotte.host.vm.socket_forward import qemu_network_args

QEMU = "qemu-system-x86_64"
BOOT_MARKER = b"KAROTTE-BOOT-OK"
PROBE_TIMEOUT_S = 20.0
TCG_NOTE = (
    "TCG (software CPU): KVM does not boot a guest here, so guest code runs roughly 20x slower "
    "than on a host CPU; the isolation (a separate guest kernel) is the same"
)


class BootProbe(BaseModel):
    model_config = ConfigDict(extra="forbid")

    accel: str
    ok: bool
    seconds: float
    detail: str = ""


def qemu_base_argv(kernel: GuestKernel, accel: str, memory_mib: int, vcpus: int) -> list[str]:
    cmdline = "console=ttyS0 reboot=t panic=-1 quiet"
    if accel == "tcg":
        # TSC calibration under TCG is slow and unreliable; tell the kernel the frequency
        cmdline += " tsc_early_khz=2000000"
    return [
        QEMU,
        "-M",
        "microvm,rtc=on",
        "-accel",
        accel,
        "-cpu",
        os.environ.get("KAROTTE_QEMU_CPU") or ("max" if accel == "tcg" else "host"),
        "-m",
        str(memory_mib),
        "-smp",
        str(vcpus),
        "-nodefaults",
        "-no-user-config",
        "-nographic",
        "-no-reboot",
        "-kernel",
        str(kernel.vmlinux),
        "-initrd",
        str(kernel.initramfs),
        "-append",
        cmdline,
    ]


def boot_to_marker(
    kernel: GuestKernel, accel: str, timeout_s: float = PROBE_TIMEOUT_S
) -> BootProbe:
    """Boot the guest kernel + initramfs to the init's marker and power off (nothing else)."""
    argv = qemu_base_argv(kernel, accel, 256, 1)
    argv[argv.index("-append") + 1] += " karotte.probe=1"
    argv += ["-serial", "stdio"]
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
    except OSError as exc:
        return BootProbe(accel=accel, ok=False, seconds=0.0, detail=str(exc))
    assert proc.stdout is not None
    output = b""
    ok = False
    os.set_blocking(proc.stdout.fileno(), False)
    while time.monotonic() - started < timeout_s:
        chunk = proc.stdout.read() or b""
        output += chunk
        if BOOT_MARKER in output:
            ok = True
            break
        if proc.poll() is not None and not chunk:
            break
        time.sleep(0.01)
    seconds = time.monotonic() - started
    exited = proc.poll()
    proc.kill()
    proc.wait()
    tail = output.decode(errors="replace").strip().splitlines()[-3:]
    why = "QEMU exited" if exited is not None else f"no marker in {timeout_s:.0f} s"
    detail = "" if ok else (f"{why} without booting; " + " | ".join(tail))[:500]
    return BootProbe(accel=accel, ok=ok, seconds=seconds, detail=detail)


def kvm_probe(kernel: GuestKernel) -> BootProbe:
    """Does a guest boot under KVM here? Cached per guest kernel and host kernel."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return BootProbe(accel="kvm", ok=False, seconds=0.0, detail="/dev/kvm is not usable")
    key = hashlib.sha256(
        f"{kernel.version}|{kernel.initramfs.name}|{platform.release()}".encode()
    ).hexdigest()[:16]
    cache = paths.cache_dir() / f"kvm-probe-{key}.json"
    try:
        return BootProbe.model_validate_json(cache.read_text())
    except (OSError, ValueError):
        pass
    probe = boot_to_marker(kernel, "kvm")
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(probe.model_dump_json())
    return probe


@register_runtime("qemu")
class QemuRuntime(VmRuntime):
    name: ClassVar[str] = "qemu"
    sandbox_kind: ClassVar[str] = "qemu"
    has_exec_channel: ClassVar[bool] = True
    forwards_sockets: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self._accel: str | None = None
        self.accel_note = ""

    def accel(self, kernel: GuestKernel) -> str:
        forced = os.environ.get("KAROTTE_QEMU_ACCEL")
        if forced in ("kvm", "tcg"):
            self._accel = forced
            self.accel_note = f"accelerator {forced} (KAROTTE_QEMU_ACCEL)"
        if self._accel is None:
            probe = kvm_probe(kernel)
            self._accel = "kvm" if probe.ok else "tcg"
            self.accel_note = (
                "KVM (a guest booted in the probe)" if probe.ok else f"{TCG_NOTE} ({probe.detail})"
            )
        return self._accel

    def availability(self) -> Availability:
        missing = [tool for tool in (QEMU, "mkfs.ext4", "tar") if shutil.which(tool) is None]
        if missing:
            return Availability(
                ok=False,
                reason=f"not installed: {', '.join(missing)}",
                fix="sudo scripts/setup-vm.sh (apt-get install qemu-system-x86 e2fsprogs "
                "busybox-static lz4 and a Debian cloud kernel)",
            )
        try:
            kernel = prepare_kernel()
        except (KernelMissingError, OSError) as exc:
            return Availability(ok=False, reason=str(exc), fix="sudo scripts/setup-vm.sh")
        engine = self.engine.availability()
        if not engine.ok:
            return Availability(
                ok=False,
                reason=f"images are built and exported by docker, which is not usable: "
                f"{engine.reason}",
                fix=engine.fix,
            )
        accel = self.accel(kernel)
        return Availability(ok=True, reason=f"QEMU microvm, {accel}: {self.accel_note}")

    def watchdog_s(self) -> float:
        # TCG on a busy host can stall a guest for many seconds without it being hung
        default = "60" if self._accel == "kvm" else "120"
        return float(os.environ.get("KAROTTE_VM_WATCHDOG_S", default))

    def vmm_argv(self, layout: VmLayout) -> list[str]:
        argv = qemu_base_argv(
            layout.kernel, self.accel(layout.kernel), layout.memory_mib, layout.vcpus
        )
        argv += ["-serial", f"file:{layout.console_log}"]
        for name, path, readonly in (
            ("root", layout.root, True),
            ("scratch", layout.scratch, False),
            ("in", layout.io_in, True),
            ("out", layout.out, False),
        ):
            drive = f"id={name},file={path},format=raw,if=none,cache=unsafe"
            if readonly:
                drive += ",readonly=on"
            argv += ["-drive", drive]
            argv += ["-device", f"virtio-blk-device,drive={name},serial=karotte-{name}"]
        argv += [
            "-device",
            "virtio-serial-device,max_ports=4",
            "-chardev",
            f"file,id=events,path={layout.channel_log}",
            "-device",
            "virtserialport,chardev=events,name=karotte.events",
            "-chardev",
            f"socket,id=ctl,path={layout.control_socket},server=on,wait=off",
            "-device",
            "virtserialport,chardev=ctl,name=karotte.ctl",
            "-chardev",
            f"socket,id=exec,path={layout.exec_socket},server=on,wait=off",
            "-device",
            "virtserialport,chardev=exec,name=karotte.exec",
            "-qmp",
            f"unix:{layout.qmp_socket},server=on,wait=off",
        ]
        # no network device unless the launcher's relays must reach the guest, and then one
        # that reaches nothing but them
        argv += qemu_network_args(list(layout.socket_forwards))
        return argv


def qmp(socket_path: Path, command: str) -> dict[str, object]:
    """One QMP command on a VM's monitor socket (used by tests and diagnostics)."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(socket_path))
        handle = sock.makefile("rwb")
        handle.readline()  # greeting
        for request in ({"execute": "qmp_capabilities"}, {"execute": command}):
            handle.write(json.dumps(request).encode() + b"\n")
            handle.flush()
            while True:
                reply: dict[str, object] = json.loads(handle.readline())
                if "return" in reply or "error" in reply:
                    break
        return reply


__all__ = ["QemuRuntime", "boot_to_marker", "kvm_probe", "qmp"]
