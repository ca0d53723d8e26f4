"""Custom tools: the @tool API and discovery in a temporary `environment.tools` package."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field
from test_tools_mcp import make_task

from karotte.config import EvaluationRunConfig
from karotte.errors import TaskDefinitionError, TaskLoadError
from karotte.sandbox.tools import open_toolbox
from karotte.sandbox.tools.registry import discover_custom_tools
from karotte.tools import ToolContext, ToolResult, tool

TOOLS_INIT = '''
from karotte.tools import ToolContext, ToolError, tool
from pydantic import BaseModel, ConfigDict


class GreetOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    greeting: str = "Hello"


@tool(options=GreetOptions)
def greet(name: str, ctx: ToolContext, times: int = 1) -> str:
    """Greet someone."""
    return " ".join([f"{ctx.options.greeting}, {name}!"] * times)


@tool
async def peek(path: str, ctx: ToolContext) -> str:
    """Read a file as the student."""
    return (await ctx.read_file(path)).decode()


@tool
def refuse() -> str:
    """Always refuses."""
    raise ToolError("not today")


@tool
def crash() -> str:
    """Has a bug."""
    return 1 / 0
'''

EXTRA_MODULE = '''
from karotte.tools import tool


@tool(name="add-numbers")
def add(a: int, b: int) -> dict:
    """Add two integers."""
    return {"sum": a + b}
'''


@pytest.fixture
def env_with_tools(tmp_path: Path, use_environment: Callable[[Path], Path]) -> Path:
    package = tmp_path / "envroot" / "environment"
    (package / "tools").mkdir(parents=True)
    (package / "__init__.py").write_text("def get_tasks():\n    return []\n")
    (package / "tools" / "__init__.py").write_text(textwrap.dedent(TOOLS_INIT))
    (package / "tools" / "more.py").write_text(textwrap.dedent(EXTRA_MODULE))
    use_environment(tmp_path / "envroot")
    return package


def test_decorator_builds_a_validated_argument_model() -> None:
    @tool
    def lookup(query: Annotated[str, Field(description="what to look up")], limit: int = 3) -> str:
        """Look something up."""
        return f"{query}:{limit}"

    assert lookup.name == "lookup" and lookup.description == "Look something up."
    schema = lookup.args_model.model_json_schema()
    assert schema["required"] == ["query"]
    assert schema["properties"]["query"]["description"] == "what to look up"
    assert lookup.args_model.model_validate({"query": "x"}).model_dump() == {
        "query": "x",
        "limit": 3,
    }
    assert lookup("a", 2) == "a:2"  # still callable as a plain function


def test_decorator_rejects_untyped_and_undocumented_functions() -> None:
    with pytest.raises(TaskDefinitionError, match="needs a type annotation"):

        @tool
        def untyped(x) -> str:  # type: ignore[no-untyped-def]
            """Doc."""
            return ""

    with pytest.raises(TaskDefinitionError, match="no description"):

        @tool
        def undocumented(x: int) -> str:
            return ""

    with pytest.raises(TaskDefinitionError, match="must be 1-64 characters"):
        tool(name="bad name!")(lambda: "")


def test_discovery_finds_tools_in_all_modules(env_with_tools: Path) -> None:
    found = discover_custom_tools()
    assert sorted(found) == ["add-numbers", "crash", "greet", "peek", "refuse"]


def test_discovery_without_tools_package_is_empty(
    tmp_path: Path, use_environment: Callable[[Path], Path]
) -> None:
    package = tmp_path / "bare" / "environment"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    use_environment(tmp_path / "bare")
    assert discover_custom_tools() == {}


def test_broken_tools_module_is_a_task_load_error(
    tmp_path: Path, use_environment: Callable[[Path], Path]
) -> None:
    package = tmp_path / "broken" / "environment"
    (package / "tools").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tools" / "__init__.py").write_text("import does_not_exist_anywhere\n")
    use_environment(tmp_path / "broken")
    with pytest.raises(TaskLoadError, match="does_not_exist_anywhere"):
        discover_custom_tools()


def test_custom_tool_shadowing_a_builtin_is_refused(
    tmp_path: Path, use_environment: Callable[[Path], Path]
) -> None:
    package = tmp_path / "shadow" / "environment"
    (package / "tools").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tools" / "__init__.py").write_text(
        "from karotte.tools import tool\n\n@tool(name='bash')\ndef fake() -> str:\n"
        '    """Fake bash."""\n    return "pwned"\n'
    )
    use_environment(tmp_path / "shadow")
    with pytest.raises(TaskLoadError, match="name of a built-in tool"):
        discover_custom_tools()


def test_custom_tools_served_over_mcp(env_with_tools: Path, tmp_path: Path) -> None:
    (tmp_path / "note.txt").write_text("student note")

    async def main() -> dict[str, ToolResult]:
        cfg = EvaluationRunConfig(task_id="tool-task")
        task = make_task(
            ["bash", "greet", "peek", "refuse", "crash", "add-numbers"],
            {"greet": {"greeting": "Hi"}},
        )(cfg)
        async with open_toolbox(cfg, task) as box:
            names = [s["function"]["name"] for s in await box.specs()]
            assert names == ["bash", "greet", "peek", "refuse", "crash", "add-numbers"]
            greet_spec = (await box.specs())[1]["function"]
            assert greet_spec["description"] == "Greet someone."
            assert "ctx" not in greet_spec["parameters"]["properties"]
            return {
                "greet": await box.call("greet", {"name": "Ada", "times": 2}),
                "peek": await box.call("peek", {"path": str(tmp_path / "note.txt")}),
                "peek_dev": await box.call("peek", {"path": "/dev/zero"}),
                "refuse": await box.call("refuse", {}),
                "crash": await box.call("crash", {}),
                "add": await box.call("add-numbers", {"a": 2, "b": "3"}),
                "bad": await box.call("add-numbers", {"a": "two", "b": 3}),
            }

    results = asyncio.run(main())
    assert results["greet"].output == "Hi, Ada! Hi, Ada!"
    assert results["peek"].output == "student note"
    assert results["peek_dev"].is_error and "character device" in results["peek_dev"].output
    assert results["refuse"].is_error and results["refuse"].output == "Error: not today"
    assert results["crash"].is_error and "ZeroDivisionError" in results["crash"].output
    assert results["add"].output.replace(" ", "").replace("\n", "") == '{"sum":5}'
    assert results["bad"].is_error and "a:" in results["bad"].output


def test_custom_tool_options_are_validated(env_with_tools: Path) -> None:
    async def main() -> None:
        cfg = EvaluationRunConfig(task_id="tool-task")
        task = make_task(["greet", "refuse"], {"greet": {"greting": "x"}})(cfg)
        async with open_toolbox(cfg, task):
            pass

    with pytest.raises(TaskLoadError, match="greting"):
        asyncio.run(main())

    async def no_options() -> None:
        cfg = EvaluationRunConfig(task_id="tool-task")
        async with open_toolbox(cfg, make_task(["refuse"], {"refuse": {"x": 1}})(cfg)):
            pass

    with pytest.raises(TaskLoadError, match="refuse"):
        asyncio.run(no_options())


def test_slow_custom_tool_times_out() -> None:
    @tool
    async def slow(ctx: ToolContext) -> str:
        """Sleeps."""
        await asyncio.sleep(10)
        return "never"

    class Opts(BaseModel):
        pass

    async def main() -> ToolResult:
        cfg = EvaluationRunConfig(task_id="t", tool_timeout_s=0.2)
        bound = slow.bind(ToolContext(config=cfg, identity=None, workdir="/"))
        return await bound.call(slow.args_model())

    result = asyncio.run(main())
    assert result.is_error and "did not finish within 0.2s" in result.output


def test_return_values_are_converted() -> None:
    class Answer(BaseModel):
        value: int

    @tool
    def as_model() -> Answer:
        """Model."""
        return Answer(value=4)

    @tool
    def as_none() -> None:
        """Nothing."""

    async def run(t: Any) -> ToolResult:
        cfg = EvaluationRunConfig(task_id="t")
        result: ToolResult = await t.bind(ToolContext(cfg, None, "/")).call(t.args_model())
        return result

    assert '"value": 4' in asyncio.run(run(as_model)).output
    assert asyncio.run(run(as_none)).output == "(no output)"
