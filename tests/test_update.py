"""karotte update: 3-way merges of the user's files with the current templates."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from envtemplates import make_template, template_root, write
from typer.testing import CliRunner

import karotte.cli.env  # noqa: F401  (registers the commands)
from karotte.cli import app
from karotte.host.create_env import create_env
from karotte.host.manifest import BASE_DIR, Manifest
from karotte.host.update import update_env

__all__ = ["template_root"]

CONFIG_V1 = """\
# settings of {{ env_name }}
alpha = 1
beta = 2
gamma = 3
delta = 4
epsilon = 5
"""


def _env(template_root: Path, tmp_path: Path, **spec: object) -> tuple[Path, Path]:
    template = make_template(
        template_root,
        "base",
        {
            "config.txt.jinja": CONFIG_V1,
            "notes.md": "notes\n",
            "old.txt": "to be dropped by the template\n",
            "keep_deleted/data.txt": "example data\n",
        },
        do_not_recreate_if_deleted=["keep_deleted"],
        **spec,
    )
    env = tmp_path / "env"
    create_env(env, ["base"], karotte_from_index=True, lock=False)
    return template, env


def _actions(report: object) -> dict[str, str]:
    return {c.path: c.action for c in report.changes}  # type: ignore[attr-defined]


def test_user_edit_and_template_change_merge_cleanly(template_root: Path, tmp_path: Path) -> None:
    template, env = _env(template_root, tmp_path)
    config = env / "config.txt"
    config.write_text(config.read_text().replace("alpha = 1", "alpha = 100  # mine"))
    write(template / "config.txt.jinja", CONFIG_V1.replace("epsilon = 5", "epsilon = 50"))
    report = update_env(env, lock=False)
    assert _actions(report)["config.txt"] == "merged"
    assert report.conflicts == []
    text = config.read_text()
    assert "alpha = 100  # mine" in text and "epsilon = 50" in text and "<<<<<<<" not in text
    # the new rendering is the base of the next update
    assert "epsilon = 50" in (env / BASE_DIR / "config.txt").read_text()
    manifest = Manifest.load(env)
    assert set(manifest.base_files) == {
        "config.txt",
        "notes.md",
        "old.txt",
        "keep_deleted/data.txt",
    }
    # a second update changes nothing
    assert update_env(env, lock=False).changes == []


def test_unmodified_files_follow_the_template(template_root: Path, tmp_path: Path) -> None:
    template, env = _env(template_root, tmp_path)
    write(template / "notes.md", "notes v2\n")
    write(template / "new/added.txt", "new file\n")
    report = update_env(env, lock=False)
    assert _actions(report) == {"notes.md": "updated", "new/added.txt": "added"}
    assert (env / "notes.md").read_text() == "notes v2\n"
    assert (env / "new/added.txt").read_text() == "new file\n"


def test_conflicting_edit_gets_markers_and_is_reported(template_root: Path, tmp_path: Path) -> None:
    template, env = _env(template_root, tmp_path)
    config = env / "config.txt"
    config.write_text(config.read_text().replace("gamma = 3", "gamma = 30"))
    write(template / "config.txt.jinja", CONFIG_V1.replace("gamma = 3", "gamma = 300"))
    report = update_env(env, lock=False)
    assert report.conflicts == ["config.txt"]
    text = config.read_text()
    assert "<<<<<<< yours\ngamma = 30\n=======\ngamma = 300\n>>>>>>> template\n" in text
    assert "alpha = 1\n" in text  # the rest of the file is intact
    # the CLI reports it and exits 1
    config.write_text(config.read_text().replace("gamma = 300", "gamma = 3000"))
    write(template / "config.txt.jinja", CONFIG_V1.replace("gamma = 3", "gamma = 301"))
    result = CliRunner().invoke(app, ["update", str(env), "--no-lock"])
    assert result.exit_code == 1
    assert "conflict" in result.output and "config.txt" in result.output


def test_files_the_template_deleted(template_root: Path, tmp_path: Path) -> None:
    template, env = _env(template_root, tmp_path)
    (template / "old.txt").unlink()
    (template / "notes.md").unlink()
    (env / "notes.md").write_text("my own notes\n")  # modified by the user: kept
    report = update_env(env, lock=False)
    assert _actions(report) == {"old.txt": "removed", "notes.md": "kept-modified"}
    assert not (env / "old.txt").exists()
    assert (env / "notes.md").read_text() == "my own notes\n"
    assert "old.txt" not in Manifest.load(env).base_files
    assert not (env / BASE_DIR / "old.txt").exists()


def test_files_the_user_deleted(template_root: Path, tmp_path: Path) -> None:
    _, env = _env(template_root, tmp_path)
    (env / "notes.md").unlink()
    (env / "keep_deleted/data.txt").unlink()
    report = update_env(env, lock=False)
    # recreated by default; not when listed in do_not_recreate_if_deleted
    assert _actions(report) == {
        "notes.md": "recreated",
        "keep_deleted/data.txt": "kept-deleted",
    }
    assert (env / "notes.md").read_text() == "notes\n"
    assert not (env / "keep_deleted/data.txt").exists()


def test_add_template(template_root: Path, tmp_path: Path) -> None:
    _, env = _env(template_root, tmp_path)
    make_template(
        template_root,
        "extra",
        {"notes.md": '{% extends "base/notes.md" %}', "extra.txt": "extra for {{ env_name }}\n"},
        requires=["base"],
    )
    result = CliRunner().invoke(app, ["update", str(env), "--add-template", "extra", "--no-lock"])
    assert result.exit_code == 0, result.output
    assert (env / "extra.txt").read_text() == "extra for env\n"
    manifest = json.loads((env / ".manifest.json").read_text())
    assert manifest["templates"] == ["base", "extra"]
    assert [t["id"] for t in manifest["resolved_templates"]] == ["base", "extra"]


def test_update_refreshes_the_vendored_wheel_and_relocks(
    template_root: Path, tmp_path: Path
) -> None:
    make_template(template_root, "base", {"a.txt": "a\n"})
    env = tmp_path / "env"
    create_env(env, ["base"], lock=False)
    wheel = env / Manifest.load(env).karotte_source.path  # type: ignore[operator]
    wheel.write_bytes(b"stale")
    (env / "pyproject.toml").write_text(
        '[project]\nname = "x"\nversion = "0"\nrequires-python = ">=3.11"\n'
    )
    report = update_env(env, lock=True)
    assert wheel.read_bytes()[:2] == b"PK"
    assert (
        Manifest.load(env).karotte_source.sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest()
    )
    assert report.lock is not None and report.lock.ok, report.lock
    assert (env / "uv.lock").is_file()


def test_not_an_environment(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["update", str(tmp_path), "--no-lock"])
    assert result.exit_code == 2
    assert "not an environment" in " ".join(result.output.split())


@pytest.mark.parametrize("binary", [b"\x00\x01v2", b"\xff\xfe"])
def test_binary_conflict_keeps_the_users_file(
    template_root: Path, tmp_path: Path, binary: bytes
) -> None:
    template, env = _env(template_root, tmp_path)
    (template / "blob.bin").write_bytes(b"\x00v1")
    update_env(env, lock=False)
    (env / "blob.bin").write_bytes(b"\x00mine")
    (template / "blob.bin").write_bytes(binary)
    report = update_env(env, lock=False)
    assert report.conflicts == ["blob.bin"]
    assert (env / "blob.bin").read_bytes() == b"\x00mine"
    assert (env / "blob.bin.template").read_bytes() == binary


@pytest.mark.parametrize("bad", ["../outside.txt", "/etc/passwd", "a/../../b"])
def test_manifest_paths_must_stay_inside(template_root: Path, tmp_path: Path, bad: str) -> None:
    """A tampered manifest cannot make update touch files outside the environment."""
    _, env = _env(template_root, tmp_path)
    victim = tmp_path / "outside.txt"
    victim.write_text("precious\n")
    data = json.loads((env / ".manifest.json").read_text())
    data["base_files"][bad] = "0" * 64
    (env / ".manifest.json").write_text(json.dumps(data))
    result = CliRunner().invoke(app, ["update", str(env), "--no-lock"])
    assert result.exit_code == 2
    assert "is not inside the environment" in " ".join(result.output.split())
    assert victim.read_text() == "precious\n"


def test_relock_records_the_new_wheels_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same version, different karotte code: update vendors the new wheel and the lock follows."""
    import shutil
    import zipfile

    from karotte.host import vendor

    env = tmp_path / "env"
    create_env(env, ["default"], lock=True)
    manifest = Manifest.load(env)
    old_hash = manifest.karotte_source.sha256
    assert f"sha256:{old_hash}" in (env / "uv.lock").read_text()
    changed = tmp_path / "changed" / Path(manifest.karotte_source.path or "").name
    changed.parent.mkdir()
    shutil.copyfile(env / (manifest.karotte_source.path or ""), changed)
    with zipfile.ZipFile(changed, "a") as wheel:
        wheel.writestr("karotte/_changed.txt", "a change in karotte\n")
    monkeypatch.setitem(vendor._cache, manifest.karotte_version, changed)
    report = update_env(env, lock=True)
    assert report.lock is not None and report.lock.ok, report.lock
    new_hash = Manifest.load(env).karotte_source.sha256
    assert new_hash == hashlib.sha256(changed.read_bytes()).hexdigest() != old_hash
    lock = (env / "uv.lock").read_text()
    assert f"sha256:{new_hash}" in lock and f"sha256:{old_hash}" not in lock
