"""``karotte run`` and ``karotte create-run-config``."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from karotte.cli import app
from karotte.cli._common import err_console, fail, friendly_errors
from karotte.config import EvaluationRunConfig
from karotte.errors import ConfigError

PROXY_ENV = "KAROTTE_PROXY_URL"
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
        None,
        "--runtime",
        "-r",
        help="Sandbox runtime: docker, podman, docker:gvisor, or local (no isolation). "
        "Default: the best one for this machine.",
    ),
    parallel: int = typer.Option(1, "-n", min=1, max=256, help="Number of parallel runs."),
    out: Path | None = typer.Option(
        None, "--out", help="Output dir (transcripts, run configs); default: the transcript's dir."
    ),
    env_dir: Path = typer.Option(Path("."), "--env-dir", help="The environment project."),
    image: str | None = typer.Option(None, "--image", help="Use this image; skip the build."),
    dev: bool = typer.Option(
        False, "--dev", help="No build: mount src/environment over the image's installed copy."
    ),
    mount: list[str] = typer.Option([], "--mount", help="Extra bind mount SRC:DST[:ro]."),
    keep_containers: bool = typer.Option(
        False, "--keep-containers", help="Leave the sandboxes after the run (for debugging)."
    ),
    prepare_only: bool = typer.Option(
        False, "--prepare-only", help="Start ready sandboxes and hold them open; no run."
    ),
    proxy: str | None = typer.Option(
        None, "--proxy", help="Model API proxy URL (also $KAROTTE_PROXY_URL)."
    ),
    no_proxy: bool = typer.Option(False, "--no-proxy", help="Ignore any configured proxy."),
    no_ui: bool = typer.Option(False, "--no-ui", help="Plain output, no live display."),
    no_containerized: bool = typer.Option(
        False, "--no-containerized", help="Run the harness here (used inside the sandbox)."
    ),
    events: str = typer.Option("rich", "--events", help="Event output: rich, jsonl or none."),
) -> None:
    """Run a task: build the image, start a sandbox, drive the model, score, write a transcript."""
    if no_containerized:
        # Inside the sandbox, before anything else: drop student-writable directories from
        # PATH/LD_*/PYTHON* and re-exec once, so no planted python3, sitecustomize.py or
        # library can run as root in the harness, its hooks or its judges.
        from karotte.sandbox.confinement.sanitize import sanitize_and_reexec

        sanitize_and_reexec()
    if events not in ("rich", "jsonl", "none"):
        raise fail("--events takes rich, jsonl or none")
    with friendly_errors():
        config = _build_config(config_path, task, model, fake_model, api_key, transcript)
        if not no_containerized:  # the launcher's side; the sandbox gets the result
            from karotte.plugins import preprocess_run_config

            config = preprocess_run_config(config)
    if no_containerized:
        _run_in_sandbox(config, events)
        return
    if runtime == "local":
        err_console.print(LOCAL_WARNING)
        from karotte.sandbox.entry import run_harness

        completed = run_harness(config, events=events)  # type: ignore[arg-type]
        err_console.print(f"transcript: {config.transcript_file}")
        if completed.status == "error":
            raise typer.Exit(1)
        return
    from karotte.host.launcher import Launcher, LaunchOptions, parse_mount
    from karotte.host.runtimes import select_default_runtime

    why = "asked for with --runtime"
    if runtime is None:
        runtime, why = select_default_runtime()
    proxy_url = None
    if not no_proxy:
        from karotte.plugins import default_proxy_url

        proxy_url = proxy or config.proxy_url or os.environ.get(PROXY_ENV) or default_proxy_url()
    with friendly_errors():
        options = LaunchOptions(
            runtime=runtime,
            runtime_why=why,
            env_dir=env_dir,
            out_dir=out,
            image=image,
            parallel=parallel,
            dev=dev,
            mounts=[parse_mount(m) for m in mount],
            keep_containers=keep_containers,
            prepare_only=prepare_only,
            proxy=proxy_url or None,
            ui=not no_ui,
        )
        result = Launcher(config, options).run()
    if result.exit_code != 0:
        raise typer.Exit(result.exit_code)


def _run_in_sandbox(config: EvaluationRunConfig, events: str) -> None:
    """The harness side of a sandboxed run (the launcher's command inside the sandbox)."""
    from karotte.sandbox.entry import run_harness
    from karotte.sandbox.proxy_relay import start_from_env

    start_from_env()
    completed = run_harness(
        config,
        events=events,  # type: ignore[arg-type]
        sandbox=os.environ.get("KAROTTE_SANDBOX"),
    )
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
