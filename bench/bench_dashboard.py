"""Dashboard speed in a real headless Chromium (Debian's, driven by Playwright).

* open: a transcript of ~10,000 events, from navigation to the run view showing its summary and
  first rows (``body[data-ready]``); cold (the server has not read the file yet) and warm.
* list: a directory of 1,000 transcripts of mixed sizes, from navigation to the table being
  filled; cold (nothing read yet: every file parsed) and warm (summaries cached by file
  identity, nothing changed).

    uv run --extra dev python bench/bench_dashboard.py [--events 10000] [--runs 1000] [--repeat 5]

Needs chromium (scripts/setup-browser.sh). Prints one line per figure.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from dashboard.factory import big_run, make_run

from karotte.host.dashboard import bind, create_app

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class Server:
    def __init__(self, root: Path) -> None:
        sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        app = create_app(root, allowed_hosts={"127.0.0.1"})
        self.server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        )
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def timed_open(context: Any, url: str) -> float:
    page = context.new_page()
    try:
        started = time.perf_counter()
        page.goto(url)
        page.wait_for_selector("body[data-ready]", timeout=60_000)
        return time.perf_counter() - started
    finally:
        page.close()


def make_many(root: Path, count: int) -> int:
    rng = random.Random(7)
    total = 0
    for i in range(count):
        steps = rng.randint(1, 3)
        path = make_run(
            root / f"batch-{i // 100}",
            run_id=f"run-{i:04d}",
            task_id=f"task-{i % 37}",
            model=rng.choice(["openai/gpt-a", "anthropic/claude-b", "local/qwen-c"]),
            scores=[rng.choice([0.0, 0.5, 1.0]) for _ in range(steps)],
            tool_calls_per_step=rng.randint(1, 15),
            output_chars=rng.randint(100, 3000),
        )
        total += path.stat().st_size
    return total


def figures(name: str, values: list[float]) -> str:
    return (
        f"{name}: median {statistics.median(values):.3f} s, min {min(values):.3f} s, "
        f"max {max(values):.3f} s (n={len(values)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("chromium not installed: run scripts/setup-browser.sh")

    from playwright.sync_api import sync_playwright

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    work = Path(tempfile.mkdtemp(prefix="karotte-bench-dashboard-"))
    profile = work / "profile"
    try:
        big_dir = work / "big"
        big_dir.mkdir()
        big = big_run(big_dir, n_events=args.events)
        many_dir = work / "many"
        many_dir.mkdir()
        started = time.perf_counter()
        many_bytes = make_many(many_dir, args.runs)
        print(
            f"generated {args.runs} transcripts ({many_bytes / 1e6:.1f} MB) in "
            f"{time.perf_counter() - started:.1f} s; big transcript: {big.stat().st_size / 1e6:.1f}"
            f" MB"
        )
        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                str(profile),
                executable_path=chromium,
                headless=True,
                args=CHROMIUM_ARGS,
                viewport={"width": 1400, "height": 900},
            )
            print(f"chromium {context.browser.version if context.browser else '?'}")
            try:
                cold_open: list[float] = []
                warm_open: list[float] = []
                cold_list: list[float] = []
                warm_list: list[float] = []
                for _ in range(args.repeat):
                    server = Server(big_dir)  # a new server: nothing cached
                    try:
                        url = f"{server.url}/run?path=big.json"
                        cold_open.append(timed_open(context, url))
                        warm_open.append(timed_open(context, url))
                    finally:
                        server.stop()
                    server = Server(many_dir)
                    try:
                        cold_list.append(timed_open(context, server.url + "/"))
                        warm_list.append(timed_open(context, server.url + "/"))
                    finally:
                        server.stop()
                events = args.events
                print(figures(f"open {events}-event transcript, cold", cold_open))
                print(figures(f"open {events}-event transcript, warm", warm_open))
                print(figures(f"list {args.runs} transcripts, cold", cold_list))
                print(figures(f"list {args.runs} transcripts, warm", warm_list))
            finally:
                context.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
