"""``.manifest.json``: what an environment was made from, so ``karotte update`` can merge.

It records the Karotte version and where the environment's ``karotte`` dependency comes from,
the templates (as asked for and as resolved, with the package each came from), and the hash of
every rendered template file. The rendered files themselves are kept under ``.karotte/base/``:
they are the common ancestor of the 3-way merge ``update`` does.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from karotte.config import format_validation_error
from karotte.errors import ConfigError
from karotte.io import write_text_atomic

MANIFEST_FILE = ".manifest.json"
KAROTTE_DIR = ".karotte"
BASE_DIR = f"{KAROTTE_DIR}/base"


def now_iso() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat()


class KarotteSource(BaseModel):
    """Where the environment's ``karotte`` dependency comes from."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["wheel", "index"]
    version: str
    path: str | None = Field(default=None, description="the wheel, relative to the environment")
    sha256: str | None = None


class TemplateRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    distribution: str = "karotte"
    distribution_version: str | None = None


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    manifest_version: Literal[1] = 1
    env_name: str
    karotte_version: str
    karotte_source: KarotteSource
    templates: list[str] = Field(description="templates as asked for, in order")
    resolved_templates: list[TemplateRecord] = Field(
        description="every template rendered, in rendering order (requirements first)"
    )
    extra_template_packages: list[TemplateRecord] = Field(
        default_factory=list, description="templates that came from packages other than karotte"
    )
    base_files: dict[str, str] = Field(
        default_factory=dict,
        description=f"sha256 of each rendered template file (copies kept in {BASE_DIR}/)",
    )
    created_at: str = Field(default_factory=now_iso)
    updated_at: str = Field(default_factory=now_iso)

    @field_validator("base_files")
    @classmethod
    def _inside_the_environment(cls, value: dict[str, str]) -> dict[str, str]:
        # `update` reads, writes and deletes these paths: never let one point outside
        for rel in value:
            pure = PurePosixPath(rel)
            if pure.is_absolute() or ".." in pure.parts or not pure.parts or "\\" in rel:
                raise ValueError(f"path {rel!r} is not inside the environment")
        return value

    @field_validator("karotte_source")
    @classmethod
    def _wheel_inside(cls, value: KarotteSource) -> KarotteSource:
        if value.path is not None:
            pure = PurePosixPath(value.path)
            if pure.is_absolute() or ".." in pure.parts:
                raise ValueError(f"wheel path {value.path!r} is not inside the environment")
        return value

    @classmethod
    def load(cls, env_dir: Path) -> Manifest:
        path = env_dir / MANIFEST_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(
                f"{path} does not exist: {env_dir} is not an environment made by "
                "`karotte create-env`"
            ) from exc
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: cannot read: {exc}") from exc
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, str(path))) from exc

    def save(self, env_dir: Path) -> None:
        write_text_atomic(env_dir / MANIFEST_FILE, self.model_dump_json(indent=2) + "\n")
