"""The CLI agent adapters by name: the built-in ones and those of installed plugins (entry
point group ``karotte.cli_agents``: an adapter instance, an adapter class, or a function
returning one)."""

from __future__ import annotations

from karotte.errors import ConfigError
from karotte.sandbox.cli_agents.base import CliAgentAdapter


def builtin_adapters() -> list[CliAgentAdapter]:
    from karotte.sandbox.cli_agents.claude_code import ClaudeCodeAdapter
    from karotte.sandbox.cli_agents.codex import CodexAdapter
    from karotte.sandbox.cli_agents.mistral_vibe import MistralVibeAdapter

    return [ClaudeCodeAdapter(), CodexAdapter(), MistralVibeAdapter()]


def _plugin_adapters(builtin: set[str]) -> list[CliAgentAdapter]:
    from karotte import plugins

    found: list[CliAgentAdapter] = []
    for name, obj in plugins.load(plugins.CLI_AGENTS):
        try:
            adapter = obj() if callable(obj) and not isinstance(obj, CliAgentAdapter) else obj
        except Exception as exc:
            plugins.warn(f"CLI agent plugin {name!r} failed: {type(exc).__name__}: {exc}")
            continue
        if not isinstance(adapter, CliAgentAdapter):
            plugins.warn(
                f"CLI agent plugin {name!r} is a {type(adapter).__name__}, not a CliAgentAdapter; "
                "skipped"
            )
        elif adapter.name in builtin:
            plugins.warn(
                f"CLI agent plugin {name!r} would replace the built-in {adapter.name!r}; skipped"
            )
        else:
            found.append(adapter)
    return found


def all_adapters() -> dict[str, CliAgentAdapter]:
    adapters = {a.name: a for a in builtin_adapters()}
    for adapter in _plugin_adapters(set(adapters)):
        adapters.setdefault(adapter.name, adapter)
    return adapters


def get_adapter(name: str) -> CliAgentAdapter:
    adapters = all_adapters()
    try:
        return adapters[name]
    except KeyError:
        raise ConfigError(
            f"unknown CLI agent {name!r} (known: {', '.join(sorted(adapters))})"
        ) from None
