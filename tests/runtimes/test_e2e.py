"""End to end: an environment from the ``default`` template, built once per engine per session,
``karotte run`` on docker, podman and docker:gvisor with the fake model; parallel runs; errors;
no leaked sandboxes after Ctrl-C, SIGTERM or SIGKILL of a launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from karotte.host import reaper
from karotte.host.runtimes import Runtime, get_runtime
from karotte.host.runtimes.base import LABEL_LAUNCHER_PID, LABEL_RUN_ID

pytestmark = pytest.mark.slow

KAROTTE = str(Path(sys.executable).parent / "karotte")
TASK = "example-task"
EXPECTED_SCORES = [1.0, 1.0]
E2E_TAG = "karotte-test/e2e-default:latest"
_RUNTIME_MARKS = {
    "docker": pytest.mark.requires_docker,
    "podman": pytest.mark.requires_podman,
    "docker:gvisor": pytest.mark.requires_gvisor,
}


def _available(name: str) -> Runtime:
    runtime = get_runtime(name)
    availability = runtime.availability()
    if not availability.ok:
        pytest.skip(f"{name}: {availability.reason} (fix: {availability.fix})")
    return runtime


@pytest.fixture(scope="session")
def env_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An environment made by `karotte create-env` from the default template (once)."""
    target = tmp_path_factory.mktemp("e2e") / "e2e-env"
    proc = subprocess.run(
        [KAROTTE, "create-env", str(target)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    return target


_built: dict[str, str] = {}


def _image(env_dir: Path, runtime_name: str) -> str:
    """Build the environment once per engine per session (gVisor runs docker's images)."""
    engine = "docker" if runtime_name.startswith("docker") else runtime_name
    if engine not in _built:
        proc = subprocess.run(
            [KAROTTE, "build", "--runtime", engine, "--tag", E2E_TAG, str(env_dir)],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        _built[engine] = E2E_TAG
    return _built[engine]


def _run(
    env_dir: Path,
    out: Path,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KAROTTE, "run", "--task", TASK, "--fake-model", "--out", str(out), "--no-ui", *args],
        cwd=env_dir,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _transcript(path: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads(path.read_text())
    return data


def _completed(transcript: dict[str, object]) -> dict[str, object]:
    events = transcript["events"]
    assert isinstance(events, list)
    return next(e for e in reversed(events) if e["type"] == "task_completed")


@pytest.mark.parametrize(
    "runtime_name",
    [pytest.param(n, marks=m, id=n) for n, m in _RUNTIME_MARKS.items()],
)
def test_example_task_passes(env_dir: Path, tmp_path: Path, runtime_name: str) -> None:
    runtime = _available(runtime_name)
    image = _image(env_dir, runtime_name)
    out = tmp_path / "out"
    proc = _run(env_dir, out, "--runtime", runtime_name, "--image", image)
    assert proc.returncode == 0, proc.stderr[-4000:]
    transcript = _transcript(out / "transcript.json")
    completed = _completed(transcript)
    assert transcript["status"] == "passed", completed
    assert completed["scores"] == EXPECTED_SCORES
    started = transcript["events"][0]  # type: ignore[index]
    assert started["sandbox"] == runtime.sandbox_kind
    assert started["config"]["student_user"] == "student"
    assert "transcript:" in proc.stderr
    # the sandbox is gone, the run config is there (unreadable to others: it may hold a key)
    assert runtime.list_sandboxes({LABEL_RUN_ID: str(transcript["run_id"])}) == []
    assert (out / "transcript.run_config.json").stat().st_mode & 0o077 == 0
    # the live event stream is gone once the complete transcript is there
    assert not (out / "transcript.events.jsonl").exists()


@pytest.mark.requires_docker
def test_run_builds_the_image_itself(env_dir: Path, tmp_path: Path) -> None:
    """Without --image the launcher builds (layer cache: quick after the session build)."""
    _available("docker")
    _image(env_dir, "docker")
    proc = _run(env_dir, tmp_path / "out", "--runtime", "docker")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "image karotte-env/" in proc.stderr
    assert _transcript(tmp_path / "out" / "transcript.json")["status"] == "passed"


@pytest.mark.requires_docker
def test_three_parallel_runs(env_dir: Path, tmp_path: Path) -> None:
    _available("docker")
    image = _image(env_dir, "docker")
    out = tmp_path / "out"
    proc = _run(env_dir, out, "--runtime", "docker", "--image", image, "-n", "3")
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_ids = set()
    for i in (1, 2, 3):
        transcript = _transcript(out / f"transcript_{i}.json")
        assert transcript["status"] == "passed"
        assert _completed(transcript)["scores"] == EXPECTED_SCORES
        assert str(transcript["run_id"]).endswith(f"-{i}")
        run_ids.add(transcript["run_id"])
    assert len(run_ids) == 3
    assert not (out / "transcript.json").exists()
    config = json.loads((out / "transcript_2.run_config.json").read_text())
    assert config["transcript_file"] == "/out/transcript_2.json"


@pytest.mark.requires_docker
def test_stopped_engine_gives_the_fix_and_starts_nothing(env_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _run(
        env_dir, out, "--runtime", "docker", env={"DOCKER_HOST": "unix:///nonexistent/d.sock"}
    )
    assert proc.returncode == 2
    assert "fix:" in proc.stderr and "dockerd" in proc.stderr
    assert not (out / "transcript.json").exists()


def test_unknown_runtime_is_refused(env_dir: Path, tmp_path: Path) -> None:
    proc = _run(env_dir, tmp_path / "out", "--runtime", "nosuch")
    assert proc.returncode == 2
    assert "unknown runtime 'nosuch'" in proc.stderr


@pytest.mark.requires_docker
def test_sandbox_dying_without_transcript_leaves_an_infra_transcript(
    env_dir: Path, tmp_path: Path
) -> None:
    """A harness that emits one event and a log line, then dies: the launcher writes the
    transcript itself (with the streamed event and an infra error) and exits non-zero."""
    _available("docker")
    image = _image(env_dir, "docker")
    fake = tmp_path / "fake-karotte"
    fake.write_text(
        "#!/bin/sh\n"
        'echo \'{"type": "step_started", "step_index": 0, "instructions": "hi"}\'\n'
        "echo 'a plain log line on stdout'\n"
        "sleep 4\n"
        "echo 'dying now' >&2\n"
        "exit 3\n"
    )
    fake.chmod(0o755)
    out = tmp_path / "out"
    argv = [KAROTTE, "run", "--task", TASK, "--fake-model", "--out", str(out), "--no-ui"]
    argv += ["--runtime", "docker", "--image", image]
    argv += ["--mount", f"{fake}:/root/.venv/bin/karotte:ro"]
    launcher = subprocess.Popen(
        argv, cwd=env_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    # while the sandbox runs, its events are already on disk for the live dashboard
    stream = out / "transcript.events.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "step_started" not in _read(stream):
        time.sleep(0.1)
    assert launcher.poll() is None, "the stream should be live before the run ends"
    assert json.loads(_read(stream).splitlines()[0])["type"] == "step_started"
    assert "plain log line" not in _read(stream)  # only events
    assert stream.stat().st_mode & 0o077 == 0
    stdout, stderr = launcher.communicate(timeout=600)
    proc = subprocess.CompletedProcess(argv, launcher.returncode, stdout, stderr)
    assert proc.returncode == 1
    assert "a plain log line on stdout" in proc.stderr
    transcript = _transcript(out / "transcript.json")
    assert transcript["status"] == "error"
    assert transcript["error_kind"] == "infra"
    events = transcript["events"]
    assert isinstance(events, list)
    assert [e["type"] for e in events] == ["step_started", "error", "task_completed"]
    assert "code 3" in events[1]["message"] and "dying now" in events[1]["message"]
    assert not stream.exists()  # the launcher's transcript is complete: the stream went


@pytest.mark.requires_docker
def test_dev_mounts_the_source_over_the_installed_copy(env_dir: Path, tmp_path: Path) -> None:
    _available("docker")
    image = _image(env_dir, "docker")
    init = env_dir / "src" / "environment" / "__init__.py"
    original = init.read_text()
    init.write_text(original + "\nimport sys\nprint('DEV-MOUNT-ACTIVE', file=sys.stderr)\n")
    try:
        dev = _run(env_dir, tmp_path / "dev", "--runtime", "docker", "--image", image, "--dev")
        plain = _run(env_dir, tmp_path / "plain", "--runtime", "docker", "--image", image)
    finally:
        init.write_text(original)
    assert dev.returncode == 0, dev.stderr[-3000:]
    assert "DEV-MOUNT-ACTIVE" in dev.stderr
    assert "DEV-MOUNT-ACTIVE" not in plain.stderr


# ---- no leaks ------------------------------------------------------------------------------
def _own_sandboxes(runtime: Runtime, pid: int) -> list[str]:
    return [s.name for s in runtime.list_sandboxes({LABEL_LAUNCHER_PID: str(pid)})]


@pytest.fixture
def launchers() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    runtime = get_runtime("docker")
    for proc in started:
        mine = runtime.list_sandboxes({LABEL_LAUNCHER_PID: str(proc.pid)})
        assert reaper.remove_sandboxes(runtime, mine) == []


def _prepare(
    env_dir: Path, out: Path, image: str, n: int, launchers: list[subprocess.Popen[str]]
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [
            KAROTTE,
            "run",
            "--task",
            TASK,
            "--fake-model",
            "--out",
            str(out),
            "--no-ui",
            "--runtime",
            "docker",
            "--image",
            image,
            "--prepare-only",
            "-n",
            str(n),
        ],
        cwd=env_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    launchers.append(proc)
    runtime = get_runtime("docker")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if len(_own_sandboxes(runtime, proc.pid)) == n:
            return proc
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.3)
    raise AssertionError("the launcher did not start its sandboxes in time")


@pytest.mark.requires_docker
def test_sigkilled_launcher_is_reaped_by_the_next_run(
    env_dir: Path, tmp_path: Path, launchers: list[subprocess.Popen[str]]
) -> None:
    runtime = _available("docker")
    image = _image(env_dir, "docker")
    victim = _prepare(env_dir, tmp_path / "a", image, 3, launchers)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    orphans = _own_sandboxes(runtime, victim.pid)
    assert len(orphans) == 3  # orphans now
    proc = _run(env_dir, tmp_path / "b", "--runtime", "docker", "--image", image)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # (the engine is shared: other dead launchers' orphans may be reaped in the same sweep)
    assert "orphaned sandbox(es) of dead launchers" in proc.stderr
    assert all(name in proc.stderr for name in orphans)
    assert _own_sandboxes(runtime, victim.pid) == []


@pytest.mark.requires_docker
def test_sigkilled_launcher_is_reaped_by_clean(
    env_dir: Path, tmp_path: Path, launchers: list[subprocess.Popen[str]]
) -> None:
    runtime = _available("docker")
    image = _image(env_dir, "docker")
    victim = _prepare(env_dir, tmp_path / "a", image, 3, launchers)
    alive = _prepare(env_dir, tmp_path / "b", image, 1, launchers)
    victim_sandboxes = _own_sandboxes(runtime, victim.pid)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    proc = subprocess.run(
        [KAROTTE, "clean", "--runtime", "docker"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert _own_sandboxes(runtime, victim.pid) == []
    assert len(_own_sandboxes(runtime, alive.pid)) == 1  # a live launcher's sandbox stays
    # their student cgroup dirs (named after the sandbox) are gone too
    for name in victim_sandboxes:
        assert not list(Path("/sys/fs/cgroup").glob(f"*/karotte/{name}"))


@pytest.mark.requires_docker
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_removes_exactly_this_launchers_sandboxes(
    env_dir: Path, tmp_path: Path, launchers: list[subprocess.Popen[str]], sig: signal.Signals
) -> None:
    runtime = _available("docker")
    image = _image(env_dir, "docker")
    first = _prepare(env_dir, tmp_path / "a", image, 2, launchers)
    second = _prepare(env_dir, tmp_path / "b", image, 1, launchers)
    first.send_signal(sig)
    assert first.wait(timeout=60) == 130
    assert _own_sandboxes(runtime, first.pid) == []
    assert len(_own_sandboxes(runtime, second.pid)) == 1


# ---- a model behind a proxy, and the launcher's backstop ---------------------------------------
@pytest.mark.requires_docker
@pytest.mark.parametrize(
    ("runtime_name", "provider"),
    [
        ("docker", "anthropic"),
        ("docker", "openai"),
        # gVisor refuses host unix sockets unless runsc runs with --host-uds=open
        pytest.param("docker:gvisor", "openai", marks=pytest.mark.requires_gvisor),
    ],
)
def test_model_calls_go_through_the_proxy(
    env_dir: Path, tmp_path: Path, runtime_name: str, provider: str
) -> None:
    """The sandbox has no network; --proxy relays the harness's model calls to a local
    provider stub (Claude: URL/v1/messages, others: URL/v1/chat/completions)."""
    from stubs.helpers import model_id
    from stubs.provider_stub import ProviderStub, StubReply

    _available(runtime_name)
    image = _image(env_dir, runtime_name)
    out = tmp_path / "out"
    with ProviderStub([StubReply(text="The sum is 52.\n\nSUM: 52")]) as stub:
        proc = subprocess.run(
            [
                KAROTTE,
                "run",
                "--task",
                TASK,
                "--model",
                model_id(provider),
                "--model-api-key",
                "sk-test",
                "--out",
                str(out),
                "--no-ui",
                "--runtime",
                runtime_name,
                "--image",
                image,
                "--proxy",
                stub.url,
            ],
            cwd=env_dir,
            capture_output=True,
            text=True,
            timeout=600,
        )
        paths = [r.path for r in stub.requests]
    transcript = _transcript(out / "transcript.json")
    assert transcript["status"] != "error", proc.stderr[-3000:]
    expected = "/v1/messages" if provider == "anthropic" else "/v1/chat/completions"
    assert paths and all(p.startswith(expected) for p in paths), paths
    assert _completed(transcript)["scores"][0] == 1.0  # type: ignore[index]
    config = json.loads((out / "transcript.run_config.json").read_text())
    assert config["model_api_base"].startswith("http://127.0.0.1:")


@pytest.mark.requires_docker
def test_backstop_stops_a_hanging_sandbox(env_dir: Path, tmp_path: Path) -> None:
    """A harness that hangs past every time limit is stopped by the launcher, and the run
    ends with a `timeout` transcript instead of hanging."""
    from karotte.config import EvaluationRunConfig
    from karotte.host.launcher import Launcher, LaunchOptions, parse_mount

    _available("docker")
    image = _image(env_dir, "docker")
    fake = tmp_path / "hang"
    fake.write_text("#!/bin/sh\nexec sleep 1000\n")
    fake.chmod(0o755)
    config = EvaluationRunConfig(
        task_id=TASK,
        use_fake_model=True,
        task_time_limit_s=1,
        judge_timeout_s=1,
        transcript_file=tmp_path / "out" / "transcript.json",
    )
    options = LaunchOptions(
        runtime="docker",
        image=image,
        ui=False,
        backstop_grace_s=2,
        mounts=[parse_mount(f"{fake}:/root/.venv/bin/karotte:ro")],
    )
    started = time.monotonic()
    result = Launcher(config, options).run()
    assert time.monotonic() - started < 60
    assert result.exit_code == 1
    transcript = _transcript(tmp_path / "out" / "transcript.json")
    assert transcript["error_kind"] == "timeout"
    assert get_runtime("docker").list_sandboxes({LABEL_RUN_ID: config.run_id}) == []
