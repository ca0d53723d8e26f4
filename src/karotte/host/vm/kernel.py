"""The guest kernel: a Debian kernel package unpacked by ``scripts/setup-vm.sh``.

At first use (cached under the VM cache, keyed by kernel version and the init's content):

* ``vmlinux`` — the payload of the ``vmlinuz`` bzImage, decompressed: QEMU's ``microvm`` boots
  an uncompressed ELF through PVH much faster than a bzImage, and Firecracker needs one too;
* ``initramfs.cpio`` — busybox (static, from the host's ``busybox-static``), the modules the guest
  needs (virtio-mmio, virtio-blk, virtio-console, virtio-net for socket forwards, loop, overlay,
  the netfilter pieces the student's firewall uses) with their dependencies, and the stage-1
  ``/init`` (a shell script that mounts the drives, builds the root overlay, prepares cgroups and
  hands over to :mod:`karotte.host.vm.guest_init`, copied into the guest's root).
"""

from __future__ import annotations

import gzip
import hashlib
import lzma
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from karotte.host.vm.paths import cache_dir, kernel_package_dir

BUSYBOX = Path("/bin/busybox")
# modules loaded at boot, in this order after their dependencies (built-in ones are skipped)
GUEST_MODULES = (
    "virtio_mmio",
    "virtio_blk",
    "virtio_console",
    "virtio_net",
    "loop",
    "overlay",
    "nf_tables",
    "nft_compat",
    "nft_reject",
    "nft_reject_inet",
    "nft_reject_ipv4",
    "nft_reject_ipv6",
    "nf_reject_ipv4",
    "nf_reject_ipv6",
    "x_tables",
    "xt_owner",
    "xt_tcpudp",
    "xt_REJECT",
    "ipt_REJECT",
    "ip6t_REJECT",
    "ip_tables",
    "ip6_tables",
    "iptable_filter",
    "ip6table_filter",
    "nft_ct",
    "xt_conntrack",
)
_DEPENDS = re.compile(rb"(?:^|\x00)depends=([^\x00]*)\x00")


class KernelMissingError(RuntimeError):
    """No guest kernel (or a tool to prepare it) here; the message says what to do."""


@dataclass(frozen=True)
class GuestKernel:
    version: str
    vmlinux: Path
    initramfs: Path


def find_vmlinuz(package_dir: Path | None = None) -> Path:
    base = package_dir or kernel_package_dir()
    candidates = sorted((base / "boot").glob("vmlinuz-*"))
    if not candidates:
        raise KernelMissingError(
            f"no guest kernel in {base}/boot (a Debian linux-image package unpacked there); "
            "run `sudo scripts/setup-vm.sh` or set KAROTTE_VM_KERNEL_DIR"
        )
    return candidates[-1]


def decompress_bzimage(vmlinuz: Path, target: Path) -> None:
    """Write the uncompressed ELF kernel inside the bzImage ``vmlinuz`` to ``target``."""
    data = vmlinuz.read_bytes()
    if data[0x202:0x206] != b"HdrS":
        raise KernelMissingError(f"{vmlinuz} is not a bzImage")
    setup_sects = data[0x1F1] or 4
    offset = int.from_bytes(data[0x248:0x24C], "little")
    length = int.from_bytes(data[0x24C:0x250], "little")
    start = (setup_sects + 1) * 512 + offset
    payload = data[start : start + length]
    if payload[:4] == b"\x02\x21\x4c\x18":  # lz4 legacy frame
        out = _tool_decompress(["lz4", "-dc"], payload, "lz4")
    elif payload[:4] == b"\x28\xb5\x2f\xfd":
        out = _tool_decompress(["zstd", "-dc"], payload, "zstd")
    elif payload[:2] == b"\x1f\x8b":
        out = gzip.decompress(payload)
    elif payload[:6] == b"\xfd7zXZ\x00":
        out = lzma.decompress(payload)
    else:
        raise KernelMissingError(f"{vmlinuz}: unknown kernel compression {payload[:6].hex()}")
    if out[:4] != b"\x7fELF":
        raise KernelMissingError(f"{vmlinuz}: the decompressed payload is not an ELF kernel")
    _write_atomic(target, out)


def _tool_decompress(argv: list[str], payload: bytes, package: str) -> bytes:
    if shutil.which(argv[0]) is None:
        raise KernelMissingError(
            f"`{argv[0]}` is needed to unpack the guest kernel: apt-get install {package}"
        )
    proc = subprocess.run(argv, input=payload, capture_output=True, check=False)
    if not proc.stdout:
        raise KernelMissingError(f"{argv[0]} failed: {proc.stderr.decode(errors='replace')}")
    return proc.stdout


