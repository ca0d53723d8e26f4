"""Built-in ``view_image_file``: shows a PNG, JPEG, GIF or WebP image to the model.

The file is read as the student (regular files only, size-capped); the type is taken from the
file's magic bytes, not its name.
"""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from karotte.sandbox.confinement.demote import (
    DemotedCallCrashed,
    DemotedCallTimeout,
    FileAccessError,
    read_file_as,
)
from karotte.sandbox.tools.base import ToolResult
from karotte.sandbox.tools.custom import ToolArguments, ToolContext
from karotte.sandbox.tools.files import file_error, file_timeout

DEFAULT_MAX_IMAGE_BYTES = 5 * 1024 * 1024


class ImageToolOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_image_bytes: int = Field(default=DEFAULT_MAX_IMAGE_BYTES, gt=0, le=64 * 1024 * 1024)


class ViewImageArgs(ToolArguments):
    path: Annotated[str, Field(description="Image path (absolute, or relative to the workdir)")]


def sniff_image(data: bytes) -> str | None:
    """The MIME type of ``data`` from its magic bytes, or None when not a supported image."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def image_size(data: bytes, mime: str) -> tuple[int, int] | None:
    """(width, height) from the header, when it is easy to find."""
    try:
        if mime == "image/png" and data[12:16] == b"IHDR":
            width, height = struct.unpack(">II", data[16:24])
            return int(width), int(height)
        if mime == "image/gif":
            width, height = struct.unpack("<HH", data[6:10])
            return int(width), int(height)
        if mime == "image/jpeg":
            index = 2
            while index + 9 < len(data):
                if data[index] != 0xFF:
                    return None
                marker = data[index + 1]
                length = struct.unpack(">H", data[index + 2 : index + 4])[0]
                if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB):
                    height, width = struct.unpack(">HH", data[index + 5 : index + 9])
                    return int(width), int(height)
                index += 2 + length
    except struct.error:
        return None
    return None


class ViewImageTool:
    name = "view_image_file"
    description = "Show an image file (PNG, JPEG, GIF or WebP) to you."
    args_model = ViewImageArgs

    def __init__(self, ctx: ToolContext) -> None:
        self.ctx = ctx
        options = ctx.options
        self.max_bytes = (
            options.max_image_bytes
            if isinstance(options, ImageToolOptions)
            else DEFAULT_MAX_IMAGE_BYTES
        )

    async def call(self, args: BaseModel) -> ToolResult:
        assert isinstance(args, ViewImageArgs)
        path = self.ctx.resolve_path(args.path)
        try:
            data = await asyncio.to_thread(
                read_file_as,
                self.ctx.identity,
                path,
                max_bytes=self.max_bytes,
                timeout_s=file_timeout(self.ctx),
            )
        except (FileAccessError, DemotedCallTimeout, DemotedCallCrashed) as exc:
            return file_error(exc)
        mime = sniff_image(data)
        if mime is None:
            return ToolResult(
                output=f"Error: {path} is not a PNG, JPEG, GIF or WebP image", is_error=True
            )
        size = image_size(data, mime)
        dims = f", {size[0]}x{size[1]}" if size else ""
        return ToolResult(
            output=f"{path}: {mime}{dims}, {len(data)} bytes",
            images=[{"mime_type": mime, "data": base64.b64encode(data).decode("ascii")}],
        )

    async def aclose(self) -> None:
        return None
