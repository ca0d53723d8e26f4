"""The task API: what an environment author writes.

A :class:`Task` has a system prompt, tool names and a list of :class:`Step` objects; each step has
instructions and a judge. Both are created with the run config and can read
``config.use_hints`` and ``config.extra_config``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from karotte.config import EvaluationRunConfig
from karotte.errors import TaskDefinitionError

if TYPE_CHECKING:
    from karotte.judges import Judge


class Hardware(BaseModel):
    """What a task needs from the sandbox. ``None`` fields use the runtime's defaults."""

    model_config = ConfigDict(extra="forbid")

    cpus: float | None = Field(default=None, gt=0)
    memory_gib: float | None = Field(default=None, gt=0)
    disk_gib: float | None = Field(default=None, gt=0)
    max_processes: int | None = Field(default=None, gt=0)


def _require_properties(cls: type, names: tuple[str, ...]) -> None:
    """Refuse a subclass that declares one of ``names`` as a plain method or attribute-less."""
    for name in names:
        if name not in cls.__dict__:
            continue
        value = cls.__dict__[name]
        if not isinstance(value, property):
            kind = "a method" if callable(value) else f"a {type(value).__name__} attribute"
            raise TaskDefinitionError(
                f"{cls.__module__}.{cls.__qualname__}.{name} must be a @property, "
                f"but it is declared as {kind}. Write:\n\n"
                f"    @property\n    def {name}(self): ..."
            )


class Step:
    """One step of a task: instructions for the student and a judge that scores the result."""

    _properties: ClassVar[tuple[str, ...]] = ("instructions", "judge", "submission_paths")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _require_properties(cls, Step._properties)

    def __init__(self, config: EvaluationRunConfig) -> None:
        self.config = config

    @property
    def instructions(self) -> str:
        raise NotImplementedError(f"{type(self).__qualname__} must define `instructions`")

    @property
    def judge(self) -> Judge:
        raise NotImplementedError(f"{type(self).__qualname__} must define `judge`")

    @property
    def submission_paths(self) -> list[str]:
        """Absolute paths the student submits; taken into custody before scoring."""
        return []

    def pre_scoring_hook(self) -> dict[str, Any] | None:
        """Runs as root after the student is done and before the judge. Its dict is recorded."""
        return None

    def post_hook(self) -> dict[str, Any] | None:
        """Runs after scoring. Its dict is recorded."""
        return None


class Task:
    """A task: a system prompt, tools and steps. Subclass it and set ``id``."""

    id: ClassVar[str]
    _properties: ClassVar[tuple[str, ...]] = (
        "system_prompt",
        "steps",
        "tools",
        "required_hardware",
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _require_properties(cls, Task._properties)
        task_id = cls.__dict__.get("id")
        if task_id is not None and (not isinstance(task_id, str) or not task_id.strip()):
            raise TaskDefinitionError(
                f"{cls.__module__}.{cls.__qualname__}.id must be a non-empty string"
            )

    def __init__(self, config: EvaluationRunConfig) -> None:
        if not isinstance(getattr(type(self), "id", None), str):
            raise TaskDefinitionError(
                f"{type(self).__module__}.{type(self).__qualname__} has no `id` class attribute"
            )
        self.config = config

    @property
    def system_prompt(self) -> str:
        raise NotImplementedError(f"{type(self).__qualname__} must define `system_prompt`")

    @property
    def steps(self) -> list[Step]:
        raise NotImplementedError(f"{type(self).__qualname__} must define `steps`")

    @property
    def tools(self) -> list[str]:
        """Names of the tools the student gets (built-in or from ``environment.tools``)."""
        return ["bash"]

    @property
    def required_hardware(self) -> Hardware | None:
        return None

    def pre_hook(self) -> dict[str, Any] | None:
        """Runs as root before the first step (prepare files, seed data). Its dict is recorded."""
        return None

    def configure_tools(self) -> dict[str, dict[str, Any]]:
        """Per-tool options, e.g. ``{"bash": {"timeout_s": 60}}``."""
        return {}


def effective_system_prompt(task: Task) -> str:
    """The system prompt after the built-in ``extra_config`` keys are applied."""
    extra = task.config.extra_config
    prompt = extra.get("system_prompt_override")
    text = str(prompt) if prompt is not None else task.system_prompt
    if extra.get("extra_system_prompt"):
        text = f"{text}\n\n{extra['extra_system_prompt']}"
    return text


def effective_instructions(step: Step, index: int) -> str:
    """Step instructions after ``instructions_override`` / ``extra_task_instructions``.

    ``instructions_override`` is a list (one entry per step, ``null`` keeps the step's own) or a
    dict keyed by step index (as int or string).
    """
    extra = step.config.extra_config
    override = extra.get("instructions_override")
    text = step.instructions
    if isinstance(override, list) and index < len(override) and override[index] is not None:
        text = str(override[index])
    elif isinstance(override, dict):
        value = override.get(index, override.get(str(index)))
        if value is not None:
            text = str(value)
    elif isinstance(override, str):
        text = override
    if extra.get("extra_task_instructions"):
        text = f"{text}\n\n{extra['extra_task_instructions']}"
    return text
