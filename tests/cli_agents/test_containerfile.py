"""`karotte agents add/list/remove` and `create-env --agent`: marked sections in the
Containerfile, placed before the wheel layers, replaced on upgrade, removed cleanly."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from karotte.errors import ConfigError
from karotte.host.create_env import create_env
from karotte.sandbox.cli_agents.codex import CodexAdapter
from karotte.sandbox.cli_agents.containerfile import add_agent, remove_agent, sections
from karotte.sandbox.cli_agents.registry import get_adapter

TEXT = """FROM base
RUN apt-get install gcc

# The harness's venv
COPY .karotte/build/deps/ /tmp/x/
RUN pip install
WORKDIR /workdir
RUN karotte check --image
"""


def test_add_replace_remove() -> None:
    claude, codex = get_adapter("claude-code"), get_adapter("codex")
    text = add_agent(add_agent(TEXT, claude), codex)
    found = sections(text)
    assert [(s.name, s.version) for s in found] == [
        ("claude-code", claude.version),
        ("codex", codex.version),
    ]
    lines = text.splitlines()
    assert found[-1].end < lines.index("# The harness's venv")  # before the wheel layers
    assert "COPY .karotte/agents/claude-code/ /opt/karotte/agents/claude-code/" in text
    assert "apt-get install -y --no-install-recommends nodejs" in text  # codex's launcher
    # adding again replaces (an upgrade), never duplicates
    assert add_agent(text, claude) == text
    assert remove_agent(remove_agent(text, "codex"), "claude-code") == TEXT
    with pytest.raises(ConfigError, match="not in this Containerfile"):
        remove_agent(TEXT, "codex")


def test_broken_section_is_reported() -> None:
    text = add_agent(TEXT, get_adapter("codex")).replace("# <<< karotte agent codex\n", "")
    with pytest.raises(ConfigError, match="no end marker"):
        sections(text)


def test_without_anchor_appends() -> None:
    text = add_agent("FROM x\n", get_adapter("codex"))
    assert text.startswith("FROM x\n# >>> karotte agent codex ")


def test_create_env_with_agents_and_cli(tmp_path: Path) -> None:
    env = tmp_path / "demo"
    create_env(
        env,
        karotte_from_index=True,
        lock=False,
        agents=["claude-code", "claude-code"],
        fetch_agents=False,
    )
    text = (env / "Containerfile").read_text()
    assert [s.name for s in sections(text)] == ["claude-code"]
    assert "claude-code" not in (env / ".karotte" / "base" / "Containerfile").read_text()
    with pytest.raises(ConfigError, match="unknown CLI agent"):
        create_env(tmp_path / "other", karotte_from_index=True, lock=False, agents=["nope"])
    assert not (tmp_path / "other").exists()

    def karotte(*args: str) -> subprocess.CompletedProcess[str]:
        exe = Path(sys.executable).parent / "karotte"
        return subprocess.run(
            [str(exe), *args], capture_output=True, text=True, timeout=120, check=False
        )

    added = karotte("agents", "add", "codex", "--no-fetch", "--env", str(env))
    assert added.returncode == 0, added.stderr
    listed = json.loads(karotte("agents", "list", "--env", str(env), "--json").stdout)
    rows = {r["name"]: r for r in listed["agents"]}
    assert rows["codex"]["in_environment"] == rows["codex"]["version"]
    assert rows["mistral-vibe"]["in_environment"] is None
    removed = karotte("agents", "remove", "claude-code", "codex", "--env", str(env))
    assert removed.returncode == 0, removed.stderr
    assert sections((env / "Containerfile").read_text()) == []
    bad = karotte("agents", "add", "nope", "--env", str(env))
    assert bad.returncode == 2 and "unknown CLI agent" in bad.stderr


@dataclass
class LocalTool(CodexAdapter):
    """An adapter whose install just writes files (or fails), to test staging."""

    name: str = "local-tool"
    version: str = "1.0"
    fail: bool = False

    def install_commands(self, prefix: str) -> list[str]:
        if self.fail:
            return [f"mkdir -p {prefix}", "echo 'npm ERR! registry unreachable' >&2", "exit 7"]
        return [f"mkdir -p {prefix}/node_modules/.bin", f"touch {prefix}/node_modules/.bin/codex"]


def test_staging_on_the_host(tmp_path: Path) -> None:
    from karotte.sandbox.cli_agents.containerfile import (
        VERSION_FILE,
        add_agents,
        remove_agents,
        stage_agent,
        staged_dir,
    )

    env = tmp_path / "env"
    env.mkdir()
    (env / "Containerfile").write_text(TEXT)
    tool = LocalTool()
    add_agents(env, [tool])
    target = staged_dir(env, "local-tool")
    assert (target / "node_modules" / ".bin" / "codex").is_file()
    assert (target / VERSION_FILE).read_text().strip() == "1.0"
    assert (env / ".karotte" / "agents" / ".gitignore").read_text().endswith("*\n")
    assert "COPY .karotte/agents/local-tool/" in (env / "Containerfile").read_text()
    assert stage_agent(env, tool) is False  # cached: same version, installed
    assert stage_agent(env, LocalTool(version="2.0")) is True  # a new pin reinstalls
    with pytest.raises(ConfigError, match="registry unreachable"):
        stage_agent(env, LocalTool(version="3.0", fail=True))
    assert (target / VERSION_FILE).read_text().strip() == "2.0"  # the old install survives
    assert not list((env / ".karotte" / "agents").glob(".*.partial"))
    remove_agents(env, ["local-tool"])
    assert not target.exists() and (env / "Containerfile").read_text() == TEXT
