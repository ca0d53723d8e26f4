"""Shared fixtures and the skip rules for marked tests (skips always say why)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

FIXTURES = Path(__file__).parent / "fixtures"


@cache
def _docker_reason() -> str | None:
    if shutil.which("docker") is None:
        return "docker CLI not installed (run scripts/setup-engines.sh)"
    probe = subprocess.run(
        ["docker", "info", "--format", "{{.ServerVersion}}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        return f"docker engine not running: {probe.stderr.strip()[:200]}"
    return None


def _skip_reason(marker: str) -> str | None:
    if marker == "requires_root":
        return None if os.geteuid() == 0 else "needs root"
    if marker in ("requires_docker", "requires_gvisor"):
        return _docker_reason()
    if marker == "requires_podman":
        return None if shutil.which("podman") else "podman not installed (scripts/setup-engines.sh)"
    if marker == "requires_qemu":
        return (
            None
            if shutil.which("qemu-system-x86_64")
            else "qemu not installed (scripts/setup-vm.sh)"
        )
    if marker == "requires_browser":
        return (
            None
            if shutil.which("chromium")
            else "chromium not installed (scripts/setup-browser.sh)"
        )
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker in (
        "requires_root",
        "requires_docker",
        "requires_podman",
        "requires_gvisor",
        "requires_qemu",
        "requires_browser",
    ):
        if item.get_closest_marker(marker) is not None:
            reason = _skip_reason(marker)
            if reason:
                pytest.skip(f"{marker}: {reason}")


def _purge_environment_modules() -> None:
    for name in list(sys.modules):
        if name == "environment" or name.startswith("environment."):
            del sys.modules[name]


@pytest.fixture
def use_environment() -> Iterator[object]:
    """Make a fixture environment importable as the ``environment`` package."""
    added: list[str] = []

    def activate(root: Path) -> Path:
        _purge_environment_modules()
        sys.path.insert(0, str(root))
        added.append(str(root))
        return root

    yield activate
    for entry in added:
        if entry in sys.path:
            sys.path.remove(entry)
    _purge_environment_modules()
