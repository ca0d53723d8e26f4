"""The CLI agent runner's edges, with a tiny scripted "CLI" (a Python script printing Claude
Code's stream-json) provided by a real plugin (an entry point of ``karotte.cli_agents``).

The real CLIs are driven in test_cli_agents_e2e.py; here what they cannot be made to do on
demand: hang past the deadline, crash, report an API error, or be misconfigured.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from karotte import EvaluationRunConfig, Step, Task
from karotte.judges import AlwaysPassJudge, Judge
from karotte.sandbox.cli_agents.registry import all_adapters, get_adapter
from karotte.sandbox.cli_agents.runner import open_cli_toolbox, run_cli_agent_step
from karotte.sandbox.harness import run_task
from karotte.sandbox.model_client import FakeModelClient
from karotte.sandbox.transcript import EventRecorder

PLUGIN = """
from dataclasses import dataclass
from pathlib import Path

from karotte.sandbox.cli_agents.claude_code import ClaudeCodeAdapter


@dataclass
class ScriptedCli(ClaudeCodeAdapter):
    name: str = "scripted"
    package: str = "scripted-cli"
    version: str = "1.0"

    def install_commands(self, prefix):
        return [f"mkdir -p {prefix}"]

    def executable(self, install_dir):
        return Path(__file__).parent / "fake_cli.py"

    def argv(self, ctx):
        return ["PYTHON", str(self.executable(ctx.install_dir)), ctx.model]

    def env(self, ctx):
        import os
        env = super().env(ctx)
        if os.environ.get("LEAKY_ADAPTER"):
            env["OOPS"] = os.environ["LEAKY_ADAPTER"]
        return env
"""

FAKE_CLI = """
import json, os, sys, time

