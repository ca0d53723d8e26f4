"""CLI agents: a coding agent's own CLI (Claude Code, Codex, Mistral Vibe, or a plugin's) plays
the student, once per step, with its native tools and Karotte's tools over MCP.

- :mod:`.base` — the adapter interface and the items a stream parser yields;
- :mod:`.registry` — adapters by name (built-in, and the ``karotte.cli_agents`` entry points);
- :mod:`.forwarder` — the loopback forwarder that swaps the placeholder key for the real one;
- :mod:`.runner` — the harness's tool factory and step function for ``agent: cli:<name>``;
- :mod:`.containerfile` — the install sections ``karotte agents add`` writes into a Containerfile.

See docs/cli-agents.md.
"""

from __future__ import annotations

from karotte.sandbox.cli_agents.base import CliAgentAdapter, StepContext, StreamParser

CLI_PREFIX = "cli:"


def cli_agent_name(agent: str) -> str | None:
    """``cli:claude-code`` → ``claude-code``; None for other agents (``builtin``, ...)."""
    return agent[len(CLI_PREFIX) :] if agent.startswith(CLI_PREFIX) else None


__all__ = ["CLI_PREFIX", "CliAgentAdapter", "StepContext", "StreamParser", "cli_agent_name"]
