"""``exec`` into a running ``qemu`` VM against ``docker exec`` into a container of the same image.

(a) ``docker exec CONTAINER true`` (the raw engine), median of ``--repeat``;
(b) ``QemuRuntime.exec(sandbox, ["true"])`` (the ``karotte.exec`` virtio-serial port), median of
    ``--repeat`` once the guest answered its first exec, whose time from ``start()`` is the VM's
    time to a usable sandbox; ``id -u`` as the student is timed too.

    uv run python bench/bench_vm_exec.py [--image karotte/base:bookworm] [--repeat 20]

The image needs a ``python3`` (the guest's init); the base image has one.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
import uuid

from karotte.host.runtimes import SandboxSpec, get_runtime
from karotte.host.runtimes.base import LABEL_RUN_ID


def timed(fn: object, repeat: int) -> list[float]:
    assert callable(fn)
    out = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return out


def docker_exec(image: str, repeat: int) -> list[float]:
    name = f"karotte-bench-{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["docker", "run", "-d", "--rm", "--network", "none", "--name", name, image, "sleep", "600"],
        check=True,
        capture_output=True,
    )
    try:
        return timed(lambda: subprocess.run(["docker", "exec", name, "true"], check=True), repeat)
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


def qemu_exec(image: str, repeat: int) -> tuple[float, list[float], list[float]]:
    runtime = get_runtime("qemu")
    runtime.ensure_available()
    label = f"bench-{uuid.uuid4().hex[:8]}"
    spec = SandboxSpec(
        image=image,
        name=f"karotte-{label}",
        command=["sleep", "600"],
        labels={LABEL_RUN_ID: label},
        memory_bytes=1 << 30,
        disk_bytes=1 << 30,
    )
    started = time.perf_counter()
    sandbox = runtime.start(spec)
    try:
        assert runtime.exec(sandbox, ["true"]).returncode == 0
        first = time.perf_counter() - started
        as_root = timed(lambda: runtime.exec(sandbox, ["true"]), repeat)
        as_user = timed(lambda: runtime.exec(sandbox, ["id", "-u"], user="1000:1000"), repeat)
        return first, as_root, as_user
    finally:
        runtime.remove(sandbox)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="karotte/base:bookworm")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    raw = statistics.median(docker_exec(args.image, args.repeat))
    first, as_root, as_user = qemu_exec(args.image, args.repeat)
    vm = statistics.median(as_root)
    print(f"docker exec true:                 {raw:8.1f} ms (median of {args.repeat})")
    print(f"qemu exec true (root):            {vm:8.1f} ms  ({vm / raw:.2f}x docker exec)")
    print(f"qemu exec id -u (uid 1000):       {statistics.median(as_user):8.1f} ms")
    print(f"qemu start() to first exec reply: {first:8.1f} s (boot + guest init)")


if __name__ == "__main__":
    main()
