"""``karotte build``: the engine-output parser, the wheelhouse, and real image builds."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from karotte.cli import app
from karotte.errors import RuntimeUnavailableError
from karotte.host.base_image import SOURCE_DATE_EPOCH, BaseImageRecipe, ensure_base_image
from karotte.host.build import (
    BuildLog,
    BuiltImage,
    ImageBuildError,
    build_environment,
    declared_base_image,
    default_tag,
    environment_name,
    karotte_base_suite,
)
from karotte.host.runtimes import get_runtime
from karotte.host.runtimes.docker import DockerRuntime
from karotte.host.vendor import build_karotte_wheel
from karotte.host.wheelhouse import (
    DEPS_DIR,
    ENV_WHEEL_DIR,
    WHEELHOUSE_DIR,
    WheelhouseError,
    WheelTarget,
    prepare_wheelhouse,
)

# Same supply-chain cut-off as Karotte's own lock, so downloads hit the wheel cache.
EXCLUDE_NEWER = "2026-11-25T00:00:00Z"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())


def _uv_lock(env_dir: Path) -> None:
    subprocess.run(["uv", "lock", "--quiet"], cwd=env_dir, check=True, timeout=300)


def _make_env(root: Path, name: str, dependencies: list[str], sources: str = "") -> Path:
    """A minimal environment: pyproject + uv.lock + src/environment + Containerfile."""
    env_dir = root / name
    token = uuid.uuid4().hex
    deps = ", ".join(f'"{dep}"' for dep in dependencies)
    _write(
        env_dir / "pyproject.toml",
        f"""
        [project]
        name = "{name}"
        version = "0.1.0"
        requires-python = ">=3.11"
        dependencies = [{deps}]

        [tool.uv]
        exclude-newer = "{EXCLUDE_NEWER}"
        {sources}
        [build-system]
        requires = ["hatchling>=1.26"]
        build-backend = "hatchling.build"

        [tool.hatch.build.targets.wheel]
        packages = ["src/environment"]
        """,
    )
    _write(env_dir / "src/environment/__init__.py", f'TOKEN = "{token}"\n')
    _write(env_dir / ".dockerignore", ".venv\n")
    _write(
        env_dir / "Containerfile",
        f"""
        ARG BASE_IMAGE=karotte/base:bookworm
        FROM ${{BASE_IMAGE}}
        LABEL dev.karotte.environment="{name}"
        LABEL test-token="{token}"
        COPY .karotte/build/deps/ /tmp/deps/
        RUN python3 -m venv /root/.venv \\
            && /root/.venv/bin/pip install --no-cache-dir --no-index --no-deps /tmp/deps/*.whl \\
            && rm -rf /tmp/deps
        COPY .karotte/build/env/ /tmp/env/
        RUN /root/.venv/bin/pip install --no-cache-dir --no-index --no-deps /tmp/env/*.whl \\
            && rm -rf /tmp/env
        ENV PATH=/root/.venv/bin:${{PATH}}
        RUN python -c "import environment, pydantic; print('installed', environment.TOKEN)"
        """,
    )
    _uv_lock(env_dir)
    return env_dir


# --- the engine-output parser (no engine needed) ----------------------------------------------

DOCKER_FAILURE = """\
Sending build context to Docker daemon  4.096kB
Step 1/3 : FROM karotte/base:bookworm
 ---> 09fb083d772b
Step 2/3 : RUN echo cached
 ---> Using cache
 ---> 1234567890ab
Step 3/3 : RUN echo preparing && ls /missing
 ---> Running in 5b1f2e3d4c5b
preparing
\x1b[91mls: cannot access '/missing': No such file or directory
\x1b[0mThe command '/bin/sh -c echo preparing && ls /missing' returned a non-zero code: 2
"""

PODMAN_FAILURE = """\
STEP 1/2: FROM karotte/base:bookworm
STEP 2/2: RUN make all
/bin/sh: 1: make: not found
Error: building at STEP "RUN make all": while running runtime: exit status 127
"""

BUILDKIT_FAILURE = """\
#4 [1/2] FROM docker.io/karotte/base:bookworm
#4 DONE 0.0s
#5 [2/2] RUN pip install nothing-here
#5 0.512 ERROR: No matching distribution found for nothing-here
#5 ERROR: process "/bin/sh -c pip install nothing-here" did not complete successfully: exit code: 1
"""


def _feed(text: str) -> BuildLog:
    log = BuildLog()
    for line in text.splitlines():
        log.feed(line)
    return log


def test_parser_names_the_failing_docker_step_and_its_output() -> None:
    log = _feed(DOCKER_FAILURE)
    assert [s.number for s in log.steps] == [1, 2, 3]
    assert log.steps[1].cached and not log.steps[2].cached
    assert log.context_bytes == 4096
    message = log.failure_message("t:1", "docker", "")
    assert "failed at step 3/3: RUN echo preparing && ls /missing" in message
    assert "  | preparing" in message
    assert "cannot access '/missing'" in message
    assert "\x1b" not in message
    assert message.splitlines()[-1].startswith("engine: The command")
    assert "Running in" not in message and "cached" not in message


def test_parser_podman_and_buildkit() -> None:
    podman = _feed(PODMAN_FAILURE).failure_message("t:1", "podman", "")
    assert "failed at step 2/2: RUN make all" in podman
    assert "make: not found" in podman
    assert "exit status 127" in podman
    buildkit = _feed(BUILDKIT_FAILURE).failure_message("t:1", "docker", "")
    assert "failed at step 2/2: RUN pip install nothing-here" in buildkit
    assert "No matching distribution found for nothing-here" in buildkit


def test_parser_failure_before_any_step() -> None:
    log = _feed(
        "Error response from daemon: dockerfile parse error line 3: unknown instruction: RUNN"
    )
    message = log.failure_message("t:1", "docker", "")
    assert "before the first step" in message
    assert "unknown instruction: RUNN" in message


def test_base_image_detection(tmp_path: Path) -> None:
    containerfile = tmp_path / "Containerfile"
    containerfile.write_text("ARG BASE_IMAGE=karotte/base:bookworm\nFROM ${BASE_IMAGE}\n")
    assert declared_base_image(containerfile) == "karotte/base:bookworm"
    assert karotte_base_suite("karotte/base:bookworm") == "bookworm"
    assert karotte_base_suite("karotte/base:bookworm-0123abcd") == "bookworm"
    assert karotte_base_suite("debian:bookworm") is None
    containerfile.write_text("FROM debian:bookworm\nRUN true\n")
    assert declared_base_image(containerfile) == "debian:bookworm"
    assert default_tag("My Env_2") == "karotte-env/my-env_2:latest"


# --- the wheelhouse ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def envs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("envs")


@pytest.fixture(scope="module")
def small_env(envs_root: Path) -> Path:
    """An environment depending on pydantic only (a compiled dependency: pydantic-core)."""
    return _make_env(envs_root, "small-env", ["pydantic>=2.10"])


@pytest.mark.slow
def test_wheelhouse_is_complete_and_for_the_images_python(small_env: Path) -> None:
    result = prepare_wheelhouse(small_env, WheelTarget(python_version="3.11"))
    assert not result.reused
    names = sorted(p.name for p in (small_env / WHEELHOUSE_DIR).glob("*.whl"))
    assert names == sorted(result.wheels)
    projects = {name.split("-", 1)[0].lower() for name in names}
    assert {"small_env", "pydantic", "pydantic_core", "typing_extensions"} <= projects
    core = next(name for name in names if name.startswith("pydantic_core-"))
    assert "-cp311-cp311-" in core and "x86_64" in core and "manylinux" in core
    assert not any(("cp312" in n or "cp313" in n or "win" in n or "macos" in n) for n in names)
    for path in (small_env / WHEELHOUSE_DIR).iterdir():
        assert path.stat().st_mtime == SOURCE_DATE_EPOCH
    # the same files, split: dependencies / the environment's own wheel (hard links)
    own = [p.name for p in (small_env / ENV_WHEEL_DIR).iterdir()]
    deps = sorted(p.name for p in (small_env / DEPS_DIR).iterdir())
    assert len(own) == 1 and own[0].startswith("small_env-0.1.0-")
    assert sorted([*own, *deps]) == names
    wheel = small_env / WHEELHOUSE_DIR / own[0]
    assert wheel.stat().st_ino == (small_env / ENV_WHEEL_DIR / own[0]).stat().st_ino


@pytest.mark.slow
def test_wheelhouse_is_reused_until_a_source_changes(small_env: Path) -> None:
    first = prepare_wheelhouse(small_env)
    started = time.monotonic()
    again = prepare_wheelhouse(small_env)
    assert again.reused and again.key == first.key
    assert time.monotonic() - started < 1.0
    source = small_env / "src/environment/extra.py"
    source.write_text("X = 1\n")
    try:
        changed = prepare_wheelhouse(small_env)
        assert not changed.reused and changed.key != first.key
    finally:
        source.unlink()
    assert prepare_wheelhouse(small_env).key == first.key


@pytest.mark.slow
def test_wheelhouse_refuses_a_stale_lock(small_env: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "stale"
    shutil.copytree(small_env, env_dir)
    pyproject = env_dir / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace('"pydantic>=2.10"', '"pydantic>=2.10", "rich"')
    )
    with pytest.raises(WheelhouseError, match="run `uv lock` there"):
        prepare_wheelhouse(env_dir)


@pytest.mark.slow
def test_wheelhouse_takes_karotte_from_the_vendored_wheel(envs_root: Path) -> None:
    vendor_dir = envs_root / "karotte-env" / ".karotte"
    wheel = build_karotte_wheel(vendor_dir)
    env_dir = _make_env(
        envs_root,
        "karotte-env",
        ["karotte"],
        sources=f'[tool.uv.sources]\nkarotte = {{ path = ".karotte/{wheel.name}" }}\n',
    )
    result = prepare_wheelhouse(env_dir)
    assert wheel.name in result.wheels
    assert (env_dir / WHEELHOUSE_DIR / wheel.name).read_bytes() == wheel.read_bytes()
    projects = {name.split("-", 1)[0].lower() for name in result.wheels}
    assert {"karotte_env", "litellm", "pydantic", "typer", "mcp"} <= projects


# --- real builds ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def docker_runtime() -> DockerRuntime:
    engine = get_runtime("docker")
    assert isinstance(engine, DockerRuntime)
    ensure_base_image(engine)  # made once per machine, reused afterwards
    return engine


@pytest.fixture(scope="module")
def test_tag() -> Iterator[str]:
    tag = f"karotte-test/build-{os.getpid()}:latest"
    yield tag
    subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True, check=False)


@pytest.fixture(scope="module")
def first_build(small_env: Path, docker_runtime: DockerRuntime, test_tag: str) -> BuiltImage:
    return build_environment(small_env, docker_runtime, tag=test_tag)


@pytest.mark.requires_docker
@pytest.mark.slow
def test_build_makes_a_working_image(first_build: BuiltImage, small_env: Path) -> None:
    assert first_build.base_image.startswith("karotte/base:bookworm-")
    assert first_build.image_id.startswith("sha256:")
    token = (small_env / "src/environment/__init__.py").read_text().split('"')[1]
    probe = subprocess.run(
        ["docker", "run", "--rm", "--network=none", first_build.tag, "python", "-c",
         "import environment, sys; print(environment.TOKEN, sys.version_info[:2])"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert probe.stdout.split()[0] == token
    assert "(3, 11)" in probe.stdout
    label = subprocess.run(
        ["docker", "image", "inspect", "--format",
         '{{index .Config.Labels "dev.karotte.environment"}}', first_build.tag],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert label == "small-env"


@pytest.mark.requires_docker
@pytest.mark.slow
def test_unchanged_rebuild_is_fast_and_cached(
    first_build: BuiltImage, small_env: Path, docker_runtime: DockerRuntime, test_tag: str
) -> None:
    again = build_environment(small_env, docker_runtime, tag=test_tag)
    assert again.image_id == first_build.image_id
    assert again.wheelhouse_reused
    # ARG and FROM are never "cached"; the 8 steps after them all are
    assert (again.steps, again.cached_steps) == (10, 8)
    assert again.duration_s < 10
    assert again.duration_s < first_build.duration_s / 2, (again, first_build)


@pytest.mark.requires_docker
@pytest.mark.slow
def test_editing_a_task_keeps_the_dependency_layer(
    first_build: BuiltImage, broken_env: Path, docker_runtime: DockerRuntime, test_tag: str
) -> None:
    (broken_env / "src/environment/tasks.py").write_text("EDITED = True\n")
    edited = build_environment(broken_env, docker_runtime, tag=test_tag + "-edited")
    try:
        assert not edited.wheelhouse_reused
        # LABEL, LABEL, COPY deps, RUN pip install deps: cached; the env's wheel and after: not
        assert (edited.steps, edited.cached_steps) == (10, 4)
        assert edited.duration_s < first_build.duration_s / 2, (edited, first_build)
    finally:
        subprocess.run(["docker", "image", "rm", "-f", test_tag + "-edited"], check=False)


@pytest.fixture
def broken_env(small_env: Path, tmp_path: Path) -> Path:
    env_dir = tmp_path / "broken"
    shutil.copytree(small_env, env_dir)
    return env_dir


@pytest.mark.requires_docker
@pytest.mark.slow
def test_failing_step_is_named_with_its_output(
    broken_env: Path, docker_runtime: DockerRuntime, test_tag: str
) -> None:
    with (broken_env / "Containerfile").open("a") as handle:
        handle.write("RUN echo checking-things && ls /definitely-missing && echo unreachable\n")
    with pytest.raises(ImageBuildError) as info:
        build_environment(broken_env, docker_runtime, tag=test_tag + "-broken")
    message = str(info.value)
    assert info.value.step is not None and info.value.step.number == info.value.step.total
    assert "RUN echo checking-things && ls /definitely-missing" in message.splitlines()[0]
    assert "  | checking-things" in message
    assert "/definitely-missing': No such file or directory" in message
    assert "non-zero code: 2" in message
    assert "installed" not in message  # earlier steps' output is not shown

    _register_cli()
    result = CliRunner().invoke(app, ["build", str(broken_env), "--tag", test_tag + "-broken"])
    assert result.exit_code == 1
    assert "failed at step" in _flat(result.output) and "checking-things" in _flat(result.output)


@pytest.mark.requires_docker
@pytest.mark.slow
def test_typo_in_containerfile_is_reported(
    broken_env: Path, docker_runtime: DockerRuntime, test_tag: str
) -> None:
    with (broken_env / "Containerfile").open("a") as handle:
        handle.write("RUNN echo typo\n")
    with pytest.raises(ImageBuildError, match="unknown instruction: RUNN"):
        build_environment(broken_env, docker_runtime, tag=test_tag + "-broken")


def test_stopped_engine_gives_the_fix(tmp_path: Path) -> None:
    env_dir = tmp_path / "env"
    _write(env_dir / "Containerfile", "FROM karotte/base:bookworm\n")
    engine = DockerRuntime(env={"DOCKER_HOST": "unix:///nonexistent"})
    with pytest.raises(RuntimeUnavailableError) as info:
        build_environment(env_dir, engine)
    message = str(info.value)
    assert "DOCKER_HOST=unix:///nonexistent" in message
    assert "dockerd --iptables=false" in message


def test_cli_build_reports_missing_containerfile(tmp_path: Path) -> None:
    _register_cli()
    result = CliRunner().invoke(app, ["build", str(tmp_path)])
    assert result.exit_code == 2
    assert "no Containerfile" in _flat(result.output)


@pytest.mark.requires_podman
@pytest.mark.slow
def test_podman_builds_the_same_environment(small_env: Path, tmp_path: Path) -> None:
    engine = get_runtime("podman")
    availability = engine.availability()
    if not availability.ok:
        pytest.skip(f"podman: {availability.reason}")
    tag = f"karotte-test/build-podman-{os.getpid()}:latest"
    try:
        built = build_environment(small_env, engine, tag=tag)
        assert built.runtime == "podman" and built.steps >= 5
        again = build_environment(small_env, engine, tag=tag)
        assert again.cached_steps >= again.steps - 1
    finally:
        subprocess.run(["podman", "image", "rm", "-f", tag], capture_output=True, check=False)


def _register_cli() -> None:
    from karotte.cli import _register

    _register()


def _flat(text: str) -> str:
    """CLI output with the console's line wrapping undone."""
    return " ".join(text.split())


def test_environment_name_comes_from_the_manifest(tmp_path: Path) -> None:
    env_dir = tmp_path / "some-dir"
    _write(env_dir / "pyproject.toml", '[project]\nname = "environment"\nversion = "0"\n')
    # every environment's package is `environment`: that name must not become the tag
    assert environment_name(env_dir) == "some-dir"
    _write(env_dir / ".manifest.json", '{"env_name": "maze-tasks"}')
    assert environment_name(env_dir) == "maze-tasks"
    assert default_tag(environment_name(env_dir)) == "karotte-env/maze-tasks:latest"


@pytest.mark.requires_docker
@pytest.mark.slow
def test_a_registry_style_base_image_is_used_as_given(
    first_build: BuiltImage, broken_env: Path, docker_runtime: DockerRuntime, test_tag: str
) -> None:
    # No registry here: stand in for one with an image `karotte base` did not name (its plain
    # imported root filesystem: a different image, no labels or ENV, like a registry image).
    recipe = BaseImageRecipe.for_suite()
    rootfs = f"karotte/base-rootfs:{recipe.suite}-{recipe.digest}"
    other = f"example.invalid/debian-with-python:{os.getpid()}"
    subprocess.run(["docker", "tag", rootfs, other], check=True)
    try:
        built = build_environment(
            broken_env, docker_runtime, tag=test_tag + "-other", build_args={"BASE_IMAGE": other}
        )
        assert built.base_image == other
        assert built.image_id != first_build.image_id
    finally:
        subprocess.run(["docker", "image", "rm", "-f", test_tag + "-other", other], check=False)


@pytest.mark.requires_docker
@pytest.mark.slow
def test_no_cache_rebuilds_every_step(
    first_build: BuiltImage, broken_env: Path, docker_runtime: DockerRuntime, test_tag: str
) -> None:
    built = build_environment(broken_env, docker_runtime, tag=test_tag + "-nocache", no_cache=True)
    try:
        assert built.cached_steps == 0
        assert not built.wheelhouse_reused
        assert built.image_id != first_build.image_id
    finally:
        subprocess.run(["docker", "image", "rm", "-f", test_tag + "-nocache"], check=False)
