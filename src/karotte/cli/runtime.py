"""``karotte build``, ``karotte base``, ``karotte clean``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.markup import escape

from karotte.cli import app
from karotte.cli._common import err_console, fail, friendly_errors
from karotte.errors import ConfigError


def _parse_build_args(values: list[str]) -> dict[str, str]:
    args: dict[str, str] = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise ConfigError(f"--build-arg takes KEY=VALUE, got {value!r}")
        args[key] = val
    return args


@contextmanager
def _progress_display(
    verbose: bool,
) -> Iterator[tuple[Callable[[str], None], Callable[[str], None]]]:
    """``(on_progress, on_output)``: a spinner with the current phase, or every line with -v."""
    started = time.monotonic()
    if verbose:

        def progress(line: str) -> None:
            err_console.print(f"[bold cyan]»[/] {escape(line)}")

        def output(line: str) -> None:
            err_console.print(escape(line), soft_wrap=True)

        yield progress, output
        return
    if not err_console.is_terminal:  # logs (CI): one plain line per phase and step, no spinner

        def progress_plain(line: str) -> None:
            err_console.print(f"[dim]{time.monotonic() - started:5.1f}s[/] {escape(line)}")

        yield progress_plain, lambda _line: None
        return
    with err_console.status("starting", spinner="dots") as status:

        def progress_quiet(line: str) -> None:
            elapsed = time.monotonic() - started
            short = line if len(line) <= 100 else line[:99] + "…"
            status.update(f"[dim]{elapsed:5.1f}s[/] {escape(short)}")
            if line.startswith("warning:"):
                err_console.print(f"[yellow]{escape(line)}[/]")

        yield progress_quiet, lambda _line: None


@app.command("base")
def base_command(
    suite: str = typer.Option("bookworm", "--suite", help="Debian suite of the base image."),
    runtime: str = typer.Option(
        None, "--runtime", help="Engine to import the image into (default: the default runtime)."
    ),
    force: bool = typer.Option(False, "--force", help="Rebuild even if the image is current."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Show mmdebstrap's output."),
) -> None:
    """Make the base image karotte/base:SUITE locally from Debian packages (no registry needed)."""
    from karotte.host.base_image import ensure_base_image
    from karotte.host.build import resolve_runtime

    with friendly_errors():
        engine = resolve_runtime(runtime)
        engine.ensure_available()
        with _progress_display(verbose) as (progress, output):
            result = ensure_base_image(
                engine, suite, force=force, on_progress=progress, on_output=output
            )
    if result.built:
        how = " (root filesystem from cache)" if result.rootfs_cached else ""
        err_console.print(
            f"[green]built[/] {result.tag} = {result.pinned_tag} in {engine.name} "
            f"in {result.duration_s:.1f}s{how}"
        )
    else:
        err_console.print(
            f"[green]up to date[/]: {result.tag} = {result.pinned_tag} in {engine.name} "
            "(--force rebuilds it)"
        )


@app.command("build")
def build_command(
    env_dir: Path = typer.Argument(
        Path("."), help="The environment directory (holds the Containerfile)."
    ),
    tag: str = typer.Option(
        None, "--tag", "-t", help="Image tag (default karotte-env/NAME:latest)."
    ),
    runtime: str = typer.Option(
        None, "--runtime", help="docker, podman or docker:gvisor (default: the default runtime)."
    ),
    build_arg: list[str] = typer.Option(
        [], "--build-arg", help="KEY=VALUE passed to the build, e.g. BASE_IMAGE=debian:bookworm."
    ),
    no_cache: bool = typer.Option(
        False, "--no-cache", help="Ignore the layer cache and remake the wheelhouse."
    ),
    python: str = typer.Option(
        None,
        "--python",
        help="The image's Python X.Y, for the wheelhouse (default: 3.11, the base image's).",
    ),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Show the engine's full output."),
) -> None:
    """Build the environment's image (the base image and the wheelhouse are made when needed)."""
    from karotte.host.build import ImageBuildError, build_environment

    with friendly_errors():
        args = _parse_build_args(build_arg)
        try:
            with _progress_display(verbose) as (progress, output):
                built = build_environment(
                    env_dir,
                    runtime=runtime,
                    tag=tag,
                    build_args=args,
                    no_cache=no_cache,
                    on_progress=progress,
                    on_output=output,
                    python_version=python,
                )
        except ImageBuildError as exc:
            raise fail(str(exc), code=1) from None
    cached = f", {built.cached_steps}/{built.steps} steps cached" if built.steps else ""
    err_console.print(
        f"[green]built[/] {escape(built.tag)} ({built.image_id[:19]}) with {built.runtime} "
        f"in {built.duration_s:.1f}s{cached}"
    )
    typer.echo(built.tag)
