"""Fixtures of the dashboard tests: a directory of generated runs, a real uvicorn server on a
free loopback port, and a headless Debian chromium driven by Playwright."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from karotte.errors import ErrorKind
from karotte.host.dashboard import bind, create_app
from karotte.host.dashboard.server import allowed_hosts_for

from .factory import append_jsonl, make_run, png, run_events

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
MISBEHAVIOR_REASON = "edited tests/test_sort.py to make it pass"


def chromium_path() -> str | None:
    return shutil.which("chromium") or (
        "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None
    )


def populate(root: Path) -> dict[str, Path]:
    """A directory like a real out/: finished runs of every status, artifacts, a misbehaving
    run, a broken file, a half-written one, a run in progress (event stream), a run config and
    another JSON file that are not runs, and a sub-directory."""
    files = {
        "pass": make_run(
            root,
            run_id="run-pass",
            task_id="fizzbuzz",
            scores=[1.0, 1.0],
            tool_calls_per_step=2,
            with_image=True,
        ),
        "fail": make_run(
            root,
            run_id="run-fail",
            task_id="fizzbuzz",
            model="anthropic/claude-test",
            scores=[1.0, 0.0],
        ),
        "cheat": make_run(
            root,
            run_id="run-cheat",
            task_id="sorting",
            scores=[0.0],
            misbehavior={0: MISBEHAVIOR_REASON},
        ),
        "error": make_run(
            root,
            run_id="run-error",
            task_id="sorting",
            scores=[0.5, None],
            error=(ErrorKind.MODEL, "model API failed after retries: HTTP 503"),
        ),
    }
    nested = root / "batch-2"
    nested.mkdir()
    files["nested"] = make_run(
        nested, run_id="run-nested", task_id="parsing", model="anthropic/claude-test"
    )
    artifacts = root / "run-pass_artifacts"
    artifacts.mkdir()
    (artifacts / "answer.txt").write_text("42\n")
    (artifacts / "screen.png").write_bytes(png(96, 64))
    (artifacts / "page.html").write_text("<script>document.title='pwned'</script>")
    (artifacts / "nested.json").write_text('{"run_id": "not-a-run-but-an-artifact"}')
    files["broken"] = root / "broken.json"
    files["broken"].write_text("this is { not json")
    whole = files["fail"].read_text()
    files["half"] = root / "half-written.json"
    files["half"].write_text(whole[: len(whole) * 2 // 3])
    files["live"] = root / "run-live.events.jsonl"
    append_jsonl(
        files["live"], run_events(run_id="run-live", task_id="live-task", complete=False)[:6]
    )
    (root / "run-pass.run_config.json").write_text('{"run_id": "run-pass", "task_id": "x"}')
    (root / "manifest.json").write_text('{"images": []}')
    return files


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    root = tmp_path / "out"
    root.mkdir()
    populate(root)
    return root


class Server:
    def __init__(self, root: Path) -> None:
        self.root = root
        sock = bind("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        app = create_app(root, allowed_hosts=allowed_hosts_for("127.0.0.1"))
        self.server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        )
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("dashboard server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def serve() -> Iterator[Callable[[Path], Server]]:
    servers: list[Server] = []

    def start(root: Path) -> Server:
        server = Server(root)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # module scope, not session: Playwright's sync API keeps an asyncio loop running in this
    # thread while it is open, and later tests that call asyncio.run() must not see it
    path = chromium_path()
    if path is None:
        pytest.skip("requires_browser: chromium not installed (scripts/setup-browser.sh)")
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="karotte-chromium-")
    with sync_playwright() as playwright:
        # a persistent context on a fresh user-data-dir: nothing from another profile leaks in
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=path,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 900},
        )
        try:
            yield context
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    page.close()
    assert errors == [], f"script errors on the page: {errors}"
