"""open_toolbox: tools listed and called through the real MCP SDK, selection and options."""

from __future__ import annotations

import asyncio
import base64
import itertools
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client
from test_tools_files import png_bytes

from karotte.config import EvaluationRunConfig
from karotte.errors import TaskLoadError
from karotte.sandbox.tools import open_toolbox
from karotte.sandbox.tools.registry import bind_tools, close_tools
from karotte.sandbox.tools.server import build_server
from karotte.task import Task

ALL_BUILTINS = ["bash", "view_lines_in_file", "replace_in_file", "view_image_file"]


def make_task(tools: list[str], options: dict[str, Any] | None = None) -> type[Task]:
    class ToolTask(Task):
        id = "tool-task"

        @property
        def system_prompt(self) -> str:
            return "test"

        @property
        def steps(self) -> list[Any]:
            return []

        @property
        def tools(self) -> list[str]:
            return tools

        def configure_tools(self) -> dict[str, dict[str, Any]]:
            return options or {}

    return ToolTask


def config(**extra: Any) -> EvaluationRunConfig:
    return EvaluationRunConfig(task_id="tool-task", **extra)


def test_toolbox_lists_only_the_tasks_tools_as_openai_specs() -> None:
    async def main() -> list[dict[str, Any]]:
        cfg = config()
        async with open_toolbox(cfg, make_task(["bash", "view_image_file"])(cfg)) as box:
            return await box.specs()

    specs = asyncio.run(main())
    assert [s["function"]["name"] for s in specs] == ["bash", "view_image_file"]
    bash = specs[0]
    assert bash["type"] == "function"
    params = bash["function"]["parameters"]
    assert params["required"] == ["command"]
    assert params["properties"]["timeout"]["type"] == "number"  # optional: no anyOf/null
    assert params["additionalProperties"] is False
    assert "title" not in params


def test_toolbox_calls_round_trip(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("alpha\nbeta\n")

    async def main() -> None:
        cfg = config()
        task = make_task(ALL_BUILTINS, {"bash": {"cwd": str(tmp_path)}})(cfg)
        async with open_toolbox(cfg, task) as box:
            out = await box.call("bash", {"command": "cat f.txt | wc -l"})
            assert out.output.strip() == "2" and not out.is_error
            edit = await box.call(
                "replace_in_file", {"path": str(tmp_path / "f.txt"), "old": "beta", "new": "gamma"}
            )
            assert "+gamma" in edit.output
            shown = await box.call("view_lines_in_file", {"path": str(tmp_path / "f.txt")})
            assert "     2\tgamma" in shown.output
            bad = await box.call("bash", {"command": "true", "bogus": 1})
            assert bad.is_error and "bogus: unknown argument" in bad.output
            missing = await box.call("bash", {})
            assert missing.is_error and "command" in missing.output
            unknown = await box.call("rm_rf", {})
            assert unknown.is_error and "no tool named 'rm_rf'" in unknown.output

    asyncio.run(main())


def test_image_result_travels_as_mcp_image_content(tmp_path: Path) -> None:
    data = png_bytes(4, 4)
    (tmp_path / "p.png").write_bytes(data)

    async def main() -> None:
        cfg = config()
        tools = await bind_tools(cfg, make_task(["view_image_file"])(cfg))
        try:
            served = build_server(tools)
            async with Client(served.server, cache=None) as client:
                listing = await client.list_tools()
                assert [t.name for t in listing.tools] == ["view_image_file"]
                result = await client.call_tool(
                    "view_image_file", {"path": str(tmp_path / "p.png")}
                )
                kinds = [type(block) for block in result.content]
                assert kinds == [types.TextContent, types.ImageContent]
                image = result.content[1]
                assert isinstance(image, types.ImageContent)
                assert image.mime_type == "image/png"
                assert base64.b64decode(image.data) == data
        finally:
            await close_tools(tools)

    asyncio.run(main())


def test_calls_are_serialized(tmp_path: Path) -> None:
    command = "echo start $(date +%s%N); sleep 0.2; echo end $(date +%s%N)"

    async def main() -> list[tuple[int, int]]:
        cfg = config()
        async with open_toolbox(cfg, make_task(["bash"])(cfg)) as box:
            results = await asyncio.gather(
                *(box.call("bash", {"command": command}) for _ in range(3))
            )
        spans = []
        for result in results:
            start, end = (int(line.split()[1]) for line in result.output.splitlines())
            spans.append((start, end))
        return sorted(spans)

    spans = asyncio.run(main())
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, f"calls overlapped: {spans}"


def test_per_call_timeout_is_capped_by_the_run_config() -> None:
    async def main() -> None:
        cfg = config(tool_timeout_s=0.5)
        async with open_toolbox(cfg, make_task(["bash"], {"bash": {"timeout_s": 100}})(cfg)) as box:
            out = await box.call("bash", {"command": "sleep 30", "timeout": 60})
            assert out.is_error and "timed out after 0.5s" in out.output
            assert (await box.call("bash", {"command": "echo ok"})).output == "ok\n"

    asyncio.run(main())


def test_unknown_tool_name_is_a_task_load_error() -> None:
    async def main() -> None:
        cfg = config()
        async with open_toolbox(cfg, make_task(["bash", "teleport"])(cfg)):
            pass

    with pytest.raises(TaskLoadError, match=r"unknown tool 'teleport'.*Known tools: bash"):
        asyncio.run(main())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"bash": {"timeout_s": -1}}, r"configure_tools\(\)\['bash'\].*timeout_s"),
        ({"bash": {"colour": "red"}}, r"colour.*unknown field"),
        ({"view_lines_in_file": {}}, r"'view_lines_in_file', which is not in task.tools"),
    ],
)
def test_bad_tool_options_are_task_load_errors(options: dict[str, Any], message: str) -> None:
    async def main() -> None:
        cfg = config()
        async with open_toolbox(cfg, make_task(["bash"], options)(cfg)):
            pass

    with pytest.raises(TaskLoadError, match=message):
        asyncio.run(main())


