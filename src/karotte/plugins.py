"""Plugins: installed packages extend Karotte through entry points.

Each group below is a hook. Entry points of a group are used in the order of their names. A
plugin that does not load, raises, or returns the wrong type is **skipped with a warning**
(printed once, and kept in :func:`plugin_warnings`), except a run-config preprocessor and a
container-run-args hook: those guard a run, so their failure stops the run with their message.

=================================== ======================================================
group                               what the entry point is
=================================== ======================================================
``karotte.cli``                     a ``typer.Typer`` added as a sub-command (never
                                    replacing a built-in command)
``karotte.run_config_preprocessors`` ``f(config) -> config``, chained in name order
``karotte.default_proxy_url``       ``f() -> str | None``: the model proxy when none is given
``karotte.harness_secret_env``      ``f() -> iterable of names`` (or the iterable itself):
                                    variables never passed to the student
``karotte.default_hardware``        ``f() -> Hardware | None``: for tasks that declare none
``karotte.hardware_limits``         ``f(hardware) -> HardwareLimits | None``: caps per run
``karotte.container_run_args``      ``f(task, runtime) -> list[str]``: extra engine
                                    arguments; raising refuses the launch
``karotte.templates``               a directory of environment templates (templates.md)
``karotte.cli_agents``              a ``CliAgentAdapter`` (instance, class or factory): a
                                    coding-agent CLI for ``agent: cli:<name>`` (cli-agents.md)
=================================== ======================================================

See docs/plugins.md and the worked example in ``examples/karotte-example-plugin``.
"""

from __future__ import annotations

import importlib.metadata
import logging
import sys
from collections.abc import Callable, Iterable
from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from karotte.config import EvaluationRunConfig
from karotte.errors import ConfigError
from karotte.task import Hardware

log = logging.getLogger(__name__)

CLI = "karotte.cli"
RUN_CONFIG_PREPROCESSORS = "karotte.run_config_preprocessors"
DEFAULT_PROXY_URL = "karotte.default_proxy_url"
HARNESS_SECRET_ENV = "karotte.harness_secret_env"  # noqa: S105 (a group name)
DEFAULT_HARDWARE = "karotte.default_hardware"
HARDWARE_LIMITS = "karotte.hardware_limits"
CONTAINER_RUN_ARGS = "karotte.container_run_args"
TEMPLATES = "karotte.templates"
CLI_AGENTS = "karotte.cli_agents"

GROUPS = (
    CLI,
    RUN_CONFIG_PREPROCESSORS,
    DEFAULT_PROXY_URL,
    HARNESS_SECRET_ENV,
    DEFAULT_HARDWARE,
    HARDWARE_LIMITS,
    CONTAINER_RUN_ARGS,
    TEMPLATES,
    CLI_AGENTS,
)


class PluginError(ConfigError):
    """A plugin that guards a run (preprocessor, container run args) failed: the run stops."""


class HardwareLimits(BaseModel):
    """What a platform allows one run at most; ``None`` = no cap. ``passthrough`` names host
    devices given to the sandbox (a container gets them with ``--device``; a VM runtime that
    cannot hold them refuses the run)."""

    model_config = ConfigDict(extra="forbid")

    memory_gib: float | None = Field(default=None, gt=0)
    disk_gib: float | None = Field(default=None, gt=0)
    cpus: float | None = Field(default=None, gt=0)
    passthrough: list[str] = Field(default_factory=list)


class Plugin(BaseModel):
    model_config = ConfigDict(extra="forbid")

    group: str
    name: str
    value: str  # module:attribute
    distribution: str


_warnings: list[str] = []


def plugin_warnings() -> list[str]:
    """Every warning about a skipped plugin in this process, oldest first."""
    return list(_warnings)


def warn(message: str) -> None:
    """Record (once) and print a warning about a plugin that is skipped."""
    if message not in _warnings:
        _warnings.append(message)
        print(f"[karotte] warning: {message}", file=sys.stderr)


def _entry_points(group: str) -> list[importlib.metadata.EntryPoint]:
    return sorted(importlib.metadata.entry_points(group=group), key=lambda ep: ep.name)


def _dist(ep: importlib.metadata.EntryPoint) -> str:
    return ep.dist.metadata["Name"] if ep.dist is not None else "(unknown)"


def installed(group: str | None = None) -> list[Plugin]:
    """The entry points of one group (or of all of Karotte's groups), in use order."""
    groups = [group] if group else list(GROUPS)
    return [
        Plugin(group=g, name=ep.name, value=ep.value, distribution=_dist(ep))
        for g in groups
        for ep in _entry_points(g)
    ]


def load_problem(group: str, name: str) -> str | None:
    """Why the plugin ``name`` of ``group`` does not load (None when it does)."""
    for ep in _entry_points(group):
        if ep.name == name:
            try:
                ep.load()
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"
            return None
    return "not installed"


def _describe(ep: importlib.metadata.EntryPoint) -> str:
    return f"plugin {ep.name!r} ({ep.value}, from {_dist(ep)}) in {ep.group}"


def load(group: str) -> list[tuple[str, Any]]:
    """``(name, object)`` of every plugin of ``group`` that loads; the others are skipped with a
    warning."""
    loaded: list[tuple[str, Any]] = []
    for ep in _entry_points(group):
        try:
            loaded.append((ep.name, ep.load()))
        except Exception as exc:
            warn(f"{_describe(ep)} is skipped: it does not load: {type(exc).__name__}: {exc}")
    return loaded


