"""Each adapter's real CLI, run as a real unprivileged user, against a local stub model.

The stub scripts one conversation per step: call Karotte's MCP ``bash`` tool once, then answer.
The bash command (run as the student through Karotte's tool server) prints every environment
variable of the student's processes, including the CLI's own, and greps the student's readable
files for the real key. Checked: the transcript events (same shapes as the builtin loop), the
judge's score, the session resumed in step 2, the key swap (the stub sees only the real key,
the student only the placeholder), and the tool ran as the student.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from stub_model import FINAL_TEXT, Script, StubModel  # type: ignore[import-not-found]

from karotte import EvaluationRunConfig, Step, Task
from karotte.events import MessageAdded, ToolCallCompleted, ToolCallStarted, Transcript
from karotte.judges import Judge, RegexJudge
from karotte.sandbox.cli_agents.runner import open_cli_toolbox, run_cli_agent_step
from karotte.sandbox.confinement.demote import Identity
from karotte.sandbox.entry import run_harness
from karotte.sandbox.harness import run_task
from karotte.sandbox.model_client import FakeModelClient
from karotte.sandbox.transcript import EventRecorder

pytestmark = [pytest.mark.requires_root, pytest.mark.slow]

REAL_PREFIX = "sk-real-secret-"
# split in two so the command text itself never contains the searched string
STUDENT_VIEW = (
    "echo KAROTTE-MARK; id -un; "
    "for d in /proc/[0-9]*; do [ -O $d ] && tr '\\0' '\\n' < $d/environ; done 2>/dev/null "
    "| sort -u; "
    'find "$HOME" /tmp/karotte-cli-* -xdev -maxdepth 4 -type f -size -2M 2>/dev/null '
    "| xargs -r grep -l 'sk-real''-secret' 2>/dev/null | head -5; echo SCAN-DONE"
)


def task_class() -> type[Task]:
    class S(Step):
        @property
        def instructions(self) -> str:
            return "Run the check, then say you are done."

        @property
        def judge(self) -> Judge:
            return RegexJudge("All done")

    class T(Task):
        id = "cli-agent-check"

        @property
        def system_prompt(self) -> str:
            return "You are tested. Use the karotte bash tool."

        @property
        def tools(self) -> list[str]:
            return ["bash"]

        @property
        def steps(self) -> list[Step]:
            return [S(config=self.config), S(config=self.config)]

    return T


async def no_custody(config: EvaluationRunConfig, paths: list[str]) -> dict[str, Any]:
    return {}


def student_processes_hold(uid: int | None, needle: str) -> bool:
    """Root's view: does any process of ``uid`` (None: any process) have ``needle`` in its
    environment?"""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if uid is not None and entry.stat().st_uid != uid:
                continue
            if needle.encode() in (entry / "environ").read_bytes():
                return True
        except OSError:
            continue
    return False


def files_hold(roots: list[Path], needle: str) -> list[str]:
    found = []
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for name in names:
                path = Path(dirpath) / name
                try:
                    if needle.encode() in path.read_bytes():
                        found.append(str(path))
                except OSError:
                    continue
    return found


def run_agent(
    name: str,
    model: str,
    base_suffix: str,
    student: Identity | None,
    tmp_path: Path,
    native_tool: str | None = None,
) -> tuple[Any, EventRecorder, StubModel, dict[str, Any]]:
    real_key = REAL_PREFIX + secrets.token_hex(12)
    stub = StubModel(Script(command=STUDENT_VIEW, native_tool=native_tool)).start()
    seen: dict[str, Any] = {"key_in_student_env": False, "placeholder_in_student_env": False}

    uid = student.uid if student is not None else None

    def look() -> None:
        if student_processes_hold(uid, real_key):
            seen["key_in_student_env"] = True
        if student_processes_hold(uid, "karotte-placeholder-"):
            seen["placeholder_in_student_env"] = True

    stub.on_request = look
    config = EvaluationRunConfig(
        task_id="cli-agent-check",
        model=model,
        model_api_key=real_key,
        model_api_base=stub.url + base_suffix,
        agent=f"cli:{name}",
        student_user=student.name if student is not None else None,
        max_turns=8,
        step_time_limit_s=120,
        tool_timeout_s=30,
        transcript_file=tmp_path / "transcript.json",
    )
    recorder = EventRecorder(config.run_id, config.task_id, config.model)
    state_dirs: list[Path] = []

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def tools(cfg: EvaluationRunConfig, task: Task) -> AsyncIterator[Any]:
        async with open_cli_toolbox(cfg, task) as box:
            state_dirs.extend([box.session.state_dir, box.session.config_dir])
            yield box
            home = [Path(student.home)] if student is not None else []
            seen["leaked_files"] = files_hold([*state_dirs, *home], real_key)
            seen["timings"] = list(box.session.timings)

    started = time.monotonic()
    try:
        done = asyncio.run(
            run_task(
                config,
                task_class(),
                recorder,
                FakeModelClient([]),
                tools,
                no_custody,
                agent_step=run_cli_agent_step,
            )
        )
    finally:
        stub.stop()
    seen["real_key"] = real_key
    seen["raw"] = sorted(config.artifacts_dir.glob("cli-agent/step-*.jsonl"))
    seen["wall_s"] = time.monotonic() - started
    return done, recorder, stub, seen


def check_run(
    done: Any,
    recorder: EventRecorder,
    stub: StubModel,
    seen: dict[str, Any],
    student: Identity,
    key_header: str,
) -> None:
    errors = [e for e in recorder.events if e.type == "error"]
    if os.environ.get("KAROTTE_DEBUG_CLI"):
        for e in recorder.events:
            print(e.model_dump_json()[:600])
        for r in stub.requests:
            print(
                r.at,
                r.method,
                r.path,
                json.dumps(
                    [
                        t
                        for t in (r.body or {}).get("tools") or []
                        if "karotte" in json.dumps(t) or not t.get("name")
                    ]
                )[:1500]
                if isinstance(r.body, dict)
                else None,
            )
    assert done.status == "passed", (errors, [e.model_dump() for e in recorder.events][-6:])
    assert done.scores == [1.0, 1.0]
    step0 = [e for e in recorder.events if getattr(e, "step_index", None) == 0]
    kinds = [e.type for e in step0]
    assert kinds[:5] == [
        "step_started",
        "message_added",
        "tool_call_started",
        "tool_call_completed",
        "message_added",
    ], kinds
    call_msg, started, completed, answer = step0[1], step0[2], step0[3], step0[4]
    assert isinstance(call_msg, MessageAdded) and call_msg.message.tool_calls
    assert call_msg.message.tool_calls[0].function.name == "bash"
    assert isinstance(started, ToolCallStarted) and started.name == "bash"
    assert started.arguments == {"command": STUDENT_VIEW}
    assert started.call_id == call_msg.message.tool_calls[0].id
    assert isinstance(completed, ToolCallCompleted) and completed.call_id == started.call_id
    assert not completed.is_error, completed.output
    out = completed.output
    assert "KAROTTE-MARK" in out and student.name in out and "SCAN-DONE" in out
    # the student sees the placeholder (the CLI's environment), never the real key
    assert "karotte-placeholder-" in out
    assert seen["real_key"] not in out and "sk-real-secret" not in out
    assert isinstance(answer, MessageAdded) and answer.message.text() == FINAL_TEXT
    assert answer.usage is not None and answer.usage.output_tokens > 0
    # root's view while the CLI waited for the model: placeholder yes, key no; no file holds it
    assert seen["placeholder_in_student_env"] and not seen["key_in_student_env"]
    assert seen["leaked_files"] == []
    # the forwarder swapped the key: every model request reached the stub with the real key
    model_requests = [r for r in stub.requests if r.method == "POST"]
    assert model_requests
    for r in model_requests:
        assert seen["real_key"] in r.headers.get(key_header, ""), r.headers
        assert "karotte-placeholder-" not in str(r.headers)
    # step 2 resumed the same session: its request carries step 1's tool result
    assert stub.script.tool_calls_made == 1
    step1 = [e for e in recorder.events if getattr(e, "step_index", None) == 1]
    assert [e.type for e in step1][:2] == ["step_started", "message_added"]
    # the CLI's own stream is kept as an artifact, one file per step, without the key
    assert [p.name for p in seen["raw"]] == ["step-0.jsonl", "step-1.jsonl"]
    assert all(seen["real_key"] not in p.read_text() for p in seen["raw"])
    if os.environ.get("KAROTTE_DEBUG_CLI"):
        for p in seen["raw"]:
            print(p.read_text())
    # usage is per model call: the stub reports 100 in / 20 out for each request
    posts = len(model_requests)
    assert done.usage.input_tokens == 100 * posts, (done.usage, posts)


def test_claude_code(
    claude_code_dir: Path, agents_from: Any, student: Identity, tmp_path: Path
) -> None:
    agents_from(claude_code_dir)
    done, recorder, stub, seen = run_agent(
        "claude-code", "anthropic/claude-stub-1", "", student, tmp_path
    )
    check_run(done, recorder, stub, seen, student, "x-api-key")
    print(f"claude-code: wall {seen['wall_s']:.1f}s, steps {seen['timings']}")


def test_codex(codex_dir: Path, agents_from: Any, student: Identity, tmp_path: Path) -> None:
    agents_from(codex_dir)
    done, recorder, stub, seen = run_agent("codex", "openai/gpt-stub-1", "/v1", student, tmp_path)
    check_run(done, recorder, stub, seen, student, "authorization")
    print(f"codex: wall {seen['wall_s']:.1f}s, steps {seen['timings']}")


def test_mistral_vibe(
    mistral_vibe_dir: tuple[Path, bool], agents_from: Any, student: Identity, tmp_path: Path
) -> None:
    """Vibe 3 reaches MCP tools only from TypeScript (its run_typescript tool), so the stub
    model calls Vibe's native bash tool. Run as the student when its Python is reachable by
    other users, else (e.g. a Python under /root) as the harness's user with the same clean
    environment; every process's environment is then checked for the key."""
    root, as_student = mistral_vibe_dir
    agents_from(root)
    done, recorder, stub, seen = run_agent(
        "mistral-vibe",
        "mistral/stub-model",
        "/v1",
        student if as_student else None,
        tmp_path,
        native_tool="bash",
    )
    errors = [e.model_dump() for e in recorder.events if e.type == "error"]
    assert done.status == "passed" and done.scores == [1.0, 1.0], errors
    step0 = [e for e in recorder.events if getattr(e, "step_index", None) == 0]
    assert [e.type for e in step0][:5] == [
        "step_started",
        "message_added",
        "tool_call_started",
        "tool_call_completed",
        "message_added",
    ]
    started, completed = step0[2], step0[3]
    assert isinstance(started, ToolCallStarted) and started.name == "file_system.bash"
    assert started.arguments == {"command": STUDENT_VIEW}
    assert isinstance(completed, ToolCallCompleted) and "KAROTTE-MARK" in completed.output
    assert "karotte-placeholder-" in completed.output and "sk-real-secret" not in completed.output
    assert seen["placeholder_in_student_env"] and not seen["key_in_student_env"]
    assert seen["leaked_files"] == []
    posts = [r for r in stub.requests if r.method == "POST"]
    assert posts and all(seen["real_key"] in r.headers.get("authorization", "") for r in posts)
    print(f"mistral-vibe (as student: {as_student}): wall {seen['wall_s']:.1f}s, {seen['timings']}")


