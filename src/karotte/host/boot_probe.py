"""Does a Firecracker microVM really boot here? Boot the guest kernel to a marker and see.

``/dev/kvm`` existing proves nothing: on nested hosts (KVM-PVM, for example) it answers the API
and creates VMs, but a stock guest kernel crawls and dies with ``KVM_EXIT_INTERNAL_ERROR``. So
the probe boots the real guest kernel under the real Firecracker with a tiny initramfs whose
``/init`` prints a marker on the serial console and reboots, and waits for the marker with a
timeout. The answer is yes/no plus *why* (the serial output, the VMM's exit reason, or the
timeout), cached under ``~/.cache/karotte/boot-probe/`` keyed by the Firecracker binary's and the
kernel's SHA-256 and the host kernel (release + build), for ``KAROTTE_BOOT_PROBE_TTL_S`` (24 h).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from karotte.errors import KarotteError
from karotte.host.base_image import cache_dir, file_lock

MARKER = b"KAROTTE-GUEST-USERSPACE-OK"
DEFAULT_TIMEOUT_S = 15.0
DEFAULT_TTL_S = 24 * 3600
PROBE_VERSION = 1  # bump when the probe's logic changes: old cached answers are then ignored
BOOT_ARGS = (
    "console=ttyS0 earlyprintk=serial,ttyS0,115200 reboot=k panic=1 pci=off "
    "i8042.noaux i8042.nomux i8042.dumbkbd rdinit=/init"
)


class ProbeResult(BaseModel):
    """The probe's answer. ``stage`` says how far the guest got."""

    model_config = ConfigDict(extra="forbid")

    ok: bool
    reason: str
    stage: str  # unsupported | no-kvm | no-artifacts | vmm-failed | silent | crawl | died | booted
    duration_s: float = 0.0
    serial_tail: list[str] = []
    vmm_log_tail: list[str] = []
    key: str = ""
    probed_at: float = 0.0
    cached: bool = False
    socket_ready_ms: float | None = None
    instance_start_ms: float | None = None


# ---- the guest's /init: a static x86-64 ELF that prints MARKER and reboots -----------------
def make_init_elf(message: bytes = MARKER + b"\n", reboot: bool = True) -> bytes:
    """A minimal static x86-64 Linux executable: ``write(1, message)``, then (as PID 1 in the
    guest) ``reboot(RESTART)`` (Firecracker exits on the guest's reset), then ``exit(0)``.

    Never run it on a host with ``reboot=True`` as root: that is a real reboot request."""
    base = 0x400000
    code_off = 64 + 56
    code = bytearray()
    code += b"\xb8\x01\x00\x00\x00"  # mov eax, 1 (write)
    code += b"\xbf\x01\x00\x00\x00"  # mov edi, 1
    lea_at = len(code)
    code += b"\x48\x8d\x35\x00\x00\x00\x00"  # lea rsi, [rip + msg]
    code += b"\xba" + struct.pack("<I", len(message))  # mov edx, len
    code += b"\x0f\x05"  # syscall
    if reboot:
        code += b"\xb8\xa9\x00\x00\x00"  # mov eax, 169 (reboot)
        code += b"\xbf\xad\xde\xe1\xfe"  # mov edi, LINUX_REBOOT_MAGIC1
        code += b"\xbe\x69\x19\x12\x28"  # mov esi, LINUX_REBOOT_MAGIC2
        code += b"\xba\x67\x45\x23\x01"  # mov edx, LINUX_REBOOT_CMD_RESTART
        code += b"\x0f\x05"  # syscall
    code += b"\xb8\x3c\x00\x00\x00"  # mov eax, 60 (exit)
    code += b"\x31\xff"  # xor edi, edi
    code += b"\x0f\x05"  # syscall
    code += b"\xeb\xfe"  # jmp $
    rel = len(code) - (lea_at + 7)
    code[lea_at + 3 : lea_at + 7] = struct.pack("<i", rel)
    body = bytes(code) + message
    total = code_off + len(body)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    header = struct.pack(
        "<16sHHIQQQIHHHHHH", ident, 2, 0x3E, 1, base + code_off, 64, 0, 0, 64, 56, 1, 0, 0, 0
    )
    phdr = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, total, total, 0x1000)
    return header + phdr + body


