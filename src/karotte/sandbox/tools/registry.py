"""Which tools a task gets: the built-ins, custom tools from ``environment.tools``, their options.

``bind_tools(config, task)`` resolves ``task.tools`` (an unknown name is a
:class:`~karotte.errors.TaskLoadError`), validates ``task.configure_tools()`` per tool with
pydantic, decides who the tools act as (``config.student_user``) and returns the bound tools,
ready to serve.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pkgutil
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from karotte.config import EvaluationRunConfig, format_validation_error
from karotte.discovery import ENVIRONMENT_PACKAGE
from karotte.errors import ConfigError, TaskLoadError
from karotte.sandbox.confinement.demote import (
    DEFAULT_WORKDIR,
    DemotionError,
    Identity,
    student_identity,
)
from karotte.sandbox.tools.base import ToolResult
from karotte.sandbox.tools.bash_tool import BashOptions, BashTool
from karotte.sandbox.tools.custom import FunctionTool, NoOptions, ToolContext
from karotte.sandbox.tools.files import FileToolOptions, ReplaceTool, ViewLinesTool
from karotte.sandbox.tools.images import ImageToolOptions, ViewImageTool
from karotte.task import Task


class BoundTool(Protocol):
    """A tool ready to be called in one run (what the MCP server serves)."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def args_model(self) -> type[BaseModel]: ...

    async def call(self, args: BaseModel) -> ToolResult: ...

    async def aclose(self) -> None: ...


