"""``karotte run`` and ``karotte create-run-config``."""

from __future__ import annotations

from pathlib import Path

import typer

from karotte.cli import app
from karotte.cli._common import err_console, fail, friendly_errors
from karotte.config import EvaluationRunConfig
from karotte.errors import ConfigError

LOCAL_WARNING = (
    "[bold red on yellow] WARNING [/] [bold]--runtime local runs the student's tool calls in this "
    "process, on this machine, with NO isolation.[/] Use it only to develop tasks with a trusted "
    "model or the fake model."
)


def _build_config(
    config_path: Path | None,
    task: str | None,
    model: str | None,
    fake_model: bool,
    api_key: str | None,
    transcript: Path | None,
) -> EvaluationRunConfig:
    if config_path is not None:
        config = EvaluationRunConfig.load(config_path)
        overrides: dict[str, object] = {}
        if task:
            overrides["task_id"] = task
        if model:
            overrides["model"] = model
        if fake_model:
            overrides["use_fake_model"] = True
        if api_key:
            overrides["model_api_key"] = api_key
        if transcript:
            overrides["transcript_file"] = transcript
        return EvaluationRunConfig.from_dict(
            {**config.model_dump(), **overrides}, source=str(config_path)
        )
    if not task:
        raise ConfigError(
            "give --config run_config.json, or --task ID (and --model or --fake-model)"
        )
    if not model and not fake_model:
        raise ConfigError(
            "give --model PROVIDER/NAME, or --fake-model to replay the scripted model"
        )
    data: dict[str, object] = {"task_id": task, "use_fake_model": fake_model}
    if model:
        data["model"] = model
    if api_key:
        data["model_api_key"] = api_key
    if transcript:
        data["transcript_file"] = transcript
    return EvaluationRunConfig.from_dict(data, source="command line")


@app.command()
def run(
    config_path: Path | None = typer.Option(None, "--config", "-c", help="Run config JSON file."),
    task: str | None = typer.Option(None, "--task", "-t", help="Task id."),
    model: str | None = typer.Option(None, "--model", "-m", help="Model id, provider/name."),
    fake_model: bool = typer.Option(False, "--fake-model", help="Replay the scripted fake model."),
    api_key: str | None = typer.Option(None, "--model-api-key", help="Key or $VAR reference."),
    transcript: Path | None = typer.Option(None, "--transcript", help="Transcript JSON path."),
    runtime: str | None = typer.Option(
        None, "--runtime", "-r", help="Sandbox runtime (local = none)."
    ),
    no_containerized: bool = typer.Option(
        False, "--no-containerized", help="Run the harness here (used inside the sandbox)."
    ),
    events: str = typer.Option("rich", "--events", help="Event output: rich, jsonl or none."),
) -> None:
    """Run a task: build the image, start a sandbox, drive the model, score, write the transcript."""
    from karotte.sandbox.entry import run_harness

    if events not in ("rich", "jsonl", "none"):
        raise fail("--events takes rich, jsonl or none")
    with friendly_errors():
        config = _build_config(config_path, task, model, fake_model, api_key, transcript)
    if not no_containerized and runtime != "local":
        raise fail(
            "container runtimes are not available yet in this version; use --runtime local "
            "(no isolation) for now"
        )
    if runtime == "local":
        err_console.print(LOCAL_WARNING)
    completed = run_harness(config, events=events)  # type: ignore[arg-type]
    err_console.print(f"transcript: {config.transcript_file}")
    if completed.status == "error":
        raise typer.Exit(1)


@app.command("create-run-config")
def create_run_config(
    output: Path = typer.Option(Path("run_config.json"), "--output", "-o", help="File to write."),
    task: str = typer.Option(..., "--task", "-t", help="Task id."),
    model: str = typer.Option("fake/scripted", "--model", "-m", help="Model id, provider/name."),
    api_key: str | None = typer.Option(None, "--model-api-key", help="Key or $VAR reference."),
    fake_model: bool = typer.Option(False, "--fake-model", help="Replay the scripted fake model."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Write a run config with defaults for every field (edit it, then `karotte run --config`)."""
    if output.exists() and not force:
        raise fail(f"{output} exists; pass --force to overwrite it")
    with friendly_errors():
        config = EvaluationRunConfig(
            task_id=task, model=model, model_api_key=api_key, use_fake_model=fake_model
        )
        config.save(output)
    err_console.print(f"wrote {output}")
