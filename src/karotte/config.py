"""The run config: everything one run needs, as a JSON file (``run_config.json``).

It is the input half of the host↔sandbox protocol (see ``docs/protocol.md``): the host writes it,
the harness inside the sandbox reads it. Unknown or malformed fields are refused with an error
naming the field and the file.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from karotte.errors import ConfigError

ReasoningEffort = Literal["min", "max", "none", "minimal", "low", "medium", "high"]
StudentNetwork = Literal["strict", "internal", "open"]

_ENV_REF = re.compile(r"^\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?$")


def _new_run_id() -> str:
    return uuid.uuid4().hex[:12]


class EvaluationRunConfig(BaseModel):
    """Configuration of one evaluation run of one task."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    run_id: str = Field(default_factory=_new_run_id, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    task_id: str = Field(min_length=1)
    model: str = Field(default="fake/scripted", min_length=1, description="litellm model id")
    model_api_key: str | None = Field(
        default=None, description="API key, or a $VAR reference resolved when the run starts"
    )
    model_api_base: str | None = Field(default=None, description="Base URL of the model API")
    use_fake_model: bool = False
    use_hints: bool = False
    transcript_file: Path = Path("out/transcript.json")
    extra_config: dict[str, Any] = Field(default_factory=dict)

    # limits of the agent loop (per step)
    max_turns: int = Field(default=50, ge=1, le=100_000)
    step_time_limit_s: float = Field(default=1800.0, gt=0)
    max_context_tokens: int | None = Field(default=None, gt=0)
    max_output_tokens: int | None = Field(default=None, gt=0)
    max_empty_turns: int = Field(default=3, ge=0, le=100)
    reasoning_effort: ReasoningEffort | None = None
    # limits of the run as a whole
    task_time_limit_s: float = Field(default=4 * 3600.0, gt=0)
    judge_timeout_s: float = Field(default=600.0, gt=0)
    tool_timeout_s: float = Field(default=180.0, gt=0)
    tool_output_limit_chars: int = Field(default=30_000, ge=100)
    model_retry_budget_s: float = Field(default=600.0, ge=0)
    pass_threshold: float = Field(default=1.0, ge=0, le=1)

    # who tools act as; None = the harness's own user (local runs). Set inside sandboxes.
    student_user: str | None = None
    student_network: StudentNetwork = "strict"
    proxy_url: str | None = None
    backend_uri: str | None = None
    # the run backend (docs/backend.md): bearer token file (re-read on every request), how long an
    # outage is bridged (events queue locally meanwhile), and how long the end of a run waits for
    # the last events and the artifacts to be delivered
    backend_token_file: Path | None = None
    backend_retry_budget_s: float = Field(default=300.0, ge=0)
    backend_flush_timeout_s: float = Field(default=30.0, ge=0)
    # who plays the student: "builtin" (a model through model_client) or "external" (a trainer
    # posts each assistant message to the backend; needs backend_uri), or "cli:<name>" (a coding
    # agent's own CLI run as the student once per step, e.g. cli:claude-code; docs/cli-agents.md)
    agent: str = Field(default="builtin", pattern=r"^(cli:)?[a-z][a-z0-9_-]{0,63}$")
    external_agent_timeout_s: float = Field(default=600.0, gt=0)

    @field_validator("transcript_file")
    @classmethod
    def _json_transcript(cls, value: Path) -> Path:
        if value.suffix != ".json":
            raise ValueError("must end in .json")
        return value

    # ---- derived values -------------------------------------------------------------------
    @property
    def artifacts_dir(self) -> Path:
        """Where saved submissions and other artifacts of this run go."""
        return self.transcript_file.parent / f"{self.run_id}_artifacts"

    def resolved_api_key(self) -> str | None:
        """The API key, with a ``$VAR`` reference resolved from the environment.

        Raises :class:`ConfigError` when the variable is not set.
        """
        if self.model_api_key is None:
            return None
        match = _ENV_REF.match(self.model_api_key)
        if not match:
            return self.model_api_key
        value = os.environ.get(match.group(1))
        if value is None:
            raise ConfigError(
                f"model_api_key refers to ${match.group(1)}, which is not set in the environment"
            )
        return value

    def redacted(self) -> dict[str, Any]:
        """The config as a dict, safe to record in a transcript (a literal key is masked)."""
        data = self.model_dump(mode="json")
        key = data.get("model_api_key")
        if key and not _ENV_REF.match(key):
            data["model_api_key"] = "***"
        return data

    # ---- files --------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> EvaluationRunConfig:
        """Read a run config file, with errors that name the file and the field."""
        path = Path(path)
        try:
            raw = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"run config {path}: cannot read: {exc.strerror or exc}") from exc
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"run config {path}: not valid JSON (line {exc.lineno}, column {exc.colno}): "
                f"{exc.msg}"
            ) from exc
        if not isinstance(data, dict):
            raise ConfigError(f"run config {path}: must be a JSON object")
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> EvaluationRunConfig:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, f"run config {source}")) from exc

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the config as JSON (atomically)."""
        from karotte.io import write_text_atomic

        write_text_atomic(Path(path), self.model_dump_json(indent=2) + "\n")


def format_validation_error(exc: ValidationError, where: str) -> str:
    """One line per problem: ``<where>: field 'a.b': <message>``."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(part) for part in err["loc"]) or "(root)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check its spelling; see `karotte create-run-config --help`)"
        elif err["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"{where}: field '{loc}': {msg}")
    return "\n".join(lines)