mode = sys.argv[1]
prompt = sys.stdin.read()
say = lambda obj: print(json.dumps(obj), flush=True)
say({"type": "system", "subtype": "init", "session_id": "sess-1"})
if mode == "hang":
    with open(os.path.join(os.path.dirname(__file__), "pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
if mode == "flood":
    print("x" * 5000, flush=True)  # one over-long line
    for _ in range(300):
        say({"type": "system", "subtype": "status"})
if mode == "daemon":  # a background process in its own session keeps our pipes open
    import subprocess
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    with open(os.path.join(os.path.dirname(__file__), "pid"), "w") as f:
        f.write(str(child.pid))
if mode == "crash":
    print("boom: the CLI fell over", file=sys.stderr)
    sys.exit(3)
if mode == "api-error":
    error = "API Error: 529 overloaded"
    say({"type": "result", "subtype": "success", "is_error": True, "result": error})
    sys.exit(1)
text = {"type": "text", "text": "echo:" + prompt}
say({"type": "assistant", "message": {"id": "m1", "content": [text]}})
say({"type": "result", "subtype": "success", "is_error": False, "num_turns": 1})
"""


@pytest.fixture
def scripted_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    root = tmp_path / "site"
    package = root / "karotte_scripted_cli"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(PLUGIN.replace('"PYTHON"', repr(sys.executable)))
    (package / "fake_cli.py").write_text(textwrap.dedent(FAKE_CLI))
    dist = root / "karotte_scripted_cli-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: karotte-scripted-cli\nVersion: 1.0\n"
    )
    (dist / "entry_points.txt").write_text(
        "[karotte.cli_agents]\nscripted = karotte_scripted_cli:ScriptedCli\n"
    )
    monkeypatch.syspath_prepend(str(root))
    sys.modules.pop("karotte_scripted_cli", None)  # each test imports its own copy
    yield
    sys.modules.pop("karotte_scripted_cli", None)


class OneStep(Task):
    id = "one"

    @property
    def system_prompt(self) -> str:
        return "sys"

    @property
    def tools(self) -> list[str]:
        return ["bash"]

    @property
    def steps(self) -> list[Step]:
        class S(Step):
            @property
            def instructions(self) -> str:
                return "hello"

            @property
            def judge(self) -> Judge:
                return AlwaysPassJudge()

        return [S(config=self.config)]


async def no_custody(config: EvaluationRunConfig, paths: list[str]) -> dict[str, Any]:
    return {}


def run(tmp_path: Path, mode: str, **overrides: Any) -> tuple[Any, EventRecorder]:
    config = EvaluationRunConfig(
        task_id="one",
        model=f"anthropic/{mode}",
        model_api_key="sk-real-key-for-the-forwarder-only",
        model_api_base="http://127.0.0.1:9",
        agent="cli:scripted",
        step_time_limit_s=overrides.pop("step_time_limit_s", 30),
        transcript_file=tmp_path / "out" / "t.json",
        **overrides,
    )
    recorder = EventRecorder(config.run_id, config.task_id, config.model)
    done = asyncio.run(
        run_task(
            config,
            OneStep,
            recorder,
            FakeModelClient([]),
            open_cli_toolbox,
            no_custody,
            agent_step=run_cli_agent_step,
        )
    )
    return done, recorder


def test_plugin_adapter_is_registered_and_cannot_shadow_builtins(scripted_plugin: None) -> None:
    adapters = all_adapters()
    assert adapters["scripted"].package == "scripted-cli"
    assert {"claude-code", "codex", "mistral-vibe"} <= set(adapters)
    assert type(adapters["claude-code"]).__name__ == "ClaudeCodeAdapter"


def test_a_step_through_the_runner(scripted_plugin: None, tmp_path: Path) -> None:
    done, recorder = run(tmp_path, "ok")
    assert done.status == "passed", [e.model_dump() for e in recorder.events if e.type == "error"]
    messages = [e for e in recorder.events if e.type == "message_added"]
    assert [m.message.text() for m in messages] == ["echo:hello"]  # type: ignore[attr-defined]
    completed = [e for e in recorder.events if e.type == "step_completed"]
    assert completed[0].stop_reason == "model_done"  # type: ignore[attr-defined]


def test_deadline_kills_the_cli(scripted_plugin: None, tmp_path: Path) -> None:
    pidfile = tmp_path / "site" / "karotte_scripted_cli" / "pid"
    _done, recorder = run(tmp_path, "hang", step_time_limit_s=2)
    completed = [e for e in recorder.events if e.type == "step_completed"]
    assert completed[0].stop_reason == "time_limit"  # type: ignore[attr-defined]
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_crash_is_an_infra_error_with_stderr(scripted_plugin: None, tmp_path: Path) -> None:
    done, recorder = run(tmp_path, "crash")
    assert done.status == "error" and done.error_kind == "infra"
    error = next(e for e in recorder.events if e.type == "error")
    assert "status 3" in error.message and "boom" in error.message  # type: ignore[attr-defined]


def test_an_api_error_is_a_model_error(scripted_plugin: None, tmp_path: Path) -> None:
    done, _recorder = run(tmp_path, "api-error")
    assert done.status == "error" and done.error_kind == "model"


def test_an_adapter_that_leaks_the_key_is_refused(
    scripted_plugin: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEAKY_ADAPTER", "sk-real-key-for-the-forwarder-only")
    done, recorder = run(tmp_path, "ok")
    assert done.status == "error"
    error = next(e for e in recorder.events if e.type == "error")
    assert "real API key" in error.message  # type: ignore[attr-defined]
    assert not (tmp_path / "ran").exists()


def test_unknown_and_missing_agents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from karotte.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown CLI agent 'nope'"):
        get_adapter("nope")
    monkeypatch.setenv("KAROTTE_CLI_AGENTS_DIR", str(tmp_path / "empty"))
    config = EvaluationRunConfig(task_id="one", agent="cli:codex")
    recorder = EventRecorder(config.run_id, config.task_id, config.model)
    done = asyncio.run(
        run_task(
            config,
            OneStep,
            recorder,
            FakeModelClient([]),
            open_cli_toolbox,
            no_custody,
            agent_step=run_cli_agent_step,
        )
    )
    error = next(e for e in recorder.events if e.type == "error")
    assert done.status == "error"
    assert "not installed" in error.message and "karotte agents add codex" in error.message  # type: ignore[attr-defined]


def test_vibe_refuses_without_python_3_12(tmp_path: Path) -> None:
    adapter = get_adapter("mistral-vibe")
    problem = adapter.check_installed(tmp_path)
    assert problem is not None and "Python >= 3.12" in problem
    script = " && ".join(adapter.install_commands(str(tmp_path / "vibe")))
    assert "python3.12" in script and "Debian bookworm ships 3.11" in script


def test_a_flooding_cli_is_bounded(
    scripted_plugin: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from karotte.sandbox.cli_agents import runner

    monkeypatch.setattr(runner, "STREAM_LINE_LIMIT", 1000)
    done, recorder = run(tmp_path, "flood")  # the long line is skipped, the answer arrives
    assert done.status == "passed"
    assert [e.message.text() for e in recorder.events if e.type == "message_added"] == [  # type: ignore[attr-defined]
        "echo:hello"
    ]
    monkeypatch.setattr(runner, "MAX_EVENTS_PER_STEP", 100)
    done, recorder = run(tmp_path, "flood")
    completed = [e for e in recorder.events if e.type == "step_completed"]
    assert completed[0].stop_reason == "error"  # type: ignore[attr-defined]


@pytest.mark.requires_root
def test_state_files_are_written_as_the_student(tmp_path: Path, student: Any) -> None:
    """The state directory is the student's: a planted symlink must not make root write (or
    chown) anything the student could not."""
    import types

    from karotte.sandbox.cli_agents.runner import _write_config_files

    secret_dir = tmp_path / "root-only"
    secret_dir.mkdir(mode=0o700)
    secret_file = secret_dir / "answer"
    secret_file.write_text("42")
    state = tmp_path / "state"
    state.mkdir()
    os.chown(state, student.uid, student.gid)
    tmp_path.chmod(0o755)
    (state / "codex").symlink_to(secret_dir)
    (state / "mcp.json").symlink_to(secret_file)
    session: Any = types.SimpleNamespace(
        state_dir=state, config_dir=tmp_path / "config", identity=student
    )
    for target in (state / "codex" / "config.toml", state / "mcp.json"):
        with pytest.raises(OSError):
            _write_config_files({target: "planted"}, session)
    assert sorted(p.name for p in secret_dir.iterdir()) == ["answer"]
    assert secret_file.read_text() == "42"
    assert secret_dir.stat().st_uid == 0 and secret_file.stat().st_uid == 0
    # the normal case: written, owned by the student, private
    _write_config_files({state / "fresh" / "config.toml": "ok"}, session)
    written = state / "fresh" / "config.toml"
    assert written.read_text() == "ok" and written.stat().st_uid == student.uid


def test_a_background_process_holding_the_pipes_does_not_stall_the_step(
    scripted_plugin: None, tmp_path: Path
) -> None:
    started = time.monotonic()
    done, recorder = run(tmp_path, "daemon", step_time_limit_s=60)
    elapsed = time.monotonic() - started
    pid = int((tmp_path / "site" / "karotte_scripted_cli" / "pid").read_text())
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    assert done.status == "passed", [e.model_dump() for e in recorder.events if e.type == "error"]
    completed = [e for e in recorder.events if e.type == "step_completed"]
    assert completed[0].stop_reason == "model_done"  # type: ignore[attr-defined]
    assert elapsed < 30
