"""Fixtures of the runtime conformance suite: one parametrized ``runtime`` fixture over every
registered runtime (skipped, with the availability reason, where it does not work here), a tiny
image imported once per engine per session, and ``spec``, which makes a sandbox spec for the
runtime under test (VM runtimes boot an image with a ``python3`` for the guest's init: the base
image plus a ``student`` user)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from karotte.host.runtimes import Runtime, get_runtime, runtime_names
from karotte.host.runtimes.base import LABEL_RUN_ID, SandboxSpec
from karotte.host.runtimes.oci_cli import OciCliRuntime
from karotte.host.vm.machine import VmRuntime

from .tiny_image import make_rootfs_tar

TINY_TAG = "karotte-test/tiny:1"
VM_TINY_TAG = "karotte-test/vm-tiny:1"
VM_TINY_CONTAINERFILE = (
    "FROM karotte/base:bookworm\nRUN useradd --uid 1000 --create-home --home-dir /home/student "
    "--shell /bin/sh student\n"
)
_MARKS = {
    "docker": [pytest.mark.requires_docker],
    "docker:gvisor": [pytest.mark.requires_gvisor],
    "podman": [pytest.mark.requires_podman],
    "qemu": [pytest.mark.requires_qemu, pytest.mark.requires_docker],
    "firecracker": [pytest.mark.requires_kvm, pytest.mark.requires_docker],
    "local": [],
}
# the engine that stores a runtime's images (gVisor runs docker's images)
_ENGINE = {"docker": "docker", "docker:gvisor": "docker", "podman": "podman"}


def runtime_params() -> list[object]:
    return [pytest.param(name, marks=_MARKS.get(name, []), id=name) for name in runtime_names()]


@pytest.fixture(scope="session")
def tiny_rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_rootfs_tar(tmp_path_factory.mktemp("tiny") / "rootfs.tar")


_imported: set[str] = set()


@pytest.fixture(params=runtime_params())
def runtime(request: pytest.FixtureRequest, tiny_rootfs: Path) -> Runtime:
    """A working runtime with the tiny image available (or a skip saying why not)."""
    name = request.param
    engine = get_runtime(name)
    availability = engine.availability()
    if not availability.ok:
        pytest.skip(f"{name}: {availability.reason} (fix: {availability.fix})")
    if isinstance(engine, VmRuntime):
        if "vm" not in _imported:
            _build_vm_tiny(engine, request.config.cache.mkdir("vm-tiny"))
            _imported.add("vm")
        return engine
    if not isinstance(engine, OciCliRuntime):
        pytest.skip(f"{name} has no sandboxes: the launcher runs its harness in-process")
    store = _ENGINE.get(name, name)
    if store not in _imported:
        engine.import_rootfs(tiny_rootfs, TINY_TAG)
        _imported.add(store)
    return engine


def _build_vm_tiny(runtime: VmRuntime, context: Path) -> None:
    from karotte.host.base_image import ensure_base_image

    ensure_base_image(runtime.engine)
    (context / "Containerfile").write_text(VM_TINY_CONTAINERFILE)
    runtime.build(context, context / "Containerfile", VM_TINY_TAG, {})


SpecFactory = Callable[..., SandboxSpec]


@pytest.fixture
def spec(runtime: Runtime, cleanup: str) -> SpecFactory:
    """``spec(command, **fields)``: a sandbox spec of this test for the runtime under test."""
    image = VM_TINY_TAG if isinstance(runtime, VmRuntime) else TINY_TAG

    def make(command: list[str], **kwargs: object) -> SandboxSpec:
        data: dict[str, object] = {
            "image": image,
            "name": f"kt-{cleanup}-{uuid.uuid4().hex[:6]}",
            "command": command,
            "labels": {LABEL_RUN_ID: cleanup},
        }
        data.update(kwargs)
        return SandboxSpec.model_validate(data)

    return make


@pytest.fixture
def run_label() -> str:
    return f"conformance-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def cleanup(runtime: Runtime, run_label: str) -> Iterator[str]:
    """Removes every sandbox of this test, whatever happened."""
    yield run_label
    for sandbox in runtime.list_sandboxes({LABEL_RUN_ID: run_label}):
        runtime.remove(sandbox)


@pytest.fixture
def tmp_out(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    os.chmod(out, 0o777)
    return out