def make_initramfs(init: bytes) -> bytes:
    """A newc cpio archive with ``/dev/console`` (so init has a stdout) and ``/init``."""
    entries: list[tuple[str, int, bytes, tuple[int, int]]] = [
        ("dev", 0o040755, b"", (0, 0)),
        ("dev/console", 0o020600, b"", (5, 1)),
        ("init", 0o100755, init, (0, 0)),
        ("TRAILER!!!", 0, b"", (0, 0)),
    ]
    out = bytearray()
    for ino, (name, mode, data, (rmaj, rmin)) in enumerate(entries, start=1):
        encoded = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, rmaj, rmin, len(encoded), 0)
        out += b"070701" + b"".join(b"%08X" % value for value in fields) + encoded
        out += bytes(-len(out) % 4)
        out += data
        out += bytes(-len(out) % 4)
    out += bytes(-len(out) % 512)
    return bytes(out)


# ---- host facts ------------------------------------------------------------------------------
def host_kernel() -> str:
    uname = os.uname()
    return f"{uname.release} {uname.version}"


def kvm_problem() -> str | None:
    """Why /dev/kvm cannot be used at all (missing, no access), or None."""
    kvm = Path("/dev/kvm")
    if not kvm.exists():
        return (
            "/dev/kvm does not exist (no KVM: hardware virtualization is off, the kvm module "
            "is not loaded, or this is a VM without nested virtualization)"
        )
    if not os.access(kvm, os.R_OK | os.W_OK):
        return f"/dev/kvm is not read/writable for uid {os.geteuid()}"
    return None


def kvm_flavour() -> str:
    """A short note on what provides /dev/kvm here (shown with a failed probe)."""
    notes = []
    if Path("/sys/module/kvm_pvm").exists():
        notes.append("KVM-PVM (kvm_pvm module: para-virtualized KVM inside a VM)")
    for name in ("kvm_intel", "kvm_amd"):
        if Path(f"/sys/module/{name}").exists():
            notes.append(name)
    try:
        flags = next(
            line
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
        ).split()
        if "vmx" not in flags and "svm" not in flags:
            notes.append("the CPU shows no vmx/svm flag")
        if "hypervisor" in flags:
            notes.append("this host is itself a VM")
    except (OSError, StopIteration):
        pass
    return "; ".join(notes)


def probe_key(firecracker_sha: str, kernel_sha: str) -> str:
    text = f"{PROBE_VERSION}|{firecracker_sha}|{kernel_sha}|{host_kernel()}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _cache_file(key: str) -> Path:
    return cache_dir() / "boot-probe" / f"{key}.json"


def _ttl_s() -> float:
    try:
        return float(os.environ.get("KAROTTE_BOOT_PROBE_TTL_S", DEFAULT_TTL_S))
    except ValueError:
        return DEFAULT_TTL_S


# ---- the probe -------------------------------------------------------------------------------
def firecracker_boot_probe(
    refresh: bool = False, timeout_s: float | None = None, use_cache: bool = True
) -> ProbeResult:
    """Whether a Firecracker guest boots to user space here, and why (cached, see module doc)."""
    from karotte.host.firecracker.artifacts import (
        ArtifactError,
        find_binary,
        find_kernel,
        host_supported,
    )

    if (why := host_supported()) is not None:
        return ProbeResult(ok=False, reason=why, stage="unsupported")
    try:
        firecracker = find_binary("firecracker")
        kernel = find_kernel()
    except ArtifactError as exc:
        return ProbeResult(ok=False, reason=str(exc).split("\nfix:")[0], stage="no-artifacts")
    if (why := kvm_problem()) is not None:
        return ProbeResult(ok=False, reason=why, stage="no-kvm")
    key = probe_key(firecracker.sha256, kernel.sha256)
    path = _cache_file(key)
    if use_cache and not refresh and (cached := _read_cache(path)) is not None:
        return cached
    with file_lock(path.with_suffix(".lock")):
        if use_cache and not refresh and (cached := _read_cache(path)) is not None:
            return cached  # another process probed while we waited
        timeout = timeout_s if timeout_s is not None else _timeout_s()
        if sys.stderr.isatty():
            print(
                f"karotte: probing whether Firecracker guests boot here (up to {timeout:g} s, "
                "cached for a day) …",
                file=sys.stderr,
            )
        result = _boot(firecracker.path, kernel.path, timeout)
        result.key = key
        result.probed_at = time.time()
        if use_cache:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(result.model_dump_json(indent=1))
            tmp.replace(path)
    return result


