"""Fixtures for the Firecracker control-plane tests: the real, pinned binaries (installed by
scripts/setup-firecracker.sh) or a skip that says how to get them."""

from __future__ import annotations

from pathlib import Path

import pytest

from karotte.host.boot_probe import ProbeResult, firecracker_boot_probe, kvm_problem
from karotte.host.firecracker.artifacts import Artifact, ArtifactError, find_binary, find_kernel


def _artifact(which: str) -> Artifact:
    try:
        return find_kernel() if which == "kernel" else find_binary(which)
    except ArtifactError as exc:
        pytest.skip(f"{which}: {str(exc).splitlines()[0]} (run scripts/setup-firecracker.sh)")


@pytest.fixture(scope="session")
def firecracker_bin() -> Path:
    return _artifact("firecracker").path


@pytest.fixture(scope="session")
def jailer_bin() -> Path:
    return _artifact("jailer").path


@pytest.fixture(scope="session")
def guest_kernel() -> Path:
    return _artifact("kernel").path


@pytest.fixture(scope="session")
def boot_probe() -> ProbeResult:
    """The (cached) probe: whether a guest really boots on this machine."""
    return firecracker_boot_probe()


@pytest.fixture(scope="session")
def kvm() -> None:
    """Firecracker opens /dev/kvm even to configure a VM: skip where it cannot."""
    if (why := kvm_problem()) is not None:
        pytest.skip(f"Firecracker needs /dev/kvm: {why}")
