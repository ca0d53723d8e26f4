"""The firecracker runtime's guest path: the VM layer's drives, initramfs and channel with
Firecracker as the VMM (``--no-api --config-file``). Tested for real up to the VMM accepting the
whole machine and running it; a full run needs a host where the boot probe says guests boot."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from karotte.errors import RuntimeUnavailableError
from karotte.host.runtimes.firecracker import (
    GUEST_BOOT_ARGS,
    FirecrackerGuests,
    _rmdir_cgroup,
    jail_cgroup_dirs,
)
from karotte.host.vm.kernel import GuestKernel, KernelMissingError, prepare_kernel
from karotte.host.vm.machine import VmLayout

pytestmark = pytest.mark.usefixtures("kvm")


@pytest.fixture
def layout(guest_kernel: Path, tmp_path: Path) -> VmLayout:
    try:
        kernel = prepare_kernel()
    except KernelMissingError as exc:
        pytest.skip(f"VM layer kernel: {exc}")
    drives = {}
    for name in ("root", "scratch", "in", "out"):
        drives[name] = tmp_path / f"{name}.img"
        drives[name].write_bytes(b"\0" * (1 << 20))
    return VmLayout(
        directory=tmp_path,
        kernel=kernel,
        root=drives["root"],
        scratch=drives["scratch"],
        io_in=drives["in"],
        out=drives["out"],
        memory_mib=512,
        vcpus=1,
    )


@pytest.mark.parametrize(
    "jailed", [False, pytest.param(True, marks=pytest.mark.requires_root)], ids=["direct", "jailer"]
)
def test_vmm_runs_the_whole_machine_from_its_config(
    layout: VmLayout, guest_kernel: Path, firecracker_bin: Path, jailed: bool
) -> None:
    guests = FirecrackerGuests(use_jailer=jailed)
    argv = guests.vmm_argv(layout)
    if jailed:
        vm_id = guests.vm_id(layout)
        root = layout.directory / "jail" / "firecracker" / vm_id / "root"
        config = json.loads((root / "firecracker.json").read_text())
        paths = [d["path_on_host"] for d in config["drives"]]
        assert paths == ["/root.ext4", "/scratch.ext4", "/in.ext4", "/out.raw"]
        assert config["boot-source"]["kernel_image_path"] == "/vmlinux"
        assert (root / "out.raw").stat().st_ino == layout.out.stat().st_ino  # same file
        assert (root / "scratch.ext4").stat().st_uid == 65534
        assert "--config-file" in argv and argv[argv.index("--") + 2] == "/firecracker.json"
        log_path = root / "firecracker.log"
    else:
        config = json.loads((layout.directory / "firecracker.json").read_text())
        assert str(firecracker_bin) in argv and "--no-api" in argv
        assert config["boot-source"]["initrd_path"] == str(layout.kernel.initramfs)
        assert config["boot-source"]["kernel_image_path"] == str(guest_kernel)
        log_path = layout.directory / "firecracker.log"
    assert [d["drive_id"] for d in config["drives"]] == ["root", "scratch", "in", "out"]
    assert [d["is_read_only"] for d in config["drives"]] == [True, False, True, False]
    assert config["machine-config"] == {"vcpu_count": 1, "mem_size_mib": 512}
    assert "karotte.root=/dev/vda" in GUEST_BOOT_ARGS and "karotte.out=/dev/vdd" in GUEST_BOOT_ARGS
    assert layout.console_log.is_symlink()  # the console is the channel's serial line
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(1.5)
        # a bad config makes firecracker exit at once; this one is accepted and the VM runs
        assert proc.poll() is None, log_path.read_text()
        log = log_path.read_text()
        assert "error" not in log.lower(), log
        if jailed:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            assert "\nUid:\t65534\t65534" in status  # jailer exec'd firecracker, same pid
            assert jail_cgroup_dirs(vm_id)
    finally:
        proc.kill()
        proc.wait()
    if jailed:
        for cgroup in jail_cgroup_dirs(vm_id):
            _rmdir_cgroup(cgroup)
        assert jail_cgroup_dirs(vm_id) == []


def test_kernel_and_initramfs_must_match(layout: VmLayout, tmp_path: Path) -> None:
    other = tmp_path / "other-vmlinux"
    other.write_bytes(b"\x7fELF other kernel")
    mismatched = VmLayout(
        **{
            **layout.__dict__,
            "kernel": GuestKernel(
                version="0.0-other", vmlinux=other, initramfs=layout.kernel.initramfs
            ),
        }
    )
    with pytest.raises(RuntimeUnavailableError, match="modules"):
        FirecrackerGuests().vmm_argv(mismatched)
