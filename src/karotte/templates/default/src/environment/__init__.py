"""The environment package: Karotte finds the tasks through `get_tasks()`.

Every package under `environment/tasks/` whose name does not start with `_` is a task package
and lists its Task classes in `TASKS`. `INCLUDE_TASKS` / `EXCLUDE_TASKS` (comma-separated task
ids, environment variables) narrow the list, e.g. `EXCLUDE_TASKS=example-task`.
"""

from __future__ import annotations

import importlib
import os
import pkgutil

from karotte.task import Task

__all__ = ["get_tasks"]


def _ids(variable: str) -> set[str]:
    return {part.strip() for part in os.environ.get(variable, "").split(",") if part.strip()}


def all_tasks() -> list[type[Task]]:
    """Every task class of the environment, whatever INCLUDE_TASKS / EXCLUDE_TASKS say."""
    from environment import tasks as tasks_package

    found: list[type[Task]] = []
    for module_info in sorted(pkgutil.iter_modules(tasks_package.__path__), key=lambda m: m.name):
        if module_info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{tasks_package.__name__}.{module_info.name}")
        found.extend(getattr(module, "TASKS", []))
    return found


def get_tasks() -> list[type[Task]]:
    """The tasks to offer, after INCLUDE_TASKS and EXCLUDE_TASKS."""
    tasks = all_tasks()
    include, exclude = _ids("INCLUDE_TASKS"), _ids("EXCLUDE_TASKS")
    unknown = (include | exclude) - {task.id for task in tasks}
    if unknown:
        raise ValueError(
            f"INCLUDE_TASKS/EXCLUDE_TASKS name unknown task ids: {', '.join(sorted(unknown))}"
        )
    return [t for t in tasks if (not include or t.id in include) and t.id not in exclude]
