"""The firecracker guest path end to end through the VM layer, on a host where guests do not
boot (here): a real sandbox (root drive from a docker image, scratch/io/out drives, the
supervisor running firecracker, jailed when root) whose guest never answers is killed by the
boot watchdog and reported with the console's last lines; remove leaves nothing. Where guests
boot, the conformance suite covers the runtime instead."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from karotte.host.boot_probe import ProbeResult
from karotte.host.runtimes.base import LABEL_RUN_ID, SandboxSpec
from karotte.host.runtimes.docker import DockerRuntime
from karotte.host.runtimes.firecracker import FirecrackerGuests, jail_cgroup_dirs

pytestmark = [pytest.mark.slow, pytest.mark.requires_docker, pytest.mark.usefixtures("kvm")]

TINY_TAG = "karotte-test/tiny:1"


def test_a_guest_that_never_answers_is_killed_and_reported(
    boot_probe: ProbeResult,
    guest_kernel: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if boot_probe.ok:
        pytest.skip("guests boot here: the conformance suite runs the firecracker runtime")
    from runtimes.tiny_image import make_rootfs_tar  # tests/ is on sys.path (rootdir import)

    docker = DockerRuntime()
    if not docker.image_exists(TINY_TAG):
        docker.import_rootfs(make_rootfs_tar(tmp_path / "rootfs.tar"), TINY_TAG)
    monkeypatch.setenv("KAROTTE_VM_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("KAROTTE_VM_BOOT_TIMEOUT_S", "6")
    label = f"fc-{uuid.uuid4().hex[:8]}"
    guests = FirecrackerGuests()
    spec = SandboxSpec(
        image=TINY_TAG,
        name=f"kt-fcg-{uuid.uuid4().hex[:6]}",
        command=["echo", "never printed"],
        labels={LABEL_RUN_ID: label},
        memory_bytes=256 << 20,
        disk_bytes=64 << 20,
    )
    sandbox = guests.start(spec)
    try:
        directory = guests.sandbox_dir(spec.name)
        assert [s.id for s in guests.list_sandboxes({LABEL_RUN_ID: label})] == [sandbox.id]
        logs: list[str] = []
        lines = list(guests.stream_output(sandbox, on_stderr=logs.append))
        assert lines == []  # the command never ran
        assert guests.wait(sandbox, timeout_s=60) == 137
        assert any("did not start within 6 s" in line for line in logs), logs
        # lines from the serial console (kernel messages, if the guest printed any) follow it
        assert all(line.startswith("[vm") for line in logs), logs
        # the VMM was configured from its file (in the jail when root) and ran
        jail_root = directory / "jail" / "firecracker" / FirecrackerGuests.vm_id_of(directory)
        if guests.use_jailer:
            assert (jail_root / "root" / "firecracker.json").is_file()
        else:
            assert (directory / "firecracker.json").is_file()
        assert (directory / "vmm.pid").is_file() and (directory / "exit.json").is_file()
    finally:
        guests.remove(sandbox)
    assert not directory.exists()
    assert guests.list_sandboxes({LABEL_RUN_ID: label}) == []
    if guests.use_jailer:
        assert jail_cgroup_dirs(FirecrackerGuests.vm_id_of(directory)) == []
