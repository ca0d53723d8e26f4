"""The `language-toolchains` template: rendering (fast) and, with Docker, its image: built once
per session, then one container per toolchain that grants the toolchain like the task's
pre_hook, builds and runs the scripted solution as the student, grades a good and a wrong
solution with the task's judge, and tries every other toolchain as the student. Plus a few
full `karotte run --fake-model` runs in sandboxes (the build tool over MCP, custody, judge)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import karotte.cli.env  # noqa: F401  (registers the commands)
from karotte.cli import app

KAROTTE = str(Path(sys.executable).parent / "karotte")
TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "src/karotte/templates/language-toolchains"
TAG = f"karotte-test/language-toolchains-{os.getpid()}:latest"

# What the student can use in a task of each toolchain (the grants of TOOLCHAINS.md): its own
# toolchain, plus C where it needs GCC's C compiler (GnuCOBOL compiles via C; GHC compiles a C
# stub into every program). C++ needs cc1plus, which only the cpp toolchain grants.
ALL = [
    "c",
    "cpp",
    "cobol",
    "prolog",
    "pascal",
    "java",
    "clojure",
    "go",
    "rust",
    "haskell",
    "ocaml",
    "common-lisp",
]
REACHABLE = {name: {name} for name in ALL}
REACHABLE["cobol"] = {"cobol", "c"}
REACHABLE["haskell"] = {"haskell", "c"}
# runs at once (2 cores: compilers are CPU-bound, sandbox start-up is not)
PARALLEL = 3


def _render(tmp_path: Path) -> Path:
    target = tmp_path / "env"
    result = CliRunner().invoke(
        app,
        [
            "create-env",
            str(target),
            "--template",
            "default",
            "--template",
            "language-toolchains",
            "--no-lock",
        ],
    )
    assert result.exit_code == 0, result.output
    return target


def test_template_declares_itself() -> None:
    text = (TEMPLATE_DIR / "template.toml").read_text()
    assert 'requires = ["default"]' in text
    assert "description" in text
    listing = CliRunner().invoke(app, ["templates", "list", "--json"])
    assert listing.exit_code == 0, listing.output
    assert "language-toolchains" in listing.output


def test_renders_on_top_of_default(tmp_path: Path) -> None:
    env = _render(tmp_path)
    containerfile = (env / "Containerfile").read_text()
    # the default's image with the toolchains in its system_packages block ...
    for package in ("gnucobol", "gprolog", "fp-compiler", "openjdk-17-jdk-headless", "ghc"):
        assert package in containerfile
    assert containerfile.index("apt-get install") < containerfile.index("useradd")
    # ... locked in the package layer itself, checked before the default's last step
    install = containerfile[containerfile.index("RUN mkdir -p /usr/share/man/man1") :]
    install = install[: install.index("\n\n")]
    assert "apt-get install" in install and "toolchain-components.py lock" in install
    check = containerfile.index("-m environment.toolchains check-locked")
    assert check < containerfile.index("RUN /root/.venv/bin/karotte check --image")
    assert containerfile.rstrip().endswith("RUN /root/.venv/bin/karotte check --image")
    # the fake model keeps the default's example-task script and adds the toolchain tasks
    fake = (env / "src/environment/fake_model.py").read_text()
    assert "def _example_task" in fake and "messages_for" in fake
    for name in ("THIRD_PARTY.md", "TOOLCHAINS.md", "src/environment/tools/__init__.py"):
        assert (env / name).is_file(), name


def test_third_party_lists_the_licenses() -> None:
    text = (TEMPLATE_DIR / "THIRD_PARTY.md").read_text()
    for fact in (
        "GCC Runtime Library Exception",
        "Classpath exception",
        "EPL-1.0",
        "static-linking exception",
        "LGPL-2.1 with the OCaml linking exception",
        "public domain",
        "MIT or Apache-2.0",
        "GPL-3+",
        "Julia",
        "Mojo",
    ):
        assert fact in text, fact


def test_toolchain_choice_is_validated(tmp_path: Path, use_environment: Any) -> None:
    env = _render(tmp_path)
    use_environment(env / "src")
    from environment.toolchains import ToolchainError, get_toolchain  # type: ignore[import-not-found]

    assert [get_toolchain(name).name for name in ALL] == ALL
    with pytest.raises(ToolchainError, match=r"unknown toolchain 'fortran'; choose one of: c, cpp"):
        get_toolchain("fortran")
    with pytest.raises(ToolchainError, match="Debian bookworm has no julia package"):
        get_toolchain("julia")
    with pytest.raises(ToolchainError, match="proprietary"):
        get_toolchain("mojo")


# --- the image ---------------------------------------------------------------------------------


def _docker(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def toolchain_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("toolchains") / "toolchains-env"
    proc = subprocess.run(
        [
            KAROTTE,
            "create-env",
            str(target),
            "--template",
            "default",
            "--template",
            "language-toolchains",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return target


@pytest.fixture(scope="session")
def toolchain_image(toolchain_env: Path) -> Iterator[dict[str, Any]]:
    """Built once per session; its build time and size are recorded in the first test."""
    started = time.monotonic()
    proc = subprocess.run(
        [KAROTTE, "build", "--runtime", "docker", "--tag", TAG, str(toolchain_env)],
        capture_output=True,
        text=True,
        timeout=2400,
    )
    seconds = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-6000:]
    size = int(_docker("image", "inspect", "--format", "{{.Size}}", TAG).stdout.strip())
    yield {"tag": TAG, "build_seconds": seconds, "size_bytes": size}
    _docker("image", "rm", "-f", TAG)


def _in_image(image: str, *command: str) -> Any:
    proc = _docker(
        "run",
        "--rm",
        "--network=none",
        "--workdir",
        "/workdir",
        image,
        "/root/.venv/bin/python",
        "-I",
        *command,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def _fake_model_run(
    image: str, env_dir: Path, out: Path, name: str, runtime: str = "docker"
) -> dict[str, Any]:
    started = time.monotonic()
    proc = subprocess.run(
        [
            KAROTTE,
            "run",
            "--task",
            f"sum-of-squares-{name}",
            "--fake-model",
            "--runtime",
            runtime,
            "--image",
            image,
            "--out",
            str(out),
            "--no-ui",
        ],
        cwd=env_dir,
        capture_output=True,
        text=True,
        timeout=900,
    )
    result: dict[str, Any] = {
        "returncode": proc.returncode,
        "stderr": proc.stderr[-4000:],
        "seconds": time.monotonic() - started,
    }
    if (out / "transcript.json").exists():
        result["transcript"] = json.loads((out / "transcript.json").read_text())
    return result


@pytest.fixture(scope="session")
def selftests(toolchain_image: dict[str, Any]) -> dict[str, Any]:
    """`selftest NAME` for every toolchain, each in its own fresh container, a few at once."""
    with ThreadPoolExecutor(PARALLEL) as pool:
        futures = {
            name: pool.submit(
                _in_image, toolchain_image["tag"], "-m", "environment.toolchains", "selftest", name
            )
            for name in ALL
        }
        return {name: future for name, future in futures.items()}


@pytest.fixture(scope="session")
def fake_model_runs(
    toolchain_image: dict[str, Any],
    toolchain_env: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """`karotte run --fake-model` of every sum-of-squares task in a docker sandbox."""
    root = tmp_path_factory.mktemp("toolchain-runs")
    with ThreadPoolExecutor(PARALLEL) as pool:
        futures = {
            name: pool.submit(
                _fake_model_run, toolchain_image["tag"], toolchain_env, root / name, name
            )
            for name in ALL
        }
        return {name: future for name, future in futures.items()}


@pytest.mark.requires_docker
@pytest.mark.slow
def test_image_builds_and_locks_every_toolchain(
    toolchain_image: dict[str, Any], record_property: Any
) -> None:
    record_property("build_seconds", round(toolchain_image["build_seconds"], 1))
    record_property("size_bytes", toolchain_image["size_bytes"])
    print(
        f"\nlanguage-toolchains image: built in {toolchain_image['build_seconds']:.0f}s, "
        f"{toolchain_image['size_bytes'] / 1e9:.2f} GB"
    )
    assert toolchain_image["size_bytes"] < 6e9
    # as built (before any task's pre_hook), the student reaches no toolchain at all
    probes = _in_image(toolchain_image["tag"], "-m", "environment.toolchains", "probe")
    assert sorted(probes) == sorted(ALL)
    for name, probe in probes.items():
        assert not probe["works"], (name, probe)
        assert "Permission denied" in probe["output"], (name, probe)


@pytest.mark.requires_docker
@pytest.mark.slow
@pytest.mark.parametrize("name", ALL)
def test_toolchain_in_image(selftests: dict[str, Any], name: str) -> None:
    """Granted like the task's pre_hook: the good program builds, runs and scores 1.0 as the
    student, the wrong one 0.0, and only the documented toolchains can be used."""
    report = selftests[name].result()
    build = report["build"]
    assert build["compile_ok"], build
    assert build["run_exit"] == 0 and build["run_output"].strip() == "14", build
    assert report["score_good"] == 1.0, report["score_good_metadata"]
    assert report["score_wrong"] == 0.0, report["score_wrong_metadata"]
    reachable = {other for other, probe in report["probes"].items() if probe["works"]}
    assert reachable == REACHABLE[name], report["probes"]
    # back ends and runtimes, run directly: the assembler and linker only where a front end
    # needs them, the JDK only for Java, the Java compiler module nowhere but in a Java task
    commands = {command for command, code in report["commands"].items() if code == 0}
    expected = set()
    if name not in {"java", "clojure", "go", "common-lisp"}:
        expected |= {"as", "ld"}
    if name == "java":
        expected |= {"jdk-java", "javac-module"}
    assert commands == expected, report["commands"]
    for other in set(ALL) - REACHABLE[name]:
        output = report["probes"][other]["output"]
        # locked: the front end cannot start (EACCES), or gcc finds no cc1plus it may execute
        assert "Permission denied" in output or "cannot execute" in output, (other, output)


@pytest.mark.requires_docker
@pytest.mark.slow
@pytest.mark.parametrize("name", ALL)
def test_fake_model_solves_the_task_in_a_sandbox(
    fake_model_runs: dict[str, Any], name: str
) -> None:
    """The whole path: pre_hook grant, the build tool over MCP as the student in a real sandbox
    (its /tmp is noexec), custody, ProgramOutputJudge."""
    _assert_solved(fake_model_runs[name].result(), name)


@pytest.mark.requires_gvisor
@pytest.mark.slow
@pytest.mark.parametrize("name", ["c", "haskell"])
def test_fake_model_solves_the_task_under_gvisor(
    toolchain_image: dict[str, Any], toolchain_env: Path, tmp_path: Path, name: str
) -> None:
    """gVisor reports no noexec flag for /tmp; the build directory must still be executable."""
    result = _fake_model_run(
        toolchain_image["tag"], toolchain_env, tmp_path / "out", name, runtime="docker:gvisor"
    )
    _assert_solved(result, name)


def _assert_solved(result: dict[str, Any], name: str) -> None:
    assert result["returncode"] == 0, result["stderr"]
    transcript = result["transcript"]
    completed = next(e for e in reversed(transcript["events"]) if e["type"] == "task_completed")
    assert transcript["status"] == "passed", completed
    assert completed["scores"] == [1.0]
    hook = next(e for e in transcript["events"] if e.get("hook") == "pre_hook")
    assert hook["result"]["toolchain"] == name
    (build,) = [
        e
        for e in transcript["events"]
        if e["type"] == "tool_call_completed" and e["name"] == "build"
    ]
    assert not build["is_error"], build["output"]
    assert "[exit code 0]" in build["output"] and "\n14\n" in build["output"]
