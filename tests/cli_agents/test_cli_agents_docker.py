"""CLI agents in a real sandbox: an environment made with ``create-env --agent codex --agent
claude-code`` (installed on this machine, copied by their Containerfile sections), its image
built with docker, ``karotte run`` with ``agent: cli:<name>`` through the launcher's model
proxy relay to a stub model on the host.

Checked: the example task passes (custody and the executable judge included), the tool ran as
``student`` inside the sandbox, the student sees only the placeholder — not in any of its
processes, not in its files, not in /out — and the stub received the real key.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from stub_model import Script, StubModel  # type: ignore[import-not-found]

from karotte.host.runtimes import get_runtime

pytestmark = [pytest.mark.requires_docker, pytest.mark.slow]

KAROTTE = str(Path(sys.executable).parent / "karotte")
TAG = "karotte-test/cli-agents:latest"
RUN = [KAROTTE, "run", "--runtime", "docker", "--no-ui"]
STUDENT_VIEW = (
    "sort -n /workdir/shared/example_task/numbers.txt | tail -1 > /workdir/data/answer.txt; "
    "echo KAROTTE-MARK; id -un; "
    "for d in /proc/[0-9]*; do [ -O $d ] && tr '\\0' '\\n' < $d/environ; done 2>/dev/null "
    "| sort -u; "
    "find /workdir /tmp /out -xdev -maxdepth 4 -type f -size -2M 2>/dev/null "
    "| xargs -r grep -l 'sk-real''-secret' 2>/dev/null | head -5; echo SCAN-DONE"
)


@pytest.fixture(scope="session")
def cli_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    availability = get_runtime("docker").availability()
    if not availability.ok:
        pytest.skip(f"docker: {availability.reason}")
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("codex: needs node and npm on this machine (run scripts/setup-cli-agents.sh)")
    target = tmp_path_factory.mktemp("cli-e2e") / "cli-env"
    made = subprocess.run(
        [KAROTTE, "create-env", str(target), "--agent", "codex", "--agent", "claude-code"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if made.returncode != 0 and "registry reachable" in made.stderr:
        pytest.skip(f"codex: installing it from npm failed: {made.stderr[-600:]}")
    assert made.returncode == 0, made.stderr
    built = subprocess.run(
        [KAROTTE, "build", "--runtime", "docker", "--tag", TAG, str(target)],
        capture_output=True,
        text=True,
        timeout=2400,
    )
    log = built.stdout + built.stderr
    if built.returncode != 0 and any(
        s in log for s in ("EAI_AGAIN", "ENOTFOUND", "ECONNREFUSED", "Temporary failure resolving")
    ):
        pytest.skip(f"the image build cannot reach the npm/Debian registries: {log[-600:]}")
    assert built.returncode == 0, log[-4000:]
    return target


@pytest.mark.parametrize(
    ("agent", "model", "header", "prefix"),
    [
        ("codex", "openai/gpt-stub-1", "authorization", "Bearer "),
        ("claude-code", "anthropic/claude-stub-1", "x-api-key", ""),
    ],
)
def test_cli_agent_in_a_docker_sandbox(
    cli_env: Path, tmp_path: Path, agent: str, model: str, header: str, prefix: str
) -> None:
    real_key = "sk-real-secret-" + secrets.token_hex(12)
    stub = StubModel(Script(command=STUDENT_VIEW, final_text="Done. SUM: 52")).start()
    config = tmp_path / "run.json"
    config.write_text(
        json.dumps(
            {
                "task_id": "example-task",
                "model": model,
                "model_api_key": real_key,
                "agent": f"cli:{agent}",
                "step_time_limit_s": 300,
            }
        )
    )
    out = tmp_path / "out"
    try:
        proc = subprocess.run(
            [*RUN, "--config", str(config), "--image", TAG, "--proxy", stub.url, "--out", str(out)],
            cwd=cli_env,
            capture_output=True,
            text=True,
            timeout=900,
            env={k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")},
        )
    finally:
        stub.stop()
    transcripts = sorted(p for p in out.glob("*.json") if not p.name.endswith("run_config.json"))
    assert transcripts, proc.stderr[-4000:]
    transcript = json.loads(transcripts[0].read_text())
    events = transcript["events"]
    errors = [e for e in events if e["type"] == "error"]
    assert transcript["status"] == "passed", (errors, proc.stderr[-3000:])
    completed = events[-1]
    assert completed["scores"] == [1.0, 1.0]
    assert events[0]["sandbox"] == get_runtime("docker").sandbox_kind
    assert events[0]["config"]["agent"] == f"cli:{agent}"
    tool_outputs = [e for e in events if e["type"] == "tool_call_completed"]
    assert [e["name"] for e in tool_outputs] == ["bash"]
    output = tool_outputs[0]["output"]
    assert "KAROTTE-MARK\nstudent\n" in output and "SCAN-DONE" in output
    assert "karotte-placeholder-" in output and "sk-real-secret" not in output
    posts = [r for r in stub.requests if r.method == "POST"]
    assert posts and all(r.headers.get(header) == f"{prefix}{real_key}" for r in posts)