def _write_atomic(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---- modules -------------------------------------------------------------------------------------
def module_index(modules_dir: Path) -> dict[str, Path]:
    index: dict[str, Path] = {}
    for path in modules_dir.rglob("*.ko"):
        index[path.stem.replace("-", "_")] = path
    return index


def module_depends(path: Path) -> list[str]:
    match = _DEPENDS.search(path.read_bytes())
    if not match or not match.group(1):
        return []
    return [name.replace("-", "_") for name in match.group(1).decode().split(",") if name]


def resolve_modules(index: dict[str, Path], wanted: tuple[str, ...]) -> list[Path]:
    """The modules of ``wanted`` that exist (others are built in), dependencies first."""
    order: list[Path] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen or name not in index:
            return
        seen.add(name)
        for dep in module_depends(index[name]):
            visit(dep)
        order.append(index[name])

    for name in wanted:
        visit(name)
    return order


# ---- initramfs (cpio "newc", written here: no cpio binary needed) --------------------------------
def _cpio_entry(name: str, mode: int, data: bytes, ino: int) -> bytes:
    encoded = name.encode() + b"\x00"
    fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0]
    header = b"070701" + b"".join(f"{value:08X}".encode() for value in fields)
    out = header + encoded
    out += b"\x00" * (-len(out) % 4)
    out += data
    out += b"\x00" * (-len(out) % 4)
    return out


def build_cpio(entries: list[tuple[str, int, bytes]]) -> bytes:
    """``(path, mode, content)`` entries (dirs: mode 0o040755, content b"") to a newc archive."""
    chunks = [_cpio_entry(name, mode, data, i + 1) for i, (name, mode, data) in enumerate(entries)]
    chunks.append(_cpio_entry("TRAILER!!!", 0, b"", 0))
    return b"".join(chunks)


def stage1_init() -> str:
    return resources.files("karotte.host.vm").joinpath("stage1_init.sh").read_text()


def guest_init_source() -> str:
    return resources.files("karotte.host.vm").joinpath("guest_init.py").read_text()


def build_initramfs(modules: list[Path], modules_root: Path, target: Path) -> None:
    if not BUSYBOX.is_file():
        raise KernelMissingError(
            f"{BUSYBOX} (static) is needed for the guest's initramfs: "
            "apt-get install busybox-static (or run scripts/setup-vm.sh)"
        )
    dir_mode, exe_mode, file_mode = 0o040755, 0o100755, 0o100644
    entries: list[tuple[str, int, bytes]] = [
        (d, dir_mode, b"")
        for d in ("bin", "dev", "proc", "sys", "newroot", "mnt", "mnt/root", "mnt/scratch")
    ]
    entries += [("mnt/in", dir_mode, b""), ("modules", dir_mode, b"")]
    entries.append(("bin/busybox", exe_mode, BUSYBOX.read_bytes()))
    entries.append(("init", exe_mode, stage1_init().encode()))
    entries.append(("karotte_init.py", file_mode, guest_init_source().encode()))
    names = []
    for i, module in enumerate(modules):
        name = f"{i:02d}-{module.name}"
        names.append(name)
        entries.append((f"modules/{name}", file_mode, module.read_bytes()))
    entries.append(("modules/order", file_mode, ("\n".join(names) + "\n").encode()))
    del modules_root
    _write_atomic(target, build_cpio(entries))


def prepare_kernel(package_dir: Path | None = None, cache: Path | None = None) -> GuestKernel:
    """The guest kernel's vmlinux and initramfs, prepared once (cached)."""
    vmlinuz = find_vmlinuz(package_dir)
    version = vmlinuz.name.removeprefix("vmlinuz-")
    base = package_dir or kernel_package_dir()
    modules_dir = base / "lib" / "modules" / version
    if not modules_dir.is_dir():
        raise KernelMissingError(
            f"{modules_dir} is missing (the kernel package's modules); rerun scripts/setup-vm.sh"
        )
    key = hashlib.sha256(
        (stage1_init() + guest_init_source() + ",".join(GUEST_MODULES)).encode()
    ).hexdigest()[:16]
    out_dir = (cache or cache_dir()) / "kernel" / version
    vmlinux = out_dir / "vmlinux"
    initramfs = out_dir / f"initramfs-{key}.cpio"
    if not vmlinux.is_file():
        decompress_bzimage(vmlinuz, vmlinux)
    if not initramfs.is_file():
        modules = resolve_modules(module_index(modules_dir), GUEST_MODULES)
        build_initramfs(modules, modules_dir, initramfs)
        for old in out_dir.glob("initramfs-*.cpio"):
            if old != initramfs:
                old.unlink(missing_ok=True)
    return GuestKernel(version=version, vmlinux=vmlinux, initramfs=initramfs)