def test_codex_through_run_harness(
    codex_dir: Path, agents_from: Any, tmp_path: Path, use_environment: Any
) -> None:
    """The whole harness entry (``run_harness``: task discovery, custody, executable judge,
    transcript file) with ``agent: cli:codex``, as a local run (the harness's own user)."""
    agents_from(codex_dir)
    use_environment(Path(__file__).parents[1] / "fixtures" / "envs" / "basic")
    answer = tmp_path / "answer.txt"
    stub = StubModel(Script(command=f"echo hello > {answer}", final_text="It is 42.")).start()
    config = EvaluationRunConfig(
        task_id="two-steps",
        model="openai/gpt-stub-1",
        model_api_key="sk-real-secret-harness",
        model_api_base=stub.url + "/v1",
        agent="cli:codex",
        step_time_limit_s=120,
        transcript_file=tmp_path / "out" / "transcript.json",
        extra_config={"answer_path": str(answer)},
    )
    try:
        completed = run_harness(config, events="none")
    finally:
        stub.stop()
    transcript = Transcript.model_validate_json(config.transcript_file.read_text())
    errors = [e.model_dump() for e in transcript.events if e.type == "error"]
    assert completed.status == "passed" and completed.scores == [1.0, 1.0], errors
    assert transcript.events[0].config["agent"] == "cli:codex"  # type: ignore[union-attr]
    names = [e.name for e in transcript.events if isinstance(e, ToolCallCompleted)]
    assert names == ["bash"]
    assert (config.artifacts_dir / "cli-agent" / "step-1.jsonl").is_file()