def _timeout_s() -> float:
    try:
        return float(os.environ.get("KAROTTE_BOOT_PROBE_TIMEOUT_S", DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S


def _read_cache(path: Path) -> ProbeResult | None:
    try:
        result = ProbeResult.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None
    if time.time() - result.probed_at > _ttl_s():
        return None
    result.cached = True
    return result


def _tail(text: str, count: int = 8) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    return lines[-count:]


def _boot(firecracker: Path, kernel: Path, timeout_s: float) -> ProbeResult:
    from karotte.host.firecracker.api import FirecrackerApiError, MachineConfig
    from karotte.host.firecracker.vmm import FirecrackerVM, VmmError

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="karotte-probe-") as tmp:
        initrd = Path(tmp) / "initrd.cpio"
        initrd.write_bytes(make_initramfs(make_init_elf()))
        vm = FirecrackerVM(firecracker, f"karotte-probe-{os.getpid()}", workdir_base=Path(tmp))
        try:
            socket_s = vm.spawn()
            vm.configure(
                MachineConfig(vcpu_count=1, mem_size_mib=256), kernel, BOOT_ARGS, initrd=initrd
            )
            start_s = vm.instance_start()
        except (VmmError, FirecrackerApiError) as exc:
            vm.cleanup()
            return ProbeResult(
                ok=False,
                reason=f"Firecracker could not start a VM: {exc}",
                stage="vmm-failed",
                duration_s=time.monotonic() - started,
            )
        boot_started = time.monotonic()
        deadline = boot_started + timeout_s
        booted_after: float | None = None
        try:
            while time.monotonic() < deadline:
                if MARKER in vm.serial_path.read_bytes():
                    booted_after = time.monotonic() - boot_started
                    break
                if not vm.running():
                    break
                time.sleep(0.05)
            if booted_after is None and MARKER in vm.serial_path.read_bytes():
                booted_after = time.monotonic() - boot_started
        finally:
            exited = not vm.running()  # by itself, before we kill it
            vm.kill()
            serial = vm.serial_output()
            log = vm.log_output()
            vm.cleanup()
    common = {
        "duration_s": round(time.monotonic() - started, 3),
        "serial_tail": _tail(serial),
        "vmm_log_tail": _tail(log, 5),
        "socket_ready_ms": round(socket_s * 1000, 2),
        "instance_start_ms": round(start_s * 1000, 2),
    }
    if booted_after is not None:
        return ProbeResult(
            ok=True,
            reason=f"a Firecracker guest booted to user space in {booted_after:.2f} s",
            stage="booted",
            **common,  # type: ignore[arg-type]
        )
    flavour = kvm_flavour()
    host = f" (/dev/kvm here: {flavour})" if flavour else ""
    lines = [line for line in serial.splitlines() if line.strip()]
    last = f"; last guest line: {lines[-1].strip()!r}" if lines else ""
    if "KVM_EXIT_INTERNAL_ERROR" in log or (exited and "internal error" in log.lower()):
        reason = (
            f"the guest kernel died with KVM_EXIT_INTERNAL_ERROR after {len(lines)} serial "
            f"line(s), before reaching user space{last}{host}"
        )
        stage = "died"
    elif exited:
        vmm_tail = _tail(log, 2)
        reason = (
            f"Firecracker exited before the guest reached user space "
            f"({len(lines)} serial line(s){last}; VMM log: {' | '.join(vmm_tail) or 'empty'}){host}"
        )
        stage = "died"
    elif lines:
        reason = (
            f"the guest kernel started but did not reach user space within {timeout_s:g} s "
            f"({len(lines)} serial line(s){last}): guests crawl here, KVM does not really "
            f"work{host}"
        )
        stage = "crawl"
    else:
        reason = (
            f"the guest printed nothing on its serial console within {timeout_s:g} s after "
            f"InstanceStart{host}"
        )
        stage = "silent"
    return ProbeResult(ok=False, reason=reason, stage=stage, **common)  # type: ignore[arg-type]


class BootProbeError(KarotteError):
    """A run needs a booting Firecracker guest and the probe says there is none."""


def _main() -> int:
    refresh = "--refresh" in sys.argv
    result = firecracker_boot_probe(refresh=refresh)
    print(result.model_dump_json(indent=1))
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(_main())
