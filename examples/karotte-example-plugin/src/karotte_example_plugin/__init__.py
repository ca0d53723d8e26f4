"""Every Karotte plugin hook, each in a few lines (see docs/plugins.md)."""

from __future__ import annotations

import os
from typing import Any

import typer

from karotte.config import EvaluationRunConfig
from karotte.plugins import HardwareLimits
from karotte.task import Hardware

cli = typer.Typer(help="Commands of the example platform.", no_args_is_help=True)


@cli.command()
def hello(name: str = typer.Argument("world")) -> None:
    """Say hello (proves the sub-command is wired in)."""
    typer.echo(f"hello {name} from the example platform")


@cli.command()
def version() -> None:
    """Print this plugin's version."""
    typer.echo("karotte-example-plugin 0.1.0")


def platform_defaults(config: EvaluationRunConfig) -> EvaluationRunConfig:
    """Tag every run and cap its turns (a run-config preprocessor)."""
    extra = {**config.extra_config, "platform": "example"}
    return config.model_copy(
        update={"extra_config": extra, "max_turns": min(config.max_turns, 200)}
    )


def proxy_url() -> str | None:
    return os.environ.get("EXAMPLE_PROXY_URL") or None


def secret_env() -> list[str]:
    return ["EXAMPLE_PLATFORM_TOKEN"]


def default_hardware() -> Hardware:
    return Hardware(cpus=2, memory_gib=2)


def hardware_limits(hardware: Hardware | None) -> HardwareLimits:
    return HardwareLimits(memory_gib=8, disk_gib=20)


def container_run_args(task: Any, runtime: str) -> list[str]:
    task_id = task if isinstance(task, str) else getattr(task, "id", "")
    if str(task_id).startswith("gpu-") and runtime != "docker":
        raise RuntimeError(f"GPU tasks run on docker only here, not on {runtime}")
    return ["--label", "platform=example"]
