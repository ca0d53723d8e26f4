"""Sandbox overhead of ``karotte run`` against the raw engine, on the same image.

(a) ``karotte run`` with a cached image, from launch until the first model call (the first
    assistant ``message_added`` minus its model latency), vs ``<engine> run --rm IMAGE true``;
(b) a bash tool call in a running sandbox (its ``tool_call_completed.duration_s``, from a fake
    model that makes N ``true`` calls) vs ``<engine> exec CONTAINER true``.

Medians of ``--repeat`` (>= 10) runs after one warm-up, all in one invocation; prints the ratios.

    uv run python bench/bench_runtime.py [--runtime docker] [--env-dir DIR] [--repeat 10]

Without ``--env-dir`` an environment is made from the ``default`` template in a temp dir and
built once (minutes the first time; the layer cache makes later runs quick).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

KAROTTE = str(Path(sys.executable).parent / "karotte")
TASK = "example-task"
BENCH_TAG = "karotte-bench/default:latest"
TOOL_CALLS = 20

FAKE_MODEL_PATCH = f"""

# --- added by bench/bench_runtime.py: {TOOL_CALLS} bash `true` calls before the real script
_bench_original_get_messages = get_messages


def get_messages(config):  # type: ignore[no-redef]
    calls = [
        assistant(None, [tool_call(f"bench_{{i}}", "bash", command="true")])
        for i in range({TOOL_CALLS})
    ]
    return calls + _bench_original_get_messages(config)
