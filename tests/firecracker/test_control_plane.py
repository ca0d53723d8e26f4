"""Firecracker's control plane with the real, pinned binary: API socket, machine config, boot
source, drives, InstanceStart, stop/kill, the jailer (chroot, uid/gid, cgroups) and cleanup that
leaves nothing behind. The guest itself boots only where the boot probe says so."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from karotte.errors import RuntimeUnavailableError
from karotte.host.boot_probe import ProbeResult
from karotte.host.firecracker.api import FirecrackerApiError, MachineConfig
from karotte.host.firecracker.vmm import CGROUP_ROOT, FirecrackerVM, JailerConfig, VmmError
from karotte.host.runtimes import SandboxSpec, get_runtime
from karotte.host.runtimes.base import LABEL_RUN_ID
from karotte.host.runtimes.firecracker import FirecrackerRuntime, state_dir, vm_sizing

pytestmark = pytest.mark.usefixtures("kvm")

BOOT_ARGS = "console=ttyS0 reboot=k panic=1 pci=off"


def _vm_id() -> str:
    return f"kt-{uuid.uuid4().hex[:12]}"


def _status(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def test_api_config_and_instance_start(
    firecracker_bin: Path, guest_kernel: Path, tmp_path: Path
) -> None:
    drive = tmp_path / "scratch.img"
    drive.write_bytes(b"\0" * (1 << 20))
    with FirecrackerVM(firecracker_bin, _vm_id(), workdir_base=tmp_path) as vm:
        ready_s = vm.spawn()
        assert ready_s < 2.0
        assert vm.socket_path.is_socket()
        assert vm.api is not None
        info = vm.api.instance_info()
        assert info["state"] == "Not started" and info["vmm_version"] == "1.12.1"
        vm.configure(
            MachineConfig(vcpu_count=2, mem_size_mib=256),
            guest_kernel,
            BOOT_ARGS,
            drives=[("scratch", drive, False, False)],
        )
        config = vm.api.get_vm_config()
        assert config["machine-config"]["vcpu_count"] == 2
        assert config["machine-config"]["mem_size_mib"] == 256
        assert config["boot-source"]["kernel_image_path"] == str(guest_kernel)
        assert config["boot-source"]["boot_args"] == BOOT_ARGS
        assert [d["drive_id"] for d in config["drives"]] == ["scratch"]
        # Firecracker's own validation answers through the API with its fault message
        with pytest.raises(FirecrackerApiError, match="HTTP 400") as info_err:
            vm.api.request("PUT", "/machine-config", {"vcpu_count": 0, "mem_size_mib": 256})
        assert info_err.value.status == 400
        with pytest.raises(FirecrackerApiError, match="HTTP 400"):
            vm.api.request(
                "PUT",
                "/drives/bad",
                {
                    "drive_id": "bad",
                    "path_on_host": str(tmp_path / "nope"),
                    "is_root_device": False,
                    "is_read_only": True,
                },
            )
        start_s = vm.instance_start()
        assert start_s < 5.0
        assert vm.api.instance_info()["state"] == "Running"
        # configuration is frozen once the guest runs
        with pytest.raises(FirecrackerApiError):
            vm.api.put_machine_config(MachineConfig(vcpu_count=1, mem_size_mib=128))
        pid = vm.pid
        assert pid is not None and vm.running()
        vm.stop(grace_s=1.0)  # SendCtrlAltDel, then kill: the guest here cannot react in time
        assert not vm.running()
        assert not Path(f"/proc/{pid}").exists() or _status(pid).get("State", "").startswith("Z")
    assert vm.leftovers() == []
    assert not vm.workdir.exists()


def test_spawn_failure_is_reported_and_cleaned(firecracker_bin: Path, tmp_path: Path) -> None:
    vm = FirecrackerVM(firecracker_bin, _vm_id(), workdir_base=tmp_path)
    vm.log_path.parent.mkdir(parents=True, exist_ok=True)
    # a socket path that already exists makes firecracker exit at once
    vm.socket_path.mkdir()
    with pytest.raises(VmmError, match="exited"):
        vm.spawn()
    assert vm.leftovers() == []


def test_bad_vm_id_is_refused(firecracker_bin: Path) -> None:
    with pytest.raises(VmmError, match="letters, digits"):
        FirecrackerVM(firecracker_bin, "../escape")


@pytest.mark.requires_root
def test_jailer_chroot_uid_cgroups_and_cleanup(
    firecracker_bin: Path, jailer_bin: Path, guest_kernel: Path, tmp_path: Path
) -> None:
    jail = JailerConfig(
        jailer=jailer_bin,
        chroot_base=tmp_path / "jails",
        memory_bytes=512 << 20,
        pids_limit=32,
        cpu_quota=1.0,
    )
    vm = FirecrackerVM(firecracker_bin, _vm_id(), workdir_base=tmp_path, jailer=jail)
    try:
        vm.spawn()
        root = vm.chroot_dir
        assert root is not None and root.is_dir()
        assert (root / "firecracker").is_file() and (root / "dev" / "kvm").exists()
        assert vm.socket_path == root / "run" / "api.sock"
        pid = vm.pid
        assert pid is not None
        status = _status(pid)
        assert status["Uid"].split()[:2] == ["65534", "65534"]
        assert status["Gid"].split()[:2] == ["65534", "65534"]
        # chrooted (pivot_root in its own mount namespace): it sees the jail, not the host
        assert os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        seen = Path(f"/proc/{pid}/root")
        assert (seen / "firecracker").is_file() and (seen / "run" / "api.sock").exists()
        assert not (seen / "etc").exists() and not (seen / "usr").exists()
        cgroups = vm.cgroup_dirs()
        assert cgroups and all(path.is_dir() for path in cgroups)
        for path in cgroups:
            assert str(pid) in (path / "cgroup.procs").read_text().split()
        if (CGROUP_ROOT / "cgroup.controllers").exists():
            assert (cgroups[0] / "memory.max").read_text().strip() == str(512 << 20)
        else:
            memory = next(path for path in cgroups if path.parts[-3] == "memory")
            assert int((memory / "memory.limit_in_bytes").read_text()) == 512 << 20
            pids = next(path for path in cgroups if path.parts[-3] == "pids")
            assert (pids / "pids.max").read_text().strip() == "32"
        vm.configure(MachineConfig(vcpu_count=1, mem_size_mib=128), guest_kernel, BOOT_ARGS)
        assert (root / "vmlinux").is_file()  # staged into the chroot
        assert vm.api is not None
        assert vm.api.get_vm_config()["boot-source"]["kernel_image_path"] == "/vmlinux"
        vm.instance_start()
        assert vm.api.instance_info()["state"] == "Running"
        assert guest_kernel.exists()
    finally:
        vm.cleanup()
    assert vm.leftovers() == []
    assert not (tmp_path / "jails" / "firecracker").exists()
    for path in vm.cgroup_dirs():
        assert not path.exists()
        assert not path.parent.exists() or any(p.is_dir() for p in path.parent.iterdir())
    assert guest_kernel.exists()  # the hard link went, the kernel stayed


def _spec(label: str) -> SandboxSpec:
    return SandboxSpec(
        image="unused",
        name=f"kt-fc-{uuid.uuid4().hex[:8]}",
        command=["true"],
        labels={LABEL_RUN_ID: label},
        memory_bytes=256 << 20,
        cpus=1.5,
    )


def test_vm_sizing_adds_a_gib_for_the_guest_kernel() -> None:
    config = vm_sizing(_spec("x"))
    assert config.mem_size_mib == 256 + 1024 and config.vcpu_count == 2
    default = vm_sizing(SandboxSpec(image="i", name="n", command=["true"]))
    assert default.mem_size_mib == 5 * 1024 and default.vcpu_count == 1


def test_runtime_records_lists_and_removes_from_another_instance(
    guest_kernel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAROTTE_FIRECRACKER_STATE", str(tmp_path / "state"))
    label = f"fc-{uuid.uuid4().hex[:8]}"
    runtime = FirecrackerRuntime(use_jailer=os.geteuid() == 0)
    monkeypatch.setenv("KAROTTE_JAILER_CHROOT_BASE", str(tmp_path / "jails"))
    sandbox, vm = runtime.launch_vmm(_spec(label), instance_start=True)
    try:
        assert vm.running()
        other = get_runtime("firecracker")  # a fresh instance, as `karotte clean` would have
        found = other.list_sandboxes({LABEL_RUN_ID: label})
        assert [s.id for s in found] == [sandbox.id]
        assert other.list_sandboxes({LABEL_RUN_ID: "someone-else"}) == []
        leftovers = vm.leftovers()
        assert leftovers
        other.remove(found[0])
        deadline = time.monotonic() + 5
        while vm.running() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not vm.running()
        assert [path for path in leftovers if path.exists()] == []
        assert other.list_sandboxes({LABEL_RUN_ID: label}) == []
        other.remove(found[0])  # idempotent
    finally:
        vm.cleanup()
    assert not any(state_dir().glob("*.json"))


def test_start_is_refused_with_the_probe_reason(boot_probe: ProbeResult) -> None:
    runtime = FirecrackerRuntime()
    if boot_probe.ok:
        pytest.skip("guests boot here: start is not refused")
    availability = runtime.availability()
    assert not availability.ok
    assert "do not boot here" in availability.reason
    assert boot_probe.reason in availability.reason
    with pytest.raises(RuntimeUnavailableError, match="cannot start sandbox") as info:
        runtime.start(_spec("refused"))
    assert availability.reason in str(info.value)


def test_guest_boots_where_the_probe_says_so(boot_probe: ProbeResult) -> None:
    if not boot_probe.ok:
        pytest.skip(f"Firecracker guests do not boot here: {boot_probe.reason}")
    assert boot_probe.stage == "booted" and boot_probe.serial_tail
