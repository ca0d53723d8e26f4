"""Finding the environment's tasks, fake-model script and custom tools.

An environment is an installed Python package named ``environment`` whose ``get_tasks()`` returns
the Task classes. ``environment.fake_model.get_messages(config)`` scripts the fake model and the
``environment.tools`` package holds custom tools.
"""

from __future__ import annotations

import importlib
import traceback
from types import ModuleType

from karotte.config import EvaluationRunConfig
from karotte.errors import TaskLoadError
from karotte.schemas import Message
from karotte.task import Task

ENVIRONMENT_PACKAGE = "environment"


def import_environment(name: str = ENVIRONMENT_PACKAGE) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            raise TaskLoadError(
                f"no `{name}` package is installed. Run karotte from an environment made by "
                "`karotte create-env` (after `uv sync`), or install the environment package."
            ) from exc
        raise TaskLoadError(f"importing `{name}` failed:\n{traceback.format_exc()}") from exc
    except Exception as exc:
        raise TaskLoadError(f"importing `{name}` failed:\n{traceback.format_exc()}") from exc


def load_tasks(package: str = ENVIRONMENT_PACKAGE) -> dict[str, type[Task]]:
    """All Task classes of the environment, by id. Duplicate ids and non-tasks are errors."""
    module = import_environment(package)
    get_tasks = getattr(module, "get_tasks", None)
    if not callable(get_tasks):
        raise TaskLoadError(f"`{package}` has no get_tasks() function")
    try:
        classes = list(get_tasks())
    except Exception as exc:
        raise TaskLoadError(f"{package}.get_tasks() raised:\n{traceback.format_exc()}") from exc
    tasks: dict[str, type[Task]] = {}
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, Task)):
            raise TaskLoadError(
                f"{package}.get_tasks() returned {cls!r}, which is not a Task class"
            )
        task_id = getattr(cls, "id", None)
        if not isinstance(task_id, str):
            raise TaskLoadError(f"task class {cls.__qualname__} has no string `id`")
        if task_id in tasks:
            raise TaskLoadError(
                f"two tasks share the id {task_id!r}: {tasks[task_id].__qualname__} and "
                f"{cls.__qualname__}"
            )
        tasks[task_id] = cls
    return tasks


def find_task(task_id: str, package: str = ENVIRONMENT_PACKAGE) -> type[Task]:
    tasks = load_tasks(package)
    if task_id not in tasks:
        known = ", ".join(sorted(tasks)) or "(none)"
        raise TaskLoadError(f"no task with id {task_id!r}; known tasks: {known}")
    return tasks[task_id]


def fake_model_script(
    config: EvaluationRunConfig, package: str = ENVIRONMENT_PACKAGE
) -> list[Message]:
    """The scripted messages of ``<package>.fake_model.get_messages(config)``."""
    try:
        module = importlib.import_module(f"{package}.fake_model")
    except Exception as exc:
        raise TaskLoadError(
            f"use_fake_model is set but `{package}.fake_model` cannot be imported: {exc}"
        ) from exc
    get_messages = getattr(module, "get_messages", None)
    if not callable(get_messages):
        raise TaskLoadError(f"`{package}.fake_model` has no get_messages(config) function")
    try:
        return [
            m if isinstance(m, Message) else Message.model_validate(m) for m in get_messages(config)
        ]
    except Exception as exc:
        raise TaskLoadError(f"{package}.fake_model.get_messages() failed: {exc}") from exc
