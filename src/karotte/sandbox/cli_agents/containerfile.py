"""The CLI agent sections of an environment's Containerfile (``karotte agents add/remove``,
``karotte create-env --agent``).

Each agent is one marked section, the only record of which agents an image has::

    # >>> karotte agent claude-code 2.1.332 (managed by `karotte agents`)
    RUN ... npm install --prefix /opt/karotte/agents/claude-code ... claude-code@2.1.332
    # <<< karotte agent claude-code

A new section goes before the first ``COPY .karotte/build/`` line (so editing tasks does not
reinstall the CLI), else before the last ``WORKDIR``, else at the end. Adding an agent that is
there already replaces its section (that is how a pinned version is upgraded).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from karotte.errors import ConfigError
from karotte.sandbox.cli_agents.base import CliAgentAdapter

CONTAINERFILE = "Containerfile"
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


def add_agents(env_dir: Path, adapters: list[CliAgentAdapter]) -> None:
    path = containerfile_of(env_dir)
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
