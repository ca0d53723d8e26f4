"""File tools: view_lines_in_file, replace_in_file, view_image_file (acting as the current user)."""

from __future__ import annotations

import asyncio
import base64
import os
import struct
import time
import zlib
from pathlib import Path

from pydantic import BaseModel

from karotte.config import EvaluationRunConfig
from karotte.sandbox.tools.base import ToolResult
from karotte.sandbox.tools.custom import ToolContext
from karotte.sandbox.tools.files import FileToolOptions, ReplaceTool, ViewLinesTool
from karotte.sandbox.tools.images import ViewImageTool, image_size, sniff_image


def ctx(tmp_path: Path, options: BaseModel | None = None, limit: int = 30_000) -> ToolContext:
    config = EvaluationRunConfig(task_id="t", tool_output_limit_chars=limit)
    return ToolContext(
        config=config, identity=None, workdir=str(tmp_path), options=options or FileToolOptions()
    )


def view(tmp_path: Path, limit: int = 30_000, **args: object) -> ToolResult:
    tool = ViewLinesTool(ctx(tmp_path, limit=limit))
    return asyncio.run(tool.call(tool.args_model.model_validate(args)))


def replace(tmp_path: Path, **args: object) -> ToolResult:
    tool = ReplaceTool(ctx(tmp_path))
    return asyncio.run(tool.call(tool.args_model.model_validate(args)))


def png_bytes(width: int = 3, height: int = 2) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    raw = b"".join(b"\0" + b"\xff\x00\x00" * width for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


# ---- view_lines_in_file ---------------------------------------------------------------------


def test_view_lines_numbers_and_range(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("".join(f"line {i}\n" for i in range(1, 21)))
    result = view(tmp_path, path="a.txt", start_line=3, end_line=5)
    assert not result.is_error
    lines = result.output.splitlines()
    assert lines[0] == f"{tmp_path}/a.txt (lines 3-5 of 20)"
    assert lines[1:] == ["     3\tline 3", "     4\tline 4", "     5\tline 5"]
    whole = view(tmp_path, path=str(tmp_path / "a.txt"))
    assert "(lines 1-20 of 20)" in whole.output and whole.output.endswith("20\tline 20")


def test_view_lines_cut_tells_where_to_continue(tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_text("".join(f"{'x' * 50} {i}\n" for i in range(1, 1001)))
    result = view(tmp_path, limit=1000, path="big.txt")
    assert len(result.output) < 1200
    assert "continue with start_line=" in result.output


def test_view_lines_errors(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one\n")
    (tmp_path / "bin").write_bytes(b"\x00\x01\x02")
    assert "no such file" in view(tmp_path, path="missing").output
    assert view(tmp_path, path="a.txt", start_line=5).is_error
    assert "binary" in view(tmp_path, path="bin").output
    assert "directory" in view(tmp_path, path=".").output


def test_view_lines_refuses_symlink_fifo_device_and_big_files(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("answer\n")
    (tmp_path / "link").symlink_to(tmp_path / "secret")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "big").write_bytes(b"a" * 2048)
    link = view(tmp_path, path="link")
    assert link.is_error and "symbolic link" in link.output and "answer" not in link.output
    started = time.monotonic()
    fifo = view(tmp_path, path="fifo")
    assert fifo.is_error and "FIFO" in fifo.output and time.monotonic() - started < 2
    zero = view(tmp_path, path="/dev/zero")
    assert zero.is_error and "character device" in zero.output
    tool = ViewLinesTool(ctx(tmp_path, FileToolOptions(max_file_bytes=1024)))
    big = asyncio.run(tool.call(tool.args_model.model_validate({"path": "big"})))
    assert big.is_error and "limit of 1024 bytes" in big.output


# ---- replace_in_file ------------------------------------------------------------------------


def test_replace_unique_match_returns_diff(tmp_path: Path) -> None:
    target = tmp_path / "code.py"
    target.write_text("def f():\n    return 1\n\nprint(f())\n")
    os.chmod(target, 0o640)
    result = replace(tmp_path, path="code.py", old="return 1", new="return 2")
    assert not result.is_error, result.output
    assert target.read_text() == "def f():\n    return 2\n\nprint(f())\n"
    assert "-    return 1" in result.output and "+    return 2" in result.output
    assert result.output.startswith(f"--- a{tmp_path}/code.py\n+++ b{tmp_path}/code.py\n")
    assert os.stat(target).st_mode & 0o777 == 0o640  # same file, same mode


def test_replace_missing_and_ambiguous_leave_the_file_alone(tmp_path: Path) -> None:
    target = tmp_path / "t.txt"
    target.write_text("x = 1\ny = 1\nx = 1\n")
    missing = replace(tmp_path, path="t.txt", old="z = 1", new="z = 2")
    assert missing.is_error and "not found" in missing.output
    ambiguous = replace(tmp_path, path="t.txt", old="x = 1", new="x = 2")
    assert ambiguous.is_error and "2 times" in ambiguous.output and "lines 1, 3" in ambiguous.output
    assert replace(tmp_path, path="t.txt", old="", new="a").is_error
    assert replace(tmp_path, path="t.txt", old="y = 1", new="y = 1").is_error
    assert target.read_text() == "x = 1\ny = 1\nx = 1\n"


def test_replace_refuses_symlink(tmp_path: Path) -> None:
    (tmp_path / "real").write_text("keep\n")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    result = replace(tmp_path, path="link", old="keep", new="gone")
    assert result.is_error and "symbolic link" in result.output
    assert (tmp_path / "real").read_text() == "keep\n"


def test_replace_refuses_non_utf8(tmp_path: Path) -> None:
    (tmp_path / "latin").write_bytes("caf\xe9\n".encode("latin-1"))
    result = replace(tmp_path, path="latin", old="caf", new="tea")
    assert result.is_error and "UTF-8" in result.output


# ---- view_image_file ------------------------------------------------------------------------


def test_view_image_png(tmp_path: Path) -> None:
    data = png_bytes(3, 2)
    (tmp_path / "pic.bin").write_bytes(data)  # the type comes from the bytes, not the name
    tool = ViewImageTool(ctx(tmp_path, options=None))
    result = asyncio.run(tool.call(tool.args_model.model_validate({"path": "pic.bin"})))
    assert not result.is_error
    assert "image/png, 3x2" in result.output
    assert result.images == [{"mime_type": "image/png", "data": base64.b64encode(data).decode()}]


def test_view_image_refuses_non_images_and_devices(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello")
    tool = ViewImageTool(ctx(tmp_path, options=None))
    text = asyncio.run(tool.call(tool.args_model.model_validate({"path": "a.txt"})))
    assert text.is_error and "not a PNG" in text.output and not text.images
    dev = asyncio.run(tool.call(tool.args_model.model_validate({"path": "/dev/zero"})))
    assert dev.is_error and not dev.images


def test_sniff_and_sizes() -> None:
    assert sniff_image(b"GIF89a" + struct.pack("<HH", 7, 9)) == "image/gif"
    assert image_size(b"GIF89a" + struct.pack("<HH", 7, 9), "image/gif") == (7, 9)
    assert sniff_image(b"RIFF\0\0\0\0WEBPVP8 ") == "image/webp"
    jpeg = b"\xff\xd8\xff\xe0\x00\x04ab\xff\xc0\x00\x11\x08" + struct.pack(">HH", 5, 6) + b"\0" * 8
    assert sniff_image(jpeg) == "image/jpeg" and image_size(jpeg, "image/jpeg") == (6, 5)
    assert sniff_image(b"plain text") is None