def test_duplicate_tool_names_are_refused() -> None:
    async def main() -> None:
        cfg = config()
        async with open_toolbox(cfg, make_task(["bash", "bash"])(cfg)):
            pass

    with pytest.raises(TaskLoadError, match="more than once"):
        asyncio.run(main())


def test_the_same_server_serves_streamable_http() -> None:
    """External CLI agents will reach the very same tool server over streamable HTTP."""
    import socket

    import uvicorn

    async def main() -> tuple[list[str], str]:
        cfg = config()
        tools = await bind_tools(cfg, make_task(["bash"])(cfg))
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        app = build_server(tools).server.streamable_http_app()
        http = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        serving = asyncio.create_task(http.serve(sockets=[sock]))
        try:
            while not http.started:
                await asyncio.sleep(0.01)
            async with Client(f"http://127.0.0.1:{port}/mcp", cache=None) as client:
                names = [t.name for t in (await client.list_tools()).tools]
                result = await client.call_tool("bash", {"command": "echo over-http"})
                block = result.content[0]
                assert isinstance(block, types.TextContent)
                return names, block.text
        finally:
            http.should_exit = True
            await serving
            sock.close()
            await close_tools(tools)

    names, text = asyncio.run(main())
    assert names == ["bash"]
    assert text == "over-http\n"


def test_check_task_tools_validates_without_starting_anything() -> None:
    from karotte.sandbox.tools.registry import check_task_tools

    cfg = config()
    assert check_task_tools(cfg, make_task(["bash", "view_lines_in_file"])(cfg)) == [
        "bash",
        "view_lines_in_file",
    ]
    with pytest.raises(TaskLoadError, match="unknown tool 'nope'"):
        check_task_tools(cfg, make_task(["nope"])(cfg))
    with pytest.raises(TaskLoadError, match="max_file_bytes"):
        check_task_tools(
            cfg, make_task(["replace_in_file"], {"replace_in_file": {"max_file_bytes": 0}})(cfg)
        )


@pytest.mark.parametrize("transport", ["direct", "memory"])
def test_both_in_process_transports_work(transport: str) -> None:
    from karotte.sandbox.tools.client import connect_toolbox

    async def main() -> tuple[list[str], str]:
        cfg = config()
        tools = await bind_tools(cfg, make_task(["bash"])(cfg))
        try:
            served = build_server(tools)
            async with connect_toolbox(served.server, 30, transport) as box:  # type: ignore[arg-type]
                names = [s["function"]["name"] for s in await box.specs()]
                return names, (await box.call("bash", {"command": "echo via-" + transport})).output
        finally:
            await close_tools(tools)

    assert asyncio.run(main()) == (["bash"], f"via-{transport}\n")


def test_exceptions_raised_in_the_body_come_out_unwrapped() -> None:
    class Boom(Exception):
        pass

    async def main() -> None:
        cfg = config()
        async with open_toolbox(cfg, make_task(["bash"])(cfg)) as box:
            await box.call("bash", {"command": "true"})
            raise Boom("from the harness")

    with pytest.raises(Boom, match="from the harness"):
        asyncio.run(main())
