"""Benchmark (c) of the container-runtimes issue: an unchanged-environment rebuild.

Compares, on the same build context and the same warm layer cache:

* ``karotte build DIR`` as a command (Python start-up + base-image check + wheelhouse check +
  engine build),
* ``build_environment()`` in-process (what ``karotte run`` pays before starting a sandbox),
* a raw cached ``docker build`` of the same Containerfile with the same build arguments.

Usage: ``uv run python bench/bench_build.py [--env DIR] [--runtime docker] [-n 10]``.
Without ``--env`` an environment is made with ``karotte create-env`` in a temporary directory
(its first build, before the measurements, takes minutes).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from karotte.host.build import build_environment, find_containerfile, resolve_runtime


def _timed(action: Callable[[], object], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return samples


def _karotte_cli() -> list[str]:
    found = shutil.which("karotte")
    return [found] if found else [sys.executable, "-c", "from karotte.cli import main; main()"]


def _describe(name: str, samples: list[float]) -> str:
    return (
        f"{name:<42} median {statistics.median(samples) * 1000:8.0f} ms   "
        f"min {min(samples) * 1000:6.0f}   max {max(samples) * 1000:6.0f}   (n={len(samples)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", type=Path, help="environment directory (default: create one)")
    parser.add_argument("--runtime", default="docker")
    parser.add_argument("-n", "--runs", type=int, default=10)
    options = parser.parse_args()
    if options.runtime not in ("docker", "docker:gvisor"):
        parser.error("the raw comparison uses the docker CLI: --runtime docker or docker:gvisor")

    tmp = Path(tempfile.mkdtemp(prefix="karotte-bench-build-"))
    env_dir: Path = options.env or tmp / "bench-env"
    if options.env is None:
        print(f"creating an environment in {env_dir}", flush=True)
        subprocess.run([*_karotte_cli(), "create-env", str(env_dir)], check=True)
    runtime = resolve_runtime(options.runtime)
    tag = f"karotte-bench/build-{os.getpid()}:latest"

    print("warm-up build (fills the layer cache; the first one takes minutes)", flush=True)
    built = build_environment(env_dir, runtime, tag=tag)
    print(f"  {built.tag}: {built.steps} steps, base {built.base_image}", flush=True)

    raw_argv = ["docker", "build", "-q", "--network=host", "-f", str(find_containerfile(env_dir))]
    raw_argv += ["-t", tag, "--build-arg", f"BASE_IMAGE={built.base_image}", str(env_dir)]
    raw_env = {**os.environ, "DOCKER_BUILDKIT": "0"}  # the builder karotte's docker runtime uses
    cli_argv = [*_karotte_cli(), "build", str(env_dir), "--runtime", options.runtime]
    cli_argv += ["--tag", tag]

    def raw() -> None:
        subprocess.run(raw_argv, env=raw_env, check=True, capture_output=True)

    def in_process() -> None:
        result = build_environment(env_dir, runtime, tag=tag)
        assert result.image_id == built.image_id, "the environment changed during the benchmark"

    def cli() -> None:
        subprocess.run(cli_argv, check=True, capture_output=True)

    def startup() -> None:
        subprocess.run([*_karotte_cli(), "--version"], check=True, capture_output=True)

    raw()  # one untimed run of each, so every path is equally warm
    in_process()
    cli()
    results = {
        "raw `docker build` (cached)": _timed(raw, options.runs),
        "build_environment() in-process": _timed(in_process, options.runs),
        "`karotte build` command": _timed(cli, options.runs),
        "`karotte --version` (CLI start-up only)": _timed(startup, options.runs),
    }
    subprocess.run(["docker", "image", "rm", tag], capture_output=True, check=False)
    shutil.rmtree(tmp, ignore_errors=True)

    server = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True
    ).stdout.strip()
    print()
    print(
        f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"kernel {platform.release()}, docker {server}, Python {platform.python_version()}"
    )
    for name, samples in results.items():
        print(_describe(name, samples))
    base = statistics.median(results["raw `docker build` (cached)"])
    for name in ("build_environment() in-process", "`karotte build` command"):
        print(f"ratio {name} / raw docker build: {statistics.median(results[name]) / base:.2f}x")


if __name__ == "__main__":
    main()
