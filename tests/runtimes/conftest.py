"""Fixtures of the runtime conformance suite: one parametrized ``runtime`` fixture over every
registered runtime (skipped, with the availability reason, where it does not work here) and a
tiny image imported once per engine per session."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from karotte.host.runtimes import Runtime, get_runtime, runtime_names
from karotte.host.runtimes.base import LABEL_RUN_ID
from karotte.host.runtimes.oci_cli import OciCliRuntime

from .tiny_image import make_rootfs_tar

TINY_TAG = "karotte-test/tiny:1"
_MARKS = {
    "docker": [pytest.mark.requires_docker],
    "docker:gvisor": [pytest.mark.requires_gvisor],
    "podman": [pytest.mark.requires_podman],
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
    if not isinstance(engine, OciCliRuntime):
        pytest.skip(f"{name} has no sandboxes: the launcher runs its harness in-process")
    store = _ENGINE.get(name, name)
    if store not in _imported:
        engine.import_rootfs(tiny_rootfs, TINY_TAG)
        _imported.add(store)
    return engine


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
