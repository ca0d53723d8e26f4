"""Each plugin group, with real packages installed (``uv pip install``) in temporary venvs:
the worked example in ``examples/`` and a fixture package whose plugins break in every way."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "karotte-example-plugin"
BROKEN = ROOT / "tests" / "fixtures" / "plugins" / "broken-plugin"

pytestmark = pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")


def make_venv(where: Path, package: Path) -> Path:
    """A venv that sees this checkout's environment (a .pth line) and has ``package`` really
    installed, so its entry points are discovered like any installed plugin's."""
    subprocess.run(
        ["uv", "venv", "--quiet", "--python", sys.executable, str(where)], check=True, timeout=120
    )
    python = where / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # addsitedir, not a plain path line: the checkout's own .pth files (an editable karotte)
    # must be processed too
    project_site = sysconfig.get_paths()["purelib"]
    Path(purelib, "_karotte_checkout.pth").write_text(
        f"import site; site.addsitedir({project_site!r})\n"
    )
    subprocess.run(
        ["uv", "pip", "install", "--quiet", "--python", str(python), "--no-deps", str(package)],
        check=True,
        timeout=300,
    )
    return python


def run_py(
    python: Path, code: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("EXAMPLE_")}
    full_env.pop("VIRTUAL_ENV", None)
    full_env.update(env or {})
    full_env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    return subprocess.run(
        [str(python), "-c", code],
        capture_output=True, text=True, timeout=120, env=full_env, cwd=cwd, check=False,
    )  # fmt: skip


