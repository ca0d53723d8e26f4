"""The base image karotte/base:bookworm: recipe, mmdebstrap errors, and the real image.

The real image is made at most once per machine (``ensure_base_image`` reuses it when its
recipe tag exists); these tests never force a rebuild.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from karotte.cli import app
from karotte.errors import RuntimeUnavailableError
from karotte.host.base_image import (
    LABEL_BASE_RECIPE,
    MMDEBSTRAP_FIX,
    BaseImageError,
    BaseImageRecipe,
    BaseImageResult,
    build_rootfs,
    ensure_base_image,
)
from karotte.host.runtimes import get_runtime
from karotte.host.runtimes.docker import DockerRuntime


def _register_cli() -> None:
    from karotte.cli import _register

    _register()


def _flat(text: str) -> str:
    """CLI output with the console's line wrapping undone."""
    return " ".join(text.split())


@pytest.fixture(scope="session")
def docker_base_image() -> BaseImageResult:
    """karotte/base:bookworm in docker, made once (or found current)."""
    return ensure_base_image(get_runtime("docker"))


def test_recipe_hash_names_the_content() -> None:
    recipe = BaseImageRecipe.for_suite("bookworm")
    assert recipe.tag == "karotte/base:bookworm"
    assert recipe.pinned_tag == f"karotte/base:bookworm-{recipe.digest}"
    assert BaseImageRecipe.for_suite("bookworm").digest == recipe.digest  # stable
    more = recipe.model_copy(update={"packages": (*recipe.packages, "git")})
    assert more.digest != recipe.digest
    later = recipe.model_copy(update={"source_date_epoch": recipe.source_date_epoch + 1})
    assert later.digest != recipe.digest
    assert BaseImageRecipe.for_suite("trixie").python_version == "3.13"


def test_recipe_is_minimal_and_pinned() -> None:
    recipe = BaseImageRecipe.for_suite("bookworm")
    argv = recipe.mmdebstrap_command(Path("/tmp/out.tar"))
    assert "--variant=minbase" in argv
    included = next(a for a in argv if a.startswith("--include=")).split("=", 1)[1].split(",")
    for needed in ("python3", "python3-venv", "bash", "iproute2", "nftables", "passwd"):
        assert needed in included
    assert "sudo" not in included
    # the suite is pinned on the command line and in every apt source
    assert argv[-5:-3] == ["bookworm", "/tmp/out.tar"]
    assert all(" bookworm" in source for source in argv[-3:])


def test_missing_mmdebstrap_names_the_apt_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    with pytest.raises(BaseImageError) as info:
        build_rootfs(BaseImageRecipe.for_suite(), tmp_path / "rootfs.tar", lambda _: None)
    message = str(info.value)
    assert MMDEBSTRAP_FIX in message
    assert "BASE_IMAGE=debian:bookworm" in message
    assert not (tmp_path / "rootfs.tar").exists()


def test_unknown_suite_is_refused() -> None:
    with pytest.raises(BaseImageError, match="unknown Debian suite"):
        ensure_base_image(DockerRuntime(env={"DOCKER_HOST": "unix:///nonexistent"}), "potato")


def test_stopped_engine_gives_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = DockerRuntime(env={"DOCKER_HOST": "unix:///nonexistent"})
    with pytest.raises(RuntimeUnavailableError) as info:
        ensure_base_image(engine)
    assert "dockerd" in str(info.value) and "fix:" in str(info.value)

    _register_cli()
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent")
    result = CliRunner().invoke(app, ["base", "--runtime", "docker"])
    assert result.exit_code == 2
    assert "not answering" in _flat(result.output) and "dockerd" in _flat(result.output)


@pytest.mark.requires_docker
@pytest.mark.slow
def test_base_image_has_python_311_and_no_uid_1000(docker_base_image: BaseImageResult) -> None:
    probe = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--network=none",
            docker_base_image.tag,
            "sh",
            "-c",
            "python3 -c 'import sys, venv, ensurepip; print(sys.version_info[:2])'; "
            "getent passwd 1000 || echo NO-UID-1000; ls /var/lib/apt/lists | grep -c _ || true; "
            "command -v sudo || echo NO-SUDO",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    lines = probe.stdout.split()
    assert "(3," in probe.stdout and "11)" in probe.stdout
    assert "NO-UID-1000" in lines
    assert "NO-SUDO" in lines
    assert lines[-2] == "0"  # apt lists cleaned
    label = subprocess.run(
        [
            "docker",
            "image",
            "inspect",
            "--format",
            f'{{{{index .Config.Labels "{LABEL_BASE_RECIPE}"}}}}',
            docker_base_image.tag,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert label == docker_base_image.recipe_hash


@pytest.mark.requires_docker
@pytest.mark.slow
def test_current_base_image_is_reused(docker_base_image: BaseImageResult) -> None:
    started = time.monotonic()
    again = ensure_base_image(get_runtime("docker"))
    assert again.built is False
    assert again.pinned_tag == docker_base_image.pinned_tag
    assert time.monotonic() - started < 5

    _register_cli()
    result = CliRunner().invoke(app, ["base", "--runtime", "docker"])
    assert result.exit_code == 0, result.output
    assert "up to date" in _flat(result.output)
