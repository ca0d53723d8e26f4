"""The CLI agent sections of an environment's Containerfile (``karotte agents add/remove``,
``karotte create-env --agent``).

Each agent is one marked section, the only record of which agents an image has::

    # >>> karotte agent claude-code 2.1.332 (managed by `karotte agents`)
    RUN ... npm install --prefix /opt/karotte/agents/claude-code ... claude-code@2.1.332
    # <<< karotte agent claude-code

An adapter that installs on the host (``stage_on_host``: the npm CLIs) is installed by
``karotte agents add`` / ``fetch`` into ``.karotte/agents/<name>`` with the machine's own npm
(and its registry access and certificates, as the wheelhouse is made on the host), and its
section copies that directory into the image: the image build needs no registry. The staged
directories are git-ignored (``.karotte/agents/.gitignore``); after a fresh clone, run
``karotte agents fetch`` before building.

A new section goes before the first ``COPY .karotte/build/`` line (so editing tasks does not
reinstall the CLI), else before the last ``WORKDIR``, else at the end. Adding an agent that is
there already replaces its section (that is how a pinned version is upgraded).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from karotte.errors import ConfigError
from karotte.sandbox.cli_agents.base import CliAgentAdapter

CONTAINERFILE = "Containerfile"
STAGE_DIR = ".karotte/agents"
STAGE_TIMEOUT_S = 900
VERSION_FILE = ".karotte-agent-version"
_BEGIN = re.compile(r"^# >>> karotte agent (?P<name>[a-z][a-z0-9_-]*) (?P<version>\S+)")
_END = "# <<< karotte agent {name}"
_ANCHORS = (re.compile(r"^COPY \S*\.karotte/build/"), re.compile(r"^WORKDIR\s"))


@dataclass(frozen=True)
class AgentSection:
    name: str
    version: str
    start: int  # line index of the begin marker
    end: int  # line index of the end marker


def sections(text: str) -> list[AgentSection]:
    """The agent sections of a Containerfile, in file order. Unclosed sections are an error."""
    lines = text.splitlines()
    found: list[AgentSection] = []
    for index, line in enumerate(lines):
        match = _BEGIN.match(line)
        if not match:
            continue
        end_line = _END.format(name=match["name"])
        for stop in range(index + 1, len(lines)):
            if lines[stop].strip() == end_line:
                found.append(AgentSection(match["name"], match["version"], index, stop))
                break
        else:
            raise ConfigError(
                f"Containerfile: the section of agent {match['name']!r} (line {index + 1}) has "
                f"no end marker '{end_line}'; fix or delete it by hand"
            )
    return found


def render_section(adapter: CliAgentAdapter) -> list[str]:
    return [
        f"# >>> karotte agent {adapter.name} {adapter.version} (managed by `karotte agents`)",
        *adapter.containerfile_snippet().rstrip("\n").splitlines(),
        _END.format(name=adapter.name),
    ]


def _insert_at(lines: list[str]) -> int:
    for anchor in _ANCHORS:
        hits = [i for i, line in enumerate(lines) if anchor.match(line)]
        if hits:
            index = hits[0] if anchor is _ANCHORS[0] else hits[-1]
            # keep the comment block that introduces the anchor line below the new section
            while (
                index > 0 and lines[index - 1].startswith("#") and not _is_marker(lines[index - 1])
            ):
                index -= 1
            return index
    return len(lines)


def _is_marker(line: str) -> bool:
    return bool(_BEGIN.match(line)) or line.startswith("# <<< karotte agent ")


def add_agent(text: str, adapter: CliAgentAdapter) -> str:
    """``text`` with ``adapter``'s section added (or replaced, when it is there)."""
    lines = text.splitlines()
    block = render_section(adapter)
    existing = [s for s in sections(text) if s.name == adapter.name]
    if existing:
        s = existing[0]
        lines[s.start : s.end + 1] = block
    else:
        at = _insert_at(lines)
        lines[at:at] = [*block, ""]
    return "\n".join(lines) + "\n"


def remove_agent(text: str, name: str) -> str:
    lines = text.splitlines()
    existing = [s for s in sections(text) if s.name == name]
    if not existing:
        raise ConfigError(f"agent {name!r} is not in this Containerfile")
    s = existing[0]
    stop = s.end + 1
    if stop < len(lines) and not lines[stop].strip():
        stop += 1  # the blank line add_agent put after the section
    del lines[s.start : stop]
    return "\n".join(lines) + "\n"


def containerfile_of(env_dir: Path) -> Path:
    path = env_dir / CONTAINERFILE
    if not path.is_file():
        raise ConfigError(
            f"{env_dir} has no {CONTAINERFILE}: run this in an environment directory "
            "(made by `karotte create-env`) or pass --env"
        )
    return path


def agents_in_env(env_dir: Path) -> list[AgentSection]:
    return sections(containerfile_of(env_dir).read_text(encoding="utf-8"))


def staged_dir(env_dir: Path, name: str) -> Path:
    return env_dir / STAGE_DIR / name


def stage_agent(env_dir: Path, adapter: CliAgentAdapter) -> bool:
    """Install ``adapter`` on this machine into ``.karotte/agents/<name>`` (the image copies it).
    Returns False when it was there already (same version). Raises ConfigError on failure."""
    if not adapter.stage_on_host:
        return False
    target = staged_dir(env_dir, adapter.name)
    marker = target / VERSION_FILE
    current = marker.is_file() and marker.read_text().strip() == adapter.version
    if current and adapter.check_installed(target) is None:
        return False
    root = target.parent
    root.mkdir(parents=True, exist_ok=True)
    (root / ".gitignore").write_text("# CLI agents installed by `karotte agents fetch`\n*\n")
    work = root / f".{adapter.name}.partial"
    shutil.rmtree(work, ignore_errors=True)
    script = " && ".join(adapter.install_commands(str(work)))
    try:
        proc = subprocess.run(
            ["bash", "-c", script],
            capture_output=True,
            text=True,
            timeout=STAGE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise ConfigError(f"installing {adapter.package} {adapter.version} failed: {exc}") from exc
    problem = adapter.check_installed(work)
    if proc.returncode != 0 or problem:
        shutil.rmtree(work, ignore_errors=True)
        detail = (proc.stderr or proc.stdout or problem or "").strip()[-1500:]
        raise ConfigError(
            f"installing {adapter.package} {adapter.version} on this machine failed (is npm "
            f"installed, e.g. by scripts/setup-cli-agents.sh, and the registry reachable?):\n"
            f"{detail}"
        )
    (work / VERSION_FILE).write_text(adapter.version + "\n")
    shutil.rmtree(target, ignore_errors=True)
    work.rename(target)
    return True


def add_agents(env_dir: Path, adapters: list[CliAgentAdapter], *, fetch: bool = True) -> None:
    """Add the sections (and, with ``fetch``, install what the image copies)."""
    path = containerfile_of(env_dir)
    if fetch:
        for adapter in adapters:
            stage_agent(env_dir, adapter)
    text = path.read_text(encoding="utf-8")
    for adapter in adapters:
        text = add_agent(text, adapter)
    path.write_text(text, encoding="utf-8")


def remove_agents(env_dir: Path, names: list[str]) -> None:
    path = containerfile_of(env_dir)
    text = path.read_text(encoding="utf-8")
    for name in names:
        text = remove_agent(text, name)
    path.write_text(text, encoding="utf-8")
    for name in names:
        shutil.rmtree(staged_dir(env_dir, name), ignore_errors=True)