def karotte(python: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    code = (
        f"import sys; sys.argv = ['karotte', *{list(args)!r}]\nfrom karotte.cli import main\nmain()"
    )
    return run_py(python, code, cwd=cwd)


def hook_json(python: Path, expr: str, env: dict[str, str] | None = None) -> object:
    proc = run_py(
        python, f"import json\nfrom karotte import plugins\nprint(json.dumps({expr}))", env=env
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(tmp_path_factory.mktemp("example") / "venv", EXAMPLE)


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(tmp_path_factory.mktemp("broken") / "venv", BROKEN)


# ---- the worked example: every hook does its job ------------------------------------------------
def test_the_example_is_listed_in_every_group(example: Path) -> None:
    found = hook_json(example, "[p.group for p in plugins.installed()]")
    assert isinstance(found, list)
    assert set(found) >= {
        "karotte.cli",
        "karotte.run_config_preprocessors",
        "karotte.default_proxy_url",
        "karotte.harness_secret_env",
        "karotte.default_hardware",
        "karotte.hardware_limits",
        "karotte.container_run_args",
    }


def test_a_cli_plugin_is_a_subcommand(example: Path) -> None:
    proc = karotte(example, "example", "hello", "Ada")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "hello Ada from the example platform"
    listing = karotte(example, "--help")
    assert "example" in listing.stdout and "Commands of the example platform" in listing.stdout


def test_run_config_preprocessors_rewrite_the_config(example: Path) -> None:
    result = hook_json(
        example,
        "plugins.preprocess_run_config(__import__('karotte').EvaluationRunConfig("
        "task_id='t', max_turns=500)).model_dump(mode='json')",
    )
    assert isinstance(result, dict)
    assert result["extra_config"] == {"platform": "example"}
    assert result["max_turns"] == 200


def test_the_default_proxy_url_comes_from_the_plugin(example: Path) -> None:
    assert hook_json(example, "plugins.default_proxy_url()") is None
    url = "http://127.0.0.1:9999"
    assert hook_json(example, "plugins.default_proxy_url()", {"EXAMPLE_PROXY_URL": url}) == url


def test_harness_secret_env_never_reaches_the_student(example: Path) -> None:
    env = hook_json(
        example,
        "__import__('karotte.sandbox.confinement.demote', fromlist=['x']).demoted_env("
        "None, extra={'EXAMPLE_PLATFORM_TOKEN': 's3cret', 'HARMLESS': '1'})",
    )
    assert isinstance(env, dict)
    assert "EXAMPLE_PLATFORM_TOKEN" not in env
    assert env["HARMLESS"] == "1"


def test_default_hardware_and_limits_shape_the_sandbox(example: Path, tmp_path: Path) -> None:
    # a task that cannot be imported on the host has no required_hardware: the plugin's default
    # applies (2 CPUs, 2 GiB), then the platform's caps (8 GiB memory, 20 GiB disk)
    code = (
        "from karotte import EvaluationRunConfig\n"
        "from karotte.host.launcher import Launcher, LaunchOptions\n"
        "launcher = Launcher(EvaluationRunConfig(task_id='not-importable-here'),\n"
        f"    LaunchOptions(runtime='docker', env_dir={str(tmp_path)!r}, ui=False))\n"
        "print(list(launcher.hardware()))\n"
        "launcher = Launcher(EvaluationRunConfig(task_id='not-importable-here'),\n"
        f"    LaunchOptions(runtime='docker', env_dir={str(tmp_path)!r}, ui=False,\n"
        "    memory_bytes=64 << 30, disk_bytes=100 << 30))\n"
        "print(list(launcher.hardware()))\n"
    )
    proc = run_py(example, code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    default, capped = (json.loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    assert default[0] == 2 << 30 and default[1] == 2
    assert capped[0] == 8 << 30
    assert capped[3] <= 20 << 30


def test_container_run_args_reach_the_engine_command(example: Path) -> None:
    code = (
        "from karotte import plugins\n"
        "from karotte.host.runtimes.base import SandboxSpec\n"
        "from karotte.host.runtimes.docker import DockerRuntime\n"
        "args = plugins.container_run_args('plain-task', 'docker')\n"
        "spec = SandboxSpec(image='img', name='n', command=['true'], extra_args=args)\n"
        "argv, _ = DockerRuntime().run_command(spec)\n"
        "print(argv)\n"
        "try:\n"
        "    plugins.container_run_args('gpu-train', 'podman')\n"
        "except plugins.PluginError as exc:\n"
        "    print('refused:', exc)\n"
    )
    proc = run_py(example, code)
    assert proc.returncode == 0, proc.stderr
    argv_line, refused = proc.stdout.strip().splitlines()[-2:]
    argv = eval(argv_line)
    assert argv[argv.index("--") - 2 : argv.index("--")] == ["--label", "platform=example"]
    assert "refused the launch: GPU tasks run on docker only here, not on podman" in refused


# ---- broken plugins: skipped with a warning, except those that guard a run -----------------------
def test_broken_cli_plugins_are_skipped_and_builtins_are_never_replaced(broken: Path) -> None:
    listing = karotte(broken, "--help")
    assert listing.returncode == 0, listing.stderr
    assert "extra" in listing.stdout
    assert "ghost" not in listing.stdout and "notatyper" not in listing.stdout
    assert "'run' is skipped: it would replace a built-in command" in listing.stderr
    assert "'ghost'" in listing.stderr and "does not load" in listing.stderr
    assert "'notatyper' is skipped" in listing.stderr
    assert karotte(broken, "extra", "ping").stdout.strip() == "pong"
    run_help = karotte(broken, "run", "--help")
    assert "Run a task" in run_help.stdout and "hijack" not in run_help.stdout


def test_broken_hooks_are_skipped_and_the_others_still_apply(broken: Path) -> None:
    code = (
        "import json\nfrom karotte import plugins\n"
        "print(json.dumps({'secrets': sorted(plugins.harness_secret_env()),\n"
        "  'hardware': plugins.default_hardware(),\n"
        "  'limits': plugins.hardware_limits(None).model_dump(),\n"
        "  'proxy': plugins.default_proxy_url(),\n"
        "  'warnings': plugins.plugin_warnings()}))"
    )
    proc = run_py(broken, code)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["secrets"] == ["BROKEN_FIXTURE_SECRET"]
    assert found["hardware"] is None
    assert found["limits"]["memory_gib"] == 1 and found["limits"]["passthrough"] == ["/dev/null"]
    assert found["proxy"] is None
    warnings = "\n".join(found["warnings"])
    assert "'raises' in karotte.harness_secret_env is skipped" in warnings
    assert "'wrong' in karotte.default_hardware returned no valid Hardware" in warnings
    assert "'b-raises' in karotte.hardware_limits is skipped" in warnings
    assert "'a-number' in karotte.default_proxy_url returned int" in warnings


def test_a_failing_preprocessor_stops_the_run_before_anything_starts(
    broken: Path, tmp_path: Path
) -> None:
    transcript = tmp_path / "out" / "transcript.json"
    proc = karotte(
        broken, "run", "--runtime", "local", "--fake-model", "--task", "anything",
        "--transcript", str(transcript), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode != 0
    stderr = " ".join(proc.stderr.split())  # the console wraps long lines
    assert "'20-raises'" in stderr and "failed, so the run stops" in stderr
    assert "this plugin is broken" in stderr
    assert not transcript.exists()


def test_a_refusing_container_run_args_plugin_refuses_the_launch(broken: Path) -> None:
    proc = run_py(
        broken,
        "from karotte import plugins\n"
        "try:\n    plugins.container_run_args('t', 'docker')\n"
        "except plugins.PluginError as exc:\n    print('refused:', exc)\n",
    )
    assert "refused the launch: quota exhausted for this team" in proc.stdout, proc.stderr


def test_plugins_list_shows_each_plugin_and_why_a_broken_one_does_not_load(broken: Path) -> None:
    proc = karotte(broken, "plugins", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {(r["group"], r["name"]): r for r in json.loads(proc.stdout)}
    assert rows[("karotte.cli", "extra")]["loads"] is True
    ghost = rows[("karotte.cli", "ghost")]
    assert ghost["loads"] is False and "ModuleNotFoundError" in ghost["problem"]
    assert rows[("karotte.run_config_preprocessors", "20-raises")]["distribution"] == (
        "karotte-broken-plugin"
    )


def test_run_args_that_would_undo_confinement_are_refused(tmp_path: Path) -> None:
    # a second plugin in the same venv asks for --privileged: the launch is refused
    pkg = tmp_path / "evil"
    (pkg / "src" / "karotte_evil_plugin").mkdir(parents=True)
    (pkg / "src" / "karotte_evil_plugin" / "__init__.py").write_text(
        "def args(task, runtime):\n    return ['--label', 'x=y', '--privileged']\n"
    )
    (pkg / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling==1.27.0"]\nbuild-backend = "hatchling.build"\n'
        '[project]\nname = "karotte-evil-plugin"\nversion = "0.0.1"\n'
        '[project.entry-points."karotte.container_run_args"]\nevil = "karotte_evil_plugin:args"\n'
        '[tool.hatch.build.targets.wheel]\npackages = ["src/karotte_evil_plugin"]\n'
    )
    python = make_venv(tmp_path / "venv", pkg)
    proc = run_py(
        python,
        "from karotte import plugins\n"
        "try:\n    print(plugins.container_run_args('t', 'docker'))\n"
        "except plugins.PluginError as exc:\n    print('refused:', exc)\n",
    )
    assert "refused:" in proc.stdout and "'--privileged'" in proc.stdout, proc.stderr
