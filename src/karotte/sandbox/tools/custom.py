"""Custom tools: typed Python functions marked with ``@tool`` (public through :mod:`karotte.tools`).

A custom tool's arguments come from its signature (validated by pydantic), its description from
its docstring. A parameter annotated :class:`ToolContext` receives the call's context (run config,
the student identity, the tool's options, helpers to touch files *as the student*).

Custom tools run inside the harness process, as root: anything that reads or writes a path the
student controls must go through the context's helpers (or :mod:`karotte.tools` ``run_as`` /
``read_file_as``), never a plain ``open()``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import sys
import traceback
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, TypeVar, overload

from pydantic import BaseModel, ConfigDict, Field, create_model

from karotte.config import EvaluationRunConfig
from karotte.errors import TaskDefinitionError
from karotte.sandbox.confinement.demote import (
    Identity,
    read_file_as,
    run_as,
    write_file_as,
)
from karotte.sandbox.tools.base import ToolResult

T = TypeVar("T")
_NAME_OK = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"


class ToolError(Exception):
    """Raise it in a tool to answer the model with an error message (``is_error``)."""


class NoOptions(BaseModel):
    """Options of a tool that takes none: any key in ``configure_tools()`` is an error."""

    model_config = ConfigDict(extra="forbid")


class ToolArguments(BaseModel):
    """Base of every tool's argument model: unknown arguments are refused."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class ToolContext:
    """What a tool call can use besides its arguments.

    ``identity`` is who the tool acts for: the student (``config.student_user``) or ``None`` in
    local runs (then the helpers act as the current user, with the same safety checks).
    """

    config: EvaluationRunConfig
    identity: Identity | None
    workdir: str
    options: BaseModel = field(default_factory=NoOptions)

    @property
    def timeout_s(self) -> float:
        """The run's per-call tool timeout."""
        return self.config.tool_timeout_s

    def resolve_path(self, path: str) -> str:
        """``path`` made absolute against the student's working directory."""
        return os.path.normpath(os.path.join(self.workdir, os.path.expanduser(path)))

    async def read_file(self, path: str, *, max_bytes: int = 10 * 1024 * 1024) -> bytes:
        """Read a regular file as the student (refuses symlinks, FIFOs, devices, big files)."""
        return await asyncio.to_thread(
            read_file_as,
            self.identity,
            self.resolve_path(path),
            max_bytes=max_bytes,
            timeout_s=min(30.0, self.timeout_s),
        )

    async def write_file(self, path: str, data: bytes, *, create: bool = True) -> int:
        """Write a regular file as the student (never through a symlink)."""
        return await asyncio.to_thread(
            write_file_as,
            self.identity,
            self.resolve_path(path),
            data,
            create=create,
            timeout_s=min(30.0, self.timeout_s),
        )

    async def run_as_student(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a forked child demoted to the student (result pickled)."""
        timeout_s = float(kwargs.pop("timeout_s", self.timeout_s))
        identity = self.identity

        def call() -> T:
            return run_as(identity, fn, *args, timeout_s=timeout_s, **kwargs)

        return await asyncio.to_thread(call)


def _args_model(fn: Callable[..., Any], tool_name: str) -> tuple[type[BaseModel], str | None]:
    """A pydantic model of ``fn``'s parameters, and the name of its ToolContext parameter."""
    try:
        # Parameters only: the return annotation is not needed and may not resolve.
        annotations = {k: v for k, v in getattr(fn, "__annotations__", {}).items() if k != "return"}
        holder = SimpleNamespace(__annotations__=annotations)
        hints = typing.get_type_hints(
            holder, globalns=getattr(fn, "__globals__", {}), include_extras=True
        )
    except Exception as exc:
        raise TaskDefinitionError(
            f"tool {tool_name!r}: cannot resolve the type annotations of {fn.__qualname__}: {exc}"
        ) from exc
    fields: dict[str, Any] = {}
    context_param = None
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TaskDefinitionError(
                f"tool {tool_name!r}: *args/**kwargs are not allowed; declare each argument"
            )
        annotation = hints.get(param.name, inspect.Parameter.empty)
        if annotation is ToolContext:
            context_param = param.name
            continue
        if annotation is inspect.Parameter.empty:
            raise TaskDefinitionError(
                f"tool {tool_name!r}: parameter {param.name!r} needs a type annotation"
            )
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, Field(default=default))
    model = create_model(f"{tool_name}_arguments", __base__=ToolArguments, **fields)
    return model, context_param


