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


def _install(name: str, env: dict[str, str] | None = None) -> Path:
    """Install adapter ``name`` into the cache (once per version); skip with the reason."""
    adapter = get_adapter(name)
    if env is None and (shutil.which("npm") is None or shutil.which("node") is None):
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
        env={**os.environ, **(env or {})},
    )
    problem = adapter.check_installed(prefix)
    if proc.returncode != 0 or problem:
        shutil.rmtree(prefix, ignore_errors=True)
        pytest.skip(
            f"{name}: installing {adapter.package} {adapter.version} failed (package registry "
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


def python_312() -> str | None:
    """A Python >= 3.12 on this machine (Debian 12 has 3.11): $KAROTTE_TEST_PYTHON, one on PATH,
    or a pyenv build."""
    candidates = [os.environ.get("KAROTTE_TEST_PYTHON", "")]
    candidates += [shutil.which(n) or "" for n in ("python3.14", "python3.13", "python3.12")]
    candidates += sorted(
        str(p) for p in Path("/root/.pyenv/versions").glob("3.1[2-9]*/bin/python3")
    )
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [candidate, "-c", "import sys; sys.exit(sys.version_info < (3, 12))"],
            capture_output=True,
            timeout=30,
            check=False,
        )
        if probe.returncode == 0:
            return candidate
    return None


def reachable_by_others(path: str) -> bool:
    """Whether another user can execute ``path`` (every parent directory traversable)."""
    real = Path(os.path.realpath(path))
    return all(p.stat().st_mode & 0o001 for p in [real, *real.parents])


@pytest.fixture(scope="session")
def mistral_vibe_dir() -> tuple[Path, bool]:
    """The Vibe install and whether a student can run it (its Python must be reachable)."""
    python = python_312()
    if python is None:
        pytest.skip(
            "mistral-vibe: no Python >= 3.12 on this machine (Debian 12 ships 3.11; set "
            "KAROTTE_TEST_PYTHON): the Mistral Vibe adapter is not exercised"
        )
    return _install("mistral-vibe", {"KAROTTE_PYTHON": python}), reachable_by_others(python)


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