"""


def engine_binary(runtime: str) -> list[str]:
    if runtime == "docker:gvisor":
        return ["docker"]
    return [runtime]


def engine_run_args(runtime: str) -> list[str]:
    return ["--runtime=runsc"] if runtime == "docker:gvisor" else []


def timed(argv: list[str], **kwargs: object) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, **kwargs)  # type: ignore[call-overload]
    return time.perf_counter() - started


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def make_env(workdir: Path) -> Path:
    env_dir = workdir / "bench-env"
    subprocess.run([KAROTTE, "create-env", str(env_dir)], check=True, capture_output=True)
    return env_dir


def build(env_dir: Path, runtime: str) -> str:
    engine = "docker" if runtime.startswith("docker") else runtime
    print(f"building {env_dir} with {engine} (cached after the first time)…", file=sys.stderr)
    subprocess.run(
        [KAROTTE, "build", "--runtime", engine, "--tag", BENCH_TAG, str(env_dir)],
        check=True,
        capture_output=True,
    )
    return BENCH_TAG


def karotte_run(
    env_dir: Path, runtime: str, image: str | None, out: Path, dev: bool = False
) -> tuple[float, dict[str, object]]:
    """Wall seconds of one ``karotte run`` and its transcript; the launch time is recorded in
    the transcript-relative figures by the caller."""
    argv = [KAROTTE, "run", "--task", TASK, "--fake-model", "--runtime", runtime, "--no-ui"]
    argv += ["--out", str(out)]
    if image:
        argv += ["--image", image]
    if dev:
        argv.append("--dev")
    started = time.time()
    subprocess.run(argv, cwd=env_dir, check=False, capture_output=True)
    transcript = json.loads((out / "transcript.json").read_text())
    transcript["_launched_at"] = started
    return time.time() - started, transcript


def first_model_call_s(transcript: dict[str, object]) -> float:
    events = transcript["events"]
    assert isinstance(events, list)
    for event in events:
        if event["type"] == "message_added" and event["message"]["role"] == "assistant":
            called_at = event["timestamp"] - (event.get("model_latency_s") or 0.0)
            return float(called_at - transcript["_launched_at"])  # type: ignore[operator]
    raise RuntimeError(f"no model call in the transcript (status {transcript.get('status')})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", default="docker")
    parser.add_argument("--env-dir", type=Path)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--image", help="use this (already built) image; skips the build")
    args = parser.parse_args()
    if args.repeat < 10:
        parser.error("--repeat must be at least 10")
    runtime: str = args.runtime
    engine = engine_binary(runtime)
    workdir = Path(tempfile.mkdtemp(prefix="karotte-bench-"))
    try:
        env_dir = args.env_dir.resolve() if args.env_dir else make_env(workdir)
        image = args.image or build(env_dir, runtime)

        # (a) launch → first model call, vs a raw `run --rm IMAGE true`
        raw_run = [
            *engine,
            "run",
            "--rm",
            "--network=none",
            *engine_run_args(runtime),
            image,
            "true",
        ]
        timed(raw_run)  # warm-up
        raw_runs = [timed(raw_run) for _ in range(args.repeat)]
        first_calls: list[float] = []
        totals: list[float] = []
        first_calls_built: list[float] = []
        for i in range(args.repeat + 1):
            total, transcript = karotte_run(env_dir, runtime, image, workdir / f"a{i}")
            if i == 0:
                continue  # warm-up
            first_calls.append(first_model_call_s(transcript))
            totals.append(total)
        for i in range(0 if args.image else args.repeat):
            # the default flow: no --image, the launcher checks the (cached) build itself
            _total, transcript = karotte_run(env_dir, runtime, None, workdir / f"b{i}")
            first_calls_built.append(first_model_call_s(transcript))

        # (b) a bash tool call in a running sandbox vs `exec CONTAINER true`
        bench_env = workdir / "tool-env"
        shutil.copytree(env_dir, bench_env, ignore=shutil.ignore_patterns("out", ".venv"))
        fake_model = bench_env / "src" / "environment" / "fake_model.py"
        fake_model.write_text(fake_model.read_text() + FAKE_MODEL_PATCH)
        _total, transcript = karotte_run(bench_env, runtime, image, workdir / "tools", dev=True)
        tool_durations = [
            e["duration_s"]
            for e in transcript["events"]  # type: ignore[attr-defined]
            if e["type"] == "tool_call_completed" and str(e["call_id"]).startswith("bench_")
        ][1:]  # the first call also starts the shell
        if len(tool_durations) < args.repeat:
            raise RuntimeError(f"only {len(tool_durations)} bench tool calls ran: {transcript}")
        name = f"karotte-bench-{uuid.uuid4().hex[:8]}"
        subprocess.run(
            [
                *engine,
                "run",
                "-d",
                "--name",
                name,
                "--network=none",
                *engine_run_args(runtime),
                image,
                "sleep",
                "infinity",
            ],
            check=True,
            capture_output=True,
        )
        try:
            timed([*engine, "exec", name, "true"])  # warm-up
            raw_execs = [timed([*engine, "exec", name, "true"]) for _ in range(args.repeat)]
        finally:
            subprocess.run([*engine, "rm", "-f", name], check=False, capture_output=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    cpu = platform.processor() or platform.machine()
    print(
        f"machine: {platform.node()} {platform.system()} {platform.release()} {cpu}, "
        f"{os.cpu_count()} CPUs; runtime {runtime}; medians of {args.repeat}"
    )
    a_karotte, a_raw = median_ms(first_calls), median_ms(raw_runs)
    a_built = median_ms(first_calls_built) if first_calls_built else float("nan")
    b_tool, b_raw = median_ms(tool_durations), median_ms(raw_execs)
    print(f"(a) karotte run --image IMAGE → first model call: {a_karotte:7.0f} ms")
    if first_calls_built:
        print(f"    karotte run (cached build check) → first call: {a_built:6.0f} ms")
    print(f"    whole karotte run (example-task, fake model): {median_ms(totals):5.0f} ms")
    print(f"    raw `{engine[0]} run --rm IMAGE true`: {a_raw:18.0f} ms")
    ratio = f"{a_karotte / a_raw:.1f}x"
    if first_calls_built:
        ratio += f" (with the build check {a_built / a_raw:.1f}x)"
    print(f"    ratio karotte/raw: {ratio}")
    print(f"(b) bash tool call `true` in the sandbox: {b_tool:10.1f} ms")
    print(f"    raw `{engine[0]} exec CONTAINER true`: {b_raw:13.1f} ms")
    print(f"    ratio tool/exec: {b_tool / b_raw:.3f}x (the shell is persistent: no exec per call)")


if __name__ == "__main__":
    main()
