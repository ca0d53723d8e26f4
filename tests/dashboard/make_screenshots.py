"""Regenerate the screenshots in docs/img/ (the runs list and a run view) from generated runs:

uv run --extra dev python tests/dashboard/make_screenshots.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dashboard.conftest import CHROMIUM_ARGS, Server, chromium_path, populate
from dashboard.factory import make_run

DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


def main() -> None:
    chromium = chromium_path()
    if chromium is None:
        sys.exit("chromium not installed: run scripts/setup-browser.sh")
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="karotte-screens-"))
    root = work / "out"
    root.mkdir()
    populate(root)
    for i, (task, scores) in enumerate(
        [("regex-golf", [1.0, 1.0, 0.5]), ("sql-join", [1.0]), ("log-triage", [0.0, 1.0])]
    ):
        make_run(root / "sweep", run_id=f"sweep-{i}", task_id=task, scores=scores)
    server = Server(root)
    DOCS_IMG.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=chromium, headless=True, args=CHROMIUM_ARGS
            )
            page = browser.new_page(viewport={"width": 1360, "height": 640})
            page.goto(server.url + "/")
            page.wait_for_selector("body[data-ready]")
            page.screenshot(path=str(DOCS_IMG / "dashboard-list.png"))
            page.set_viewport_size({"width": 1360, "height": 1500})
            page.goto(server.url + "/run?path=run-pass.json")
            page.wait_for_selector("body[data-ready]")
            page.screenshot(path=str(DOCS_IMG / "dashboard-run.png"))
            page.goto(server.url + "/run?path=run-cheat.json")
            page.wait_for_selector("body[data-ready]")
            page.set_viewport_size({"width": 1360, "height": 900})
            page.locator(".row.scoring").scroll_into_view_if_needed()
            page.screenshot(path=str(DOCS_IMG / "dashboard-misbehavior.png"))
            browser.close()
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"screenshots written to {DOCS_IMG}")


if __name__ == "__main__":
    main()