def _to_result(value: Any) -> ToolResult:
    if isinstance(value, ToolResult):
        return value
    if value is None:
        return ToolResult(output="(no output)")
    if isinstance(value, str):
        return ToolResult(output=value)
    if isinstance(value, BaseModel):
        return ToolResult(output=value.model_dump_json(indent=2))
    try:
        return ToolResult(output=json.dumps(value, indent=2, default=str))
    except (TypeError, ValueError):
        return ToolResult(output=str(value))


@dataclass
class FunctionTool:
    """A custom tool made by :func:`tool`. Call it like the function it wraps."""

    fn: Callable[..., Any]
    name: str
    description: str
    args_model: type[BaseModel]
    options_model: type[BaseModel]
    context_param: str | None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def bind(self, ctx: ToolContext) -> BoundFunctionTool:
        return BoundFunctionTool(self, ctx)


class BoundFunctionTool:
    """A custom tool bound to one run's context (what the MCP server calls)."""

    def __init__(self, definition: FunctionTool, ctx: ToolContext) -> None:
        self.definition = definition
        self.ctx = ctx
        self.name = definition.name
        self.description = definition.description
        self.args_model = definition.args_model

    async def call(self, args: BaseModel) -> ToolResult:
        kwargs = {name: getattr(args, name) for name in type(args).model_fields}
        if self.definition.context_param:
            kwargs[self.definition.context_param] = self.ctx
        fn = self.definition.fn
        try:
            async with asyncio.timeout(self.ctx.timeout_s):
                if inspect.iscoroutinefunction(fn):
                    value = await fn(**kwargs)
                else:
                    # A thread cannot be killed: a sync tool that hangs keeps its thread busy.
                    value = await asyncio.to_thread(fn, **kwargs)
                    if inspect.isawaitable(value):
                        value = await value
        except ToolError as exc:
            return ToolResult(output=f"Error: {exc}", is_error=True)
        except TimeoutError:
            return ToolResult(
                output=f"Error: the tool did not finish within {self.ctx.timeout_s:g}s",
                is_error=True,
            )
        except Exception as exc:
            print(
                f"karotte: custom tool {self.name!r} raised:\n{traceback.format_exc()}",
                file=sys.stderr,
            )
            return ToolResult(
                output=f"Error: the tool failed ({type(exc).__name__}: {exc})", is_error=True
            )
        return _to_result(value)

    async def aclose(self) -> None:
        return None


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    options: type[BaseModel] | None = None,
) -> Callable[[Callable[..., Any]], FunctionTool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    options: type[BaseModel] | None = None,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Declare a custom tool. Use as ``@tool`` or ``@tool(name=..., options=Model)``.

    Arguments come from the typed signature (pydantic validates them; ``Annotated[int,
    Field(description=...)]`` documents one), the description from the docstring. The function
    may be sync or async and returns a ``str``, a :class:`ToolResult`, ``None`` or anything JSON
    serialisable. A ``ToolContext``-annotated parameter receives the call context.
    """

    def decorate(func: Callable[..., Any]) -> FunctionTool:
        tool_name = name or func.__name__
        if not tool_name or any(ch not in _NAME_OK for ch in tool_name) or len(tool_name) > 64:
            raise TaskDefinitionError(
                f"tool name {tool_name!r} must be 1-64 characters of letters, digits, _ or -"
            )
        text = description if description is not None else inspect.getdoc(func)
        if not text:
            raise TaskDefinitionError(
                f"tool {tool_name!r} has no description: give {func.__qualname__} a docstring"
            )
        args_model, context_param = _args_model(func, tool_name)
        return FunctionTool(
            fn=func,
            name=tool_name,
            description=text,
            args_model=args_model,
            options_model=options or NoOptions,
            context_param=context_param,
        )

    if fn is not None:
        return decorate(fn)
    return decorate
