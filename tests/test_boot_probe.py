"""The boot probe: its guest init and initramfs are real (executed / unpacked here), it says "no"
on this machine with the reason, it is cached per binary + kernel + host kernel with a TTL, and
the default runtime follows it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from karotte.host import boot_probe
from karotte.host.boot_probe import (
    MARKER,
    ProbeResult,
    firecracker_boot_probe,
    make_init_elf,
    make_initramfs,
    probe_key,
)
from karotte.host.firecracker.artifacts import ArtifactError, find_binary, find_kernel
from karotte.host.runtimes.selection import firecracker_can_boot, select_default_runtime


def test_init_elf_prints_the_marker(tmp_path: Path) -> None:
    # the probe's /init without its reboot call (a reboot request on the host must never run)
    init = tmp_path / "init"
    init.write_bytes(make_init_elf(reboot=False))
    init.chmod(0o755)
    proc = subprocess.run([str(init)], capture_output=True, timeout=10, check=False)
    assert proc.returncode == 0
    assert proc.stdout == MARKER + b"\n"
    assert b"\xb8\xa9\x00\x00\x00" in make_init_elf()  # the guest's version calls reboot(2)


@pytest.mark.skipif(shutil.which("cpio") is None, reason="cpio not installed (scripts/setup-vm.sh)")
def test_initramfs_unpacks_with_cpio(tmp_path: Path) -> None:
    archive = make_initramfs(make_init_elf())
    listing = subprocess.run(
        ["cpio", "-itv"], input=archive, capture_output=True, check=True
    ).stdout.decode()
    names = [line.split()[-1] for line in listing.splitlines()]
    assert names == ["dev", "dev/console", "init"]
    console = next(line for line in listing.splitlines() if line.endswith("dev/console"))
    assert console.startswith("crw")  # a character device …
    assert re.search(r"\b5,\s*1\b", console), console  # … 5:1, /dev/console
    init = next(line for line in listing.splitlines() if line.endswith(" init"))
    assert init.startswith("-rwxr-xr-x")


def test_probe_key_changes_with_binary_kernel_and_host() -> None:
    a = probe_key("f" * 64, "k" * 64)
    assert a == probe_key("f" * 64, "k" * 64)
    assert a != probe_key("e" * 64, "k" * 64)
    assert a != probe_key("f" * 64, "j" * 64)
    assert os.uname().release  # the host kernel is part of the key (see boot_probe.host_kernel)
    assert os.uname().release in boot_probe.host_kernel()


def test_cache_is_read_and_expires(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = boot_probe._cache_file("abc")
    path.parent.mkdir(parents=True)
    fresh = ProbeResult(ok=False, reason="r", stage="crawl", key="abc", probed_at=time.time())
    path.write_text(fresh.model_dump_json())
    cached = boot_probe._read_cache(path)
    assert cached is not None and cached.cached and cached.reason == "r"
    monkeypatch.setenv("KAROTTE_BOOT_PROBE_TTL_S", "60")
    path.write_text(fresh.model_copy(update={"probed_at": time.time() - 61}).model_dump_json())
    assert boot_probe._read_cache(path) is None
    path.write_text("{not json")
    assert boot_probe._read_cache(path) is None


def test_missing_kernel_is_a_reason_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAROTTE_GUEST_KERNEL", str(tmp_path / "no-such-vmlinux"))
    result = firecracker_boot_probe()
    assert not result.ok
    assert result.stage in ("no-artifacts", "unsupported")
    assert "guest kernel" in result.reason or "Firecracker" in result.reason


def _artifacts_or_skip() -> None:
    try:
        find_binary("firecracker")
        find_kernel()
    except ArtifactError as exc:
        pytest.skip(f"{str(exc).splitlines()[0]} (run scripts/setup-firecracker.sh)")


@pytest.mark.slow
def test_probe_boots_for_real_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real boot attempt (uncached). On KVM-PVM hosts like ours: "no", with the reason."""
    _artifacts_or_skip()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if not Path("/dev/kvm").exists():
        result = firecracker_boot_probe(timeout_s=5)
        assert not result.ok and result.stage == "no-kvm" and "/dev/kvm" in result.reason
        return
    started = time.monotonic()
    result = firecracker_boot_probe(timeout_s=8)
    assert time.monotonic() - started < 8 + 10
    assert result.socket_ready_ms is not None and result.instance_start_ms is not None
    if result.ok:
        assert result.stage == "booted" and "booted to user space" in result.reason
    else:
        assert result.stage in ("silent", "crawl", "died")
        assert result.reason
        if Path("/sys/module/kvm_pvm").exists():
            assert "KVM-PVM" in result.reason
            assert result.stage in ("crawl", "died", "silent")
        if result.stage in ("crawl", "died"):
            assert result.serial_tail, "the reason comes with the guest's serial output"
            assert any("Linux" in line or "[" in line for line in result.serial_tail)
    # cached: the second call does not boot again
    again = firecracker_boot_probe()
    assert again.cached and again.key == result.key and again.ok == result.ok
    cache_file = tmp_path / "karotte" / "boot-probe" / f"{result.key}.json"
    assert json.loads(cache_file.read_text())["stage"] == result.stage
    # nothing left behind by the probe's VM
    assert not list(Path("/tmp").glob(f"karotte-probe-*/karotte-fc-karotte-probe-{os.getpid()}-*"))


def test_default_runtime_follows_the_probe() -> None:
    can_boot, why = firecracker_can_boot()
    assert why.startswith("boot probe:") or "Firecracker" in why or "guest kernel" in why
    name, reason = select_default_runtime()
    if not can_boot:
        assert name != "firecracker"
        assert why in reason
    else:
        assert name == "firecracker"