def _call_each(group: str, *args: Any) -> list[tuple[str, Any]]:
    """Call every plugin of ``group``; skip (with a warning) those that fail."""
    results: list[tuple[str, Any]] = []
    for name, obj in load(group):
        try:
            results.append((name, obj(*args) if callable(obj) else obj))
        except Exception as exc:
            warn(f"plugin {name!r} in {group} is skipped: it raised {type(exc).__name__}: {exc}")
    return results


# ---- the hooks ----------------------------------------------------------------------------------
def preprocess_run_config(config: EvaluationRunConfig) -> EvaluationRunConfig:
    """Chain the run-config preprocessors in name order. Any failure stops the run."""
    for ep in _entry_points(RUN_CONFIG_PREPROCESSORS):
        try:
            func = ep.load()
            result = func(config)
        except Exception as exc:
            raise PluginError(
                f"{_describe(ep)} failed, so the run stops: {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(result, EvaluationRunConfig):
            raise PluginError(
                f"{_describe(ep)} returned {type(result).__name__}, not an EvaluationRunConfig"
            )
        # re-validate: a preprocessor may have assigned fields without validation
        config = EvaluationRunConfig.model_validate(result.model_dump())
    return config


def default_proxy_url() -> str | None:
    """The first non-empty URL a ``karotte.default_proxy_url`` plugin gives, if any."""
    for name, url in _call_each(DEFAULT_PROXY_URL):
        if url is None or url == "":
            continue
        if isinstance(url, str):
            return url
        warn(f"plugin {name!r} in {DEFAULT_PROXY_URL} returned {type(url).__name__}, not str")
    return None


@cache
def harness_secret_env() -> frozenset[str]:
    """Names no student-visible environment may hold, from every plugin (cached)."""
    names: set[str] = set()
    for name, value in _call_each(HARNESS_SECRET_ENV):
        if isinstance(value, str) or not isinstance(value, Iterable):
            warn(f"plugin {name!r} in {HARNESS_SECRET_ENV} must give a list of names")
            continue
        names.update(str(v) for v in value)
    return frozenset(names)


def default_hardware() -> Hardware | None:
    """The first ``Hardware`` a ``karotte.default_hardware`` plugin gives, if any."""
    for name, value in _call_each(DEFAULT_HARDWARE):
        if value is None:
            continue
        try:
            return Hardware.model_validate(value)
        except ValueError as exc:
            warn(f"plugin {name!r} in {DEFAULT_HARDWARE} returned no valid Hardware: {exc}")
    return None


def hardware_limits(hardware: Hardware | None) -> HardwareLimits:
    """The caps of every ``karotte.hardware_limits`` plugin combined: the smallest value of
    each field wins; passthrough devices are all given."""
    combined = HardwareLimits()
    for name, value in _call_each(HARDWARE_LIMITS, hardware):
        if value is None:
            continue
        try:
            caps = HardwareLimits.model_validate(value)
        except ValueError as exc:
            warn(f"plugin {name!r} in {HARDWARE_LIMITS} returned no valid HardwareLimits: {exc}")
            continue
        for field in ("memory_gib", "disk_gib", "cpus"):
            mine, theirs = getattr(combined, field), getattr(caps, field)
            if theirs is not None and (mine is None or theirs < mine):
                setattr(combined, field, theirs)
        combined.passthrough += [d for d in caps.passthrough if d not in combined.passthrough]
    return combined


def container_run_args(task: Any, runtime: str) -> list[str]:
    """Extra engine arguments from every plugin, in name order. A plugin that raises refuses
    the launch with its message (that is how a platform says no)."""
    args: list[str] = []
    for ep in _entry_points(CONTAINER_RUN_ARGS):
        try:
            func: Callable[[Any, str], Any] = ep.load()
            value = func(task, runtime)
        except Exception as exc:
            raise PluginError(f"{_describe(ep)} refused the launch: {exc}") from exc
        if not isinstance(value, list | tuple) or not all(isinstance(a, str) for a in value):
            raise PluginError(f"{_describe(ep)} must return a list of strings")
        for arg in value:
            flag = arg.split("=", 1)[0]
            if flag in CONFINEMENT_FLAGS:
                raise PluginError(
                    f"{_describe(ep)} asked for {arg!r}, which would undo the sandbox's "
                    "confinement; Karotte refuses it"
                )
        args += value
    return args


# engine flags a container_run_args plugin may not pass: they would give the sandbox (and so
# the student) capabilities, host namespaces or the host network
CONFINEMENT_FLAGS = frozenset(
    {
        "--privileged",
        "--cap-add",
        "--security-opt",
        "--pid",
        "--ipc",
        "--uts",
        "--userns",
        "--network",
        "--net",
        "--cgroupns",
        "--device-cgroup-rule",
    }
)


def add_cli_plugins(app: Any, builtin: set[str]) -> None:
    """Add each ``karotte.cli`` plugin's typer app as a sub-command named after the entry point;
    a name of a built-in command is refused (with a warning)."""
    import typer

    for name, obj in load(CLI):
        if name in builtin:
            warn(f"plugin command {name!r} is skipped: it would replace a built-in command")
            continue
        if not isinstance(obj, typer.Typer):
            warn(f"plugin command {name!r} is skipped: {type(obj).__name__} is not a typer.Typer")
            continue
        app.add_typer(obj, name=name)
