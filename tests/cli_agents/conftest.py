"""Fixtures for CLI agent tests: the real CLIs installed once (cached across sessions), a
throwaway student user, a stub model endpoint.

The CLIs come from npm with the adapters' own install commands, into
``$KAROTTE_TEST_CLI_AGENTS_DIR`` (default ``/var/tmp/karotte-test-cli-agents``, which the
student can traverse). Without node/npm, or when the registry is unreachable, the tests that
need a CLI skip and say why.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from karotte.sandbox.cli_agents.base import AGENTS_DIR_ENV
from karotte.sandbox.cli_agents.registry import get_adapter
from karotte.sandbox.confinement.demote import Identity, student_identity
from karotte.sandbox.confinement.processes import kill_student_processes, processes_of_uid

CACHE = Path(os.environ.get("KAROTTE_TEST_CLI_AGENTS_DIR", "/var/tmp/karotte-test-cli-agents"))
INSTALL_TIMEOUT_S = 600


def _install(name: str) -> Path:
    """Install adapter ``name`` into the cache (once per version); skip with the reason."""
    adapter = get_adapter(name)
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip(f"{name}: needs node and npm (run scripts/setup-cli-agents.sh)")
    root = CACHE / adapter.version
    prefix = root / adapter.name
    if adapter.check_installed(prefix) is None:
        return root
    root.mkdir(parents=True, exist_ok=True)
    for part in [root, *root.parents]:
        if part == Path("/"):
            break
        part.chmod(part.stat().st_mode | 0o755 if part in (root, CACHE) else part.stat().st_mode)
    script = " && ".join(adapter.install_commands(str(prefix)))
    proc = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    problem = adapter.check_installed(prefix)
    if proc.returncode != 0 or problem:
        shutil.rmtree(prefix, ignore_errors=True)
        pytest.skip(
            f"{name}: installing {adapter.package}@{adapter.version} failed (npm registry "
            f"unreachable?): {(proc.stderr or problem or '').strip()[-400:]}"
        )
    subprocess.run(["chmod", "-R", "go-w,go+rX", str(prefix)], check=True)
    return root


@pytest.fixture(scope="session")
def claude_code_dir() -> Path:
    return _install("claude-code")


@pytest.fixture(scope="session")
def codex_dir() -> Path:
    return _install("codex")


@pytest.fixture
def agents_from(monkeypatch: pytest.MonkeyPatch) -> object:
    def use(root: Path) -> None:
        monkeypatch.setenv(AGENTS_DIR_ENV, str(root))

    return use


def _free_uid() -> int:
    import pwd

    for _ in range(50):
        uid = 200_000 + secrets.randbelow(700_000)
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise RuntimeError("no free uid found")


@pytest.fixture
def student(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Identity]:
    """A fresh user with a random high uid, removed (with every process of it) afterwards."""
    if os.geteuid() != 0:
        pytest.skip("requires_root: needs root to create a throwaway user")
    uid = _free_uid()
    name = f"kca{uid}"
    home = tmp_path_factory.mktemp(f"home-{uid}")
    subprocess.run(["groupadd", "-g", str(uid), name], check=True, capture_output=True, timeout=30)
    subprocess.run(
        ["useradd", "-u", str(uid), "-g", str(uid), "-M", "-d", str(home), "-s", "/bin/sh", name],
        check=True,
        capture_output=True,
        timeout=30,
    )
    os.chown(home, uid, uid)
    os.chmod(home, 0o755)
    for parent in home.parents:
        if str(parent).startswith("/tmp/pytest-of-") or parent == home.parent:
            os.chmod(parent, os.stat(parent).st_mode | 0o711)
    identity = student_identity(name)
    try:
        yield identity
    finally:
        if processes_of_uid(uid):
            kill_student_processes(uid, uid, timeout_s=10)
        subprocess.run(["userdel", name], check=False, capture_output=True, timeout=30)
        subprocess.run(["groupdel", name], check=False, capture_output=True, timeout=30)
        shutil.rmtree(home, ignore_errors=True)
