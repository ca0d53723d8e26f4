"""create-env: files, manifest, vendored karotte, refusal, rollback; the default env end to end."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from envtemplates import make_template, template_root
from typer.testing import CliRunner

import karotte.cli.env  # noqa: F401  (registers the commands)
from karotte._version import __version__
from karotte.cli import app
from karotte.errors import ConfigError
from karotte.host import create_env as create_env_module
from karotte.host.create_env import create_env
from karotte.host.manifest import BASE_DIR, MANIFEST_FILE, Manifest

__all__ = ["template_root"]


def _simple(template_root: Path) -> None:
    make_template(
        template_root,
        "base",
        {
            "README.md.jinja": "# {{ env_name }}\n",
            "pyproject.toml.jinja": 'dep = "{{ karotte_requirement }}"\n',
        },
    )


def test_creates_files_base_and_manifest(template_root: Path, tmp_path: Path) -> None:
    _simple(template_root)
    target = tmp_path / "new" / "my_env"
    created = create_env(target, ["base"], lock=False)
    assert (target / "README.md").read_text() == "# my_env\n"
    assert (target / "pyproject.toml").read_text() == f'dep = "karotte=={__version__}"\n'
    manifest = json.loads((target / MANIFEST_FILE).read_text())
    assert manifest["env_name"] == "my_env"
    assert manifest["karotte_version"] == __version__
    assert manifest["templates"] == ["base"]
    assert manifest["resolved_templates"] == [
        {"id": "base", "distribution": "karotte", "distribution_version": None}
    ]
    assert manifest["extra_template_packages"] == []
    # the vendored wheel of this karotte, recorded with its hash
    source = manifest["karotte_source"]
    wheel = target / source["path"]
    assert source["kind"] == "wheel" and wheel.name == f"karotte-{__version__}-py3-none-any.whl"
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == source["sha256"]
    # the merge base: a copy of every rendered file, hashes in the manifest
    assert set(manifest["base_files"]) == {"README.md", "pyproject.toml"}
    for rel, digest in manifest["base_files"].items():
        assert hashlib.sha256((target / BASE_DIR / rel).read_bytes()).hexdigest() == digest
    assert Manifest.load(target) == created.manifest
    assert created.lock is None


def test_karotte_from_index_vendors_nothing(template_root: Path, tmp_path: Path) -> None:
    _simple(template_root)
    created = create_env(tmp_path / "e", ["base"], karotte_from_index=True, lock=False)
    assert created.manifest.karotte_source.kind == "index"
    assert created.manifest.karotte_source.path is None
    assert not list((tmp_path / "e").glob(".karotte/*.whl"))


def test_refuses_a_non_empty_directory(template_root: Path, tmp_path: Path) -> None:
    _simple(template_root)
    target = tmp_path / "busy"
    target.mkdir()
    (target / "mine.txt").write_text("keep me")
    with pytest.raises(ConfigError, match=r"is not empty \(mine.txt\)"):
        create_env(target, ["base"], lock=False)
    assert [p.name for p in target.iterdir()] == ["mine.txt"]
    result = CliRunner().invoke(app, ["create-env", str(target), "--no-lock"])
    assert result.exit_code == 2
    assert "not empty" in " ".join(result.output.split())


def test_invalid_names_are_refused(template_root: Path, tmp_path: Path) -> None:
    _simple(template_root)
    with pytest.raises(ConfigError, match="environment name 'My Env' is not valid"):
        create_env(tmp_path / "My Env", ["base"], lock=False)
    assert not (tmp_path / "My Env").exists()
    created = create_env(tmp_path / "My Env", ["base"], name="my-env", lock=False)
    assert created.manifest.env_name == "my-env"


def test_rollback_removes_a_created_directory(template_root: Path, tmp_path: Path) -> None:
    make_template(template_root, "broken", {"a.txt": "fine\n", "z.txt": "{{ undefined_thing }}\n"})
    target = tmp_path / "parent" / "env"
    with pytest.raises(ConfigError, match="undefined_thing"):
        create_env(target, ["broken"], lock=False)
    assert not (tmp_path / "parent").exists()  # the parent was made by create-env too


def test_rollback_empties_an_existing_directory_only(
    template_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _simple(template_root)
    target = tmp_path / "existing"
    target.mkdir()

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError("disk full (simulated)")

    # fail late: after the wheel and the files were written
    monkeypatch.setattr(create_env_module, "write_base", fail)
    with pytest.raises(OSError, match="disk full"):
        create_env(target, ["base"], lock=False)
    assert target.is_dir() and list(target.iterdir()) == []


def test_missing_uv_is_a_warning_not_a_failure(
    template_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _simple(template_root)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    created = create_env(tmp_path / "e", ["base"], karotte_from_index=True, lock=True)
    assert created.lock is not None and not created.lock.ok
    assert any("uv is not on PATH" in w for w in created.warnings)
    assert (tmp_path / "e" / "README.md").exists()


def test_cli_creates_default_env_with_lock(tmp_path: Path) -> None:
    if shutil.which("uv") is None:
        pytest.skip("uv not installed")
    target = tmp_path / "my_env"
    result = CliRunner().invoke(app, ["create-env", str(target)])
    assert result.exit_code == 0, result.output
    lock = (target / "uv.lock").read_text()
    assert 'name = "karotte"' in lock and ".karotte/karotte-" in lock
    assert 'exclude-newer-span = "P7D"' in lock
    assert (target / "src/environment/tasks/example_task/score_answer.py").is_file()


def test_repacked_wheel_matches_the_built_one(tmp_path: Path) -> None:
    """The fallback (no uv, or an installed karotte) packs the same files as `uv build`."""
    import zipfile

    from karotte.host import vendor

    built = vendor.build_karotte_wheel(tmp_path / "built")
    repacked = vendor._repack_installed(tmp_path)
    assert repacked.name == built.name

    def package_files(wheel: Path) -> dict[str, bytes]:
        with zipfile.ZipFile(wheel) as archive:
            return {n: archive.read(n) for n in archive.namelist() if n.startswith("karotte/")}

    assert package_files(repacked) == package_files(built)
    with zipfile.ZipFile(repacked) as archive:
        names = set(archive.namelist())
        record = archive.read(f"karotte-{__version__}.dist-info/RECORD").decode()
        entry_points = archive.read(f"karotte-{__version__}.dist-info/entry_points.txt").decode()
        for line in record.splitlines():
            name, digest, _size = line.split(",")
            assert name in names
            if digest:
                data = archive.read(name)
                expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                assert digest == f"sha256={expected.decode()}"
    assert "karotte = karotte.cli:main" in entry_points


def _run(cmd: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "UV_PROJECT"}}
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_default_env_fresh_machine_flow(tmp_path: Path) -> None:
    """The README flow: create, sync, setup_data, tasks list, and the env's own lint + tests."""
    if shutil.which("uv") is None:
        pytest.skip("uv not installed")
    target = tmp_path / "my_env"
    result = CliRunner().invoke(app, ["create-env", str(target)])
    assert result.exit_code == 0, result.output
    _run(["uv", "sync", "--extra", "dev"], target)
    _run(["uv", "run", "setup_data.py"], target)
    listing = _run(["uv", "run", "karotte", "tasks", "list", "--json"], target)
    assert [row["id"] for row in json.loads(listing.stdout)] == ["example-task"]
    _run(["uv", "run", "just", "create-task", "second-task"], target)
    listing = _run(["uv", "run", "karotte", "tasks", "list", "--json"], target)
    assert [row["id"] for row in json.loads(listing.stdout)] == ["example-task", "second-task"]
    checked = _run(["uv", "run", "karotte", "check"], target)
    assert "2 task(s) load" in checked.stderr
    _run(["uv", "run", "just", "lint"], target)
    tests = _run(["uv", "run", "just", "test"], target)
    assert " passed" in tests.stdout and "failed" not in tests.stdout