class ToolDefinition(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def options_model(self) -> type[BaseModel]: ...

    def bind(self, ctx: ToolContext) -> BoundTool: ...


@dataclass(frozen=True)
class BuiltinTool:
    name: str
    options_model: type[BaseModel]
    factory: Callable[[ToolContext], BoundTool]

    def bind(self, ctx: ToolContext) -> BoundTool:
        return self.factory(ctx)


BUILTIN_TOOLS: dict[str, BuiltinTool] = {
    tool.name: tool
    for tool in (
        BuiltinTool("bash", BashOptions, BashTool),
        BuiltinTool("view_lines_in_file", FileToolOptions, ViewLinesTool),
        BuiltinTool("replace_in_file", FileToolOptions, ReplaceTool),
        BuiltinTool("view_image_file", ImageToolOptions, ViewImageTool),
    )
}


def _import_tools_module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and name.startswith(exc.name):
            return None  # no environment package, or no tools module in it: no custom tools
        raise TaskLoadError(f"importing `{name}` failed:\n{traceback.format_exc()}") from exc
    except Exception as exc:
        raise TaskLoadError(f"importing `{name}` failed:\n{traceback.format_exc()}") from exc


def discover_custom_tools(package: str = f"{ENVIRONMENT_PACKAGE}.tools") -> dict[str, FunctionTool]:
    """Every ``@tool`` in ``package`` and its submodules, by name. Absence means none."""
    root = _import_tools_module(package)
    if root is None:
        return {}
    modules = [root]
    for info in pkgutil.walk_packages(getattr(root, "__path__", []), prefix=f"{package}."):
        module = _import_tools_module(info.name)
        if module is not None:
            modules.append(module)
    found: dict[str, tuple[FunctionTool, str]] = {}
    for module in modules:
        for value in vars(module).values():
            if not isinstance(value, FunctionTool):
                continue
            if value.name in BUILTIN_TOOLS:
                raise TaskLoadError(
                    f"custom tool {value.name!r} in {module.__name__} has the name of a built-in "
                    "tool; rename it (@tool(name=...))"
                )
            seen = found.get(value.name)
            if seen is not None and seen[0] is not value:
                raise TaskLoadError(
                    f"two custom tools are named {value.name!r}: in {seen[1]} and {module.__name__}"
                )
            found.setdefault(value.name, (value, module.__name__))
    return {name: entry[0] for name, entry in found.items()}


def resolve_definitions(
    names: list[str], package: str = f"{ENVIRONMENT_PACKAGE}.tools"
) -> list[ToolDefinition]:
    """The definitions of ``names`` (built-in or custom), in order."""
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise TaskLoadError(f"task.tools lists {', '.join(duplicates)} more than once")
    custom: dict[str, FunctionTool] = {}
    if any(name not in BUILTIN_TOOLS for name in names):
        custom = discover_custom_tools(package)
    definitions: list[ToolDefinition] = []
    for name in names:
        definition: ToolDefinition | None = BUILTIN_TOOLS.get(name) or custom.get(name)
        if definition is None:
            known = ", ".join([*BUILTIN_TOOLS, *sorted(custom)])
            raise TaskLoadError(
                f"task.tools names an unknown tool {name!r}. Known tools: {known}. Custom tools "
                f"are @tool functions in the `{package}` package."
            )
        definitions.append(definition)
    return definitions


def validate_options(
    definitions: list[ToolDefinition], raw: dict[str, Any]
) -> dict[str, BaseModel]:
    """Each tool's options model from ``task.configure_tools()``."""
    if not isinstance(raw, dict):
        raise TaskLoadError(f"configure_tools() must return a dict, got {type(raw).__name__}")
    names = {d.name for d in definitions}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise TaskLoadError(
            f"configure_tools() sets options for {', '.join(map(repr, unknown))}, which "
            f"{'is' if len(unknown) == 1 else 'are'} not in task.tools ({', '.join(sorted(names))})"
        )
    options: dict[str, BaseModel] = {}
    for definition in definitions:
        model = definition.options_model or NoOptions
        try:
            options[definition.name] = model.model_validate(raw.get(definition.name) or {})
        except ValidationError as exc:
            raise TaskLoadError(
                format_validation_error(exc, f"configure_tools()[{definition.name!r}]")
            ) from exc
    return options


def tool_identity(config: EvaluationRunConfig) -> Identity | None:
    """Who the tools act as: the student user, or None (the current user) for local runs."""
    if config.student_user is None:
        return None
    try:
        identity = student_identity(config.student_user)
    except DemotionError as exc:
        raise ConfigError(str(exc)) from exc
    if os.geteuid() not in (0, identity.uid):
        raise ConfigError(
            f"student_user={config.student_user!r} needs the harness to run as root "
            f"(it runs as uid {os.geteuid()}); unset student_user for local runs"
        )
    return identity


def default_workdir(identity: Identity | None) -> str:
    """Where the student starts: /workdir (or its home) in a sandbox, the current dir locally."""
    if identity is None:
        return os.getcwd()
    return DEFAULT_WORKDIR if os.path.isdir(DEFAULT_WORKDIR) else identity.home


def _task_tools(config: EvaluationRunConfig, task: Task) -> tuple[list[str], dict[str, Any]]:
    try:
        names = list(task.tools)
        raw_options = task.configure_tools()
    except Exception as exc:
        raise TaskLoadError(
            f"task {config.task_id!r}: tools/configure_tools raised {type(exc).__name__}: {exc}"
        ) from exc
    if not all(isinstance(n, str) for n in names):
        raise TaskLoadError("task.tools must be a list of tool names (strings)")
    return names, raw_options


def check_task_tools(
    config: EvaluationRunConfig, task: Task, package: str = f"{ENVIRONMENT_PACKAGE}.tools"
) -> list[str]:
    """Validate ``task.tools`` and ``task.configure_tools()`` without starting anything.

    For ``karotte check``: raises :class:`TaskLoadError` like :func:`bind_tools` would; returns
    the tool names.
    """
    names, raw_options = _task_tools(config, task)
    validate_options(resolve_definitions(names, package), raw_options)
    return names


async def bind_tools(
    config: EvaluationRunConfig, task: Task, package: str = f"{ENVIRONMENT_PACKAGE}.tools"
) -> list[BoundTool]:
    """Resolve, configure and start the task's tools. Close them with :func:`close_tools`."""
    names, raw_options = _task_tools(config, task)
    definitions = resolve_definitions(names, package)
    options = validate_options(definitions, raw_options)
    identity = tool_identity(config)
    workdir = default_workdir(identity)
    bound: list[BoundTool] = []
    try:
        for definition in definitions:
            ctx = ToolContext(
                config=config, identity=identity, workdir=workdir, options=options[definition.name]
            )
            tool = definition.bind(ctx)
            bound.append(tool)
            start = getattr(tool, "start", None)
            if start is not None:
                await start()
    except BaseException:
        await close_tools(bound)
        raise
    return bound


async def close_tools(tools: list[BoundTool]) -> None:
    for tool in reversed(tools):
        with contextlib.suppress(Exception):
            await tool.aclose()
