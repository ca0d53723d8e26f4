"""The ``qemu`` runtime's start-up against a bare QEMU boot of the same guest kernel, in one run.

(a) bare boot: ``qemu-system-x86_64 -M microvm`` with karotte's guest kernel and initramfs, from
    process start until the init prints its marker on the serial console (``karotte.probe=1``:
    the init loads nothing, mounts nothing, and powers off); median of ``--boots``;
(b) ``karotte run --runtime qemu --image IMAGE --fake-model`` of ``example-task``, from launch
    until the first model call (measured on the host: the first assistant reply or tool call of
    the fake model shows on the launcher's output), with milestones (guest init ready, task
    started, limits applied); median of ``--repeat`` after one warm-up (the warm-up also builds
    the root drive if needed, which is reported separately).

    uv run python bench/bench_vm.py [--env-dir DIR] [--image TAG] [--repeat 3] [--boots 5]

Without ``--env-dir`` an environment is made from the ``default`` template and built with docker.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KAROTTE = str(Path(sys.executable).parent / "karotte")
TASK = "example-task"
BENCH_TAG = "karotte-bench/default:latest"
MILESTONES = {
    "guest init ready": "[vm] guest ready",
    "task started": "▶ task",
    "limits applied": "limits:",
    "first model call": "→ ",
}


def bare_boots(count: int) -> list[float]:
    from karotte.host.runtimes.qemu import boot_to_marker
    from karotte.host.vm.kernel import prepare_kernel

    kernel = prepare_kernel()
    times = []
    for _ in range(count + 1):
        probe = boot_to_marker(kernel, os.environ.get("KAROTTE_QEMU_ACCEL", "tcg"), 60)
        if not probe.ok:
            raise SystemExit(f"bare boot failed: {probe.detail}")
        times.append(probe.seconds)
    return times[1:]


def timed_run(env_dir: Path, image: str, out: Path) -> tuple[dict[str, float], float, int]:
    argv = [KAROTTE, "run", "--task", TASK, "--fake-model", "--runtime", "qemu", "--no-ui"]
    argv += ["--out", str(out), "--image", image]
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=env_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    seen: dict[str, float] = {}
    for line in proc.stdout:
        for name, marker in MILESTONES.items():
            if name not in seen and line.lstrip().startswith(marker):
                seen[name] = time.monotonic() - started
    code = proc.wait()
    return seen, time.monotonic() - started, code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-dir", type=Path)
    parser.add_argument("--image")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--boots", type=int, default=5)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="karotte-bench-vm-"))
    env_dir = args.env_dir
    if env_dir is None:
        env_dir = workdir / "bench-env"
        subprocess.run([KAROTTE, "create-env", str(env_dir)], check=True, capture_output=True)
    image = args.image
    if image is None:
        print("building the environment with docker (cached after the first time)…")
        subprocess.run(
            [KAROTTE, "build", "--runtime", "docker", "--tag", BENCH_TAG, str(env_dir)],
            check=True,
            capture_output=True,
        )
        image = BENCH_TAG
    load = os.getloadavg()[0]
    print(f"host: {platform.node()} {platform.release()}, {os.cpu_count()} CPUs, load {load:.1f}")
    boots = bare_boots(args.boots)
    warm_seen, warm_total, warm_code = timed_run(env_dir.resolve(), image, workdir / "out-warm")
    runs = []
    for i in range(args.repeat):
        seen, total, code = timed_run(env_dir.resolve(), image, workdir / f"out-{i}")
        if code != 0 or "first model call" not in seen:
            raise SystemExit(f"run {i} failed (exit {code}); see {workdir / f'out-{i}'}")
        runs.append((seen, total))
    print(f"(a) bare QEMU boot to the init's marker: median {statistics.median(boots):.2f} s "
          f"({', '.join(f'{b:.2f}' for b in boots)})")  # fmt: skip
    print(f"    warm-up run (builds the root drive if not cached): {warm_total:.1f} s, "
          f"exit {warm_code}, milestones {warm_seen}")  # fmt: skip
    for name in MILESTONES:
        values = [seen[name] for seen, _ in runs if name in seen]
        if values:
            print(f"(b) launch → {name:17s}: median {statistics.median(values):6.1f} s "
                  f"({', '.join(f'{v:.1f}' for v in values)})")  # fmt: skip
    totals = [total for _, total in runs]
    print(f"    whole `karotte run`: median {statistics.median(totals):.1f} s")
    first = statistics.median([seen["first model call"] for seen, _ in runs])
    print(f"    ratio first model call / bare boot: {first / statistics.median(boots):.0f}x")
    print(f"    host load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
