"""The dashboard in a real headless Chromium (Debian's, driven by Playwright): the list, its
filters and totals, a run's view, live updates, hostile transcript text and a big transcript."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from karotte.events import ToolCallCompleted

from .conftest import MISBEHAVIOR_REASON
from .factory import append_jsonl, big_run, make_run, run_events, write_transcript

pytestmark = pytest.mark.requires_browser

TIMEOUT_MS = 15_000
NONE = "\u2013"  # what the pages show for an unknown value
# List rows are `content-visibility: auto`: until the next frame decides they are on screen, rows
# just rendered are "skipped" and their `innerText` is "" (seen: about half the runs of the sort
# check). Row cells are therefore read with `textContent`, which does not depend on layout.


def open_list(page: Any, url: str, query: str = "") -> None:
    page.goto(f"{url}/{query}")
    page.wait_for_selector("body[data-ready]", timeout=TIMEOUT_MS)


def row(page: Any, path: str) -> Any:
    return page.locator(f'#runs tbody tr[data-path="{path}"]')


def visible_paths(page: Any) -> list[str]:
    paths: list[str] = page.eval_on_selector_all(
        "#runs tbody tr", "rows => rows.map(r => r.dataset.path)"
    )
    return paths


def test_list_shows_every_run_with_status_and_scores(
    runs_dir: Path, serve: Callable[[Path], Any], page: Any
) -> None:
    server = serve(runs_dir)
    open_list(page, server.url)
    assert sorted(visible_paths(page)) == sorted(
        [
            "run-pass.json",
            "run-fail.json",
            "run-cheat.json",
            "run-error.json",
            "batch-2/run-nested.json",
            "broken.json",
            "half-written.json",
            "run-live.events.jsonl",
        ]
    )
    expected = {
        "run-pass.json": ("passed", "1", ["1", "1"], ""),
        "run-fail.json": ("failed", "0.5", ["1", "0"], ""),
        "run-cheat.json": ("failed", "0", ["0"], "misbehavior"),
        "run-error.json": ("error", "0.25", ["0.5", NONE], "model"),
        "batch-2/run-nested.json": ("passed", "1", ["1"], ""),
        "run-live.events.jsonl": ("running", NONE, [NONE], ""),
    }
    for path, (status, score, steps, error_kind) in expected.items():
        r = row(page, path)
        assert r.locator(".badge").text_content() == status, path
        assert r.locator("td.score").text_content() == score, path
        assert r.locator(".step-score").all_text_contents() == steps, path
        assert r.locator("td.error-kind").text_content() == error_kind, path
    assert MISBEHAVIOR_REASON in row(page, "run-cheat.json").text_content()
    # broken files are rows saying what is wrong, and the page still works around them
    broken = row(page, "broken.json")
    assert broken.locator(".badge").text_content() == "malformed"
    assert "not JSON" in broken.locator(".problem").text_content()
    half = row(page, "half-written.json")
    assert "cut short" in half.locator(".problem").text_content()
    # totals: 5 finished runs (pass, nested pass, fail, cheat, error) of which 2 passed
    assert "40.0%" in page.inner_text("#t-pass-rate")
    assert "(2 of 5 finished)" in page.inner_text("#t-pass-rate")
    mean = (1.0 + 1.0 + 0.5 + 0.0 + 0.25) / 5
    assert page.inner_text("#t-mean-score") == f"mean score {mean:.3f}"


def test_filters_sorting_and_totals(
    runs_dir: Path, serve: Callable[[Path], Any], page: Any
) -> None:
    server = serve(runs_dir)
    open_list(page, server.url)
    page.select_option("#f-status", "failed")
    assert sorted(visible_paths(page)) == ["run-cheat.json", "run-fail.json"]
    assert "0.0%" in page.inner_text("#t-pass-rate")
    assert page.inner_text("#t-mean-score") == "mean score 0.250"
    assert "status=failed" in page.url  # the filter is in the address, for sharing
    page.select_option("#f-status", "")
    page.select_option("#f-task", "sorting")
    assert sorted(visible_paths(page)) == ["run-cheat.json", "run-error.json"]
    page.select_option("#f-task", "")
    page.select_option("#f-model", "anthropic/claude-test")
    # the half-written file is a cut copy of run-fail: listed, but not a finished run
    assert sorted(visible_paths(page)) == [
        "batch-2/run-nested.json",
        "half-written.json",
        "run-fail.json",
    ]
    assert "50.0% (1 of 2 finished)" in page.inner_text("#t-pass-rate")
    page.select_option("#f-model", "")
    page.fill("#f-text", "nested")
    assert visible_paths(page) == ["batch-2/run-nested.json"]
    page.fill("#f-text", "")
    # sorting by score: highest first, then lowest first; runs without a score stay last
    page.click('th[data-key="score"]')
    scores = page.locator("#runs tbody td.score").all_text_contents()
    known = [float(s) for s in scores if s != NONE]
    assert known == sorted(known, reverse=True) and scores[-1] == NONE
    page.click('th[data-key="score"]')
    scores = page.locator("#runs tbody td.score").all_text_contents()
    known = [float(s) for s in scores if s != NONE]
    assert known == sorted(known) and scores[-1] == NONE
    # a filtered address opens filtered
    open_list(page, server.url, "?status=error")
    assert visible_paths(page) == ["run-error.json"]


def test_run_view_shows_prompt_tool_calls_judge_and_artifacts(
    runs_dir: Path, serve: Callable[[Path], Any], page: Any
) -> None:
    server = serve(runs_dir)
    open_list(page, server.url)
    row(page, "run-pass.json").locator("a").click()
    page.wait_for_selector("body[data-ready]", timeout=TIMEOUT_MS)
    assert "path=run-pass.json" in page.url
    assert page.inner_text("#title") == "run-pass"
    assert "You are solving fizzbuzz" in page.inner_text("#system")
    assert page.locator(".row.step h2").all_inner_texts() == ["Step 0", "Step 1"]
    assert "Step 1: do it." in page.locator(".row.step").nth(1).inner_text()
    tool = page.locator('.row.tool[data-call-id="call_0_0"]')
    assert tool.locator(".tool-name").inner_text() == "bash"
    assert tool.locator(".tool-status").inner_text() == "ok"
    assert tool.locator(".duration").inner_text() == "250 ms"
    assert "echo step0-call0" in tool.inner_text()
    assert "step0-call0 step0-call0" in tool.locator(".tool-body").inner_text()
    # the tool result's image is shown inline (a data: URL from the conversation)
    assert tool.locator(".images img").count() == 1
    assert tool.locator(".images img").evaluate("img => img.naturalWidth") == 48
    # collapsible: closing the tool call hides its output
    tool.locator("summary").click()
    assert not tool.locator(".tool-body").is_visible()
    scoring = page.locator(".row.scoring").first
    assert "score 1" in scoring.inner_text() and '"judge": "exact"' in scoring.inner_text()
    # artifacts: links, and images inline
    links = page.locator("#artifact-list a")
    assert sorted(links.all_inner_texts()) == [
        "answer.txt",
        "nested.json",
        "page.html",
        "screen.png",
    ]
    shown = page.locator("#artifact-images img")
    assert shown.count() == 1 and shown.evaluate("img => img.naturalWidth") == 96
    answer = page.request.get(f"{server.url}/files/run-pass_artifacts/answer.txt")
    assert answer.text() == "42\n"


def test_run_view_shows_the_misbehaviour_reason_and_errors(
    runs_dir: Path, serve: Callable[[Path], Any], page: Any
) -> None:
    server = serve(runs_dir)
    page.goto(f"{server.url}/run?path=run-cheat.json")
    page.wait_for_selector("body[data-ready]", timeout=TIMEOUT_MS)
    reason = page.locator(".row.scoring .misbehavior")
    assert reason.inner_text() == f"misbehaviour: {MISBEHAVIOR_REASON}"
    assert MISBEHAVIOR_REASON in page.inner_text("#summary")
    assert page.inner_text("#summary .error-kind .v") == "misbehavior"
    page.goto(f"{server.url}/run?path=run-error.json")
    page.wait_for_selector("body[data-ready]", timeout=TIMEOUT_MS)
    error = page.locator(".row.error")
    assert "error · model" in error.inner_text()
    assert "HTTP 503" in error.inner_text()
    page.goto(f"{server.url}/run?path=half-written.json")
    page.wait_for_selector("body[data-ready]", timeout=TIMEOUT_MS)
    assert "cut short" in page.inner_text("#problem")
    assert page.locator(".row.step").count() >= 1  # what was complete is shown


def test_live_run_updates_without_reload(
    tmp_path: Path, serve: Callable[[Path], Any], page: Any
) -> None:
    root = tmp_path / "out"
    root.mkdir()
    make_run(root, run_id="done-before")
    server = serve(root)
    open_list(page, server.url)
    assert visible_paths(page) == ["done-before.json"]
    # a run starts: its event stream appears in the open list
    events = run_events(run_id="live", task_id="live-task", scores=[1.0, 1.0])
    stream = root / "live.events.jsonl"
    append_jsonl(stream, events[:4])
    page.wait_for_selector('tr[data-path="live.events.jsonl"]', timeout=TIMEOUT_MS)
    assert row(page, "live.events.jsonl").locator(".badge").text_content() == "running"
    # open it, then the run goes on
    page.goto(f"{server.url}/run?path=live.events.jsonl")
    page.wait_for_selector("body[data-ready]", timeout=TIMEOUT_MS)
    page.evaluate("window.__sameDocument = true")
    assert page.inner_text("#live") == "live: updating"
    assert page.locator(".row.tool").count() == 0
    tool_at = next(i for i, e in enumerate(events) if e.type == "tool_call_started")
    append_jsonl(stream, events[4 : tool_at + 1], start_seq=4)
    call = page.locator(".row.tool").first
    call.locator(".tool-status", has_text="running").wait_for(timeout=TIMEOUT_MS)
    done_at = tool_at + 1
    assert isinstance(events[done_at], ToolCallCompleted)
    append_jsonl(stream, events[done_at:-3], start_seq=done_at)
    call.locator(".tool-status", has_text="ok").wait_for(timeout=TIMEOUT_MS)
    assert page.locator(".row.step").count() == 2
    append_jsonl(stream, events[-3:], start_seq=len(events) - 3)
    page.locator(".row.task-done").wait_for(timeout=TIMEOUT_MS)
    assert page.inner_text("#summary .status .v") == "passed"
    assert page.inner_text("#live") == ""
    assert page.evaluate("window.__sameDocument") is True  # no reload happened
    # back on the list, the finished run shows its result
    page.goto(server.url)
    page.wait_for_selector("body[data-ready]", timeout=TIMEOUT_MS)
    assert row(page, "live.events.jsonl").locator(".badge").text_content() == "passed"


def test_rewritten_transcript_updates_live(
    tmp_path: Path, serve: Callable[[Path], Any], page: Any
) -> None:
    events = run_events(run_id="rewrite", scores=[1.0, 0.0])
    path = tmp_path / "rewrite.json"
    write_transcript(path, events[:6])
    server = serve(tmp_path)
    page.goto(f"{server.url}/run?path=rewrite.json")
    page.wait_for_selector("body[data-ready]", timeout=TIMEOUT_MS)
    page.evaluate("window.__sameDocument = true")
    assert page.locator(".row.step").count() == 1
    write_transcript(path, events)  # the writer replaces the file with more events
    page.locator(".row.task-done").wait_for(timeout=TIMEOUT_MS)
    assert page.locator(".row.step").count() == 2
    assert page.inner_text("#summary .status .v") == "failed"
    assert page.evaluate("window.__sameDocument") is True


def test_hostile_transcript_text_is_shown_as_text(
    tmp_path: Path, serve: Callable[[Path], Any], page: Any
) -> None:
    hostile = '<img src=x onerror="document.body.dataset.pwned=1"><script>pwned()</script>'
    events = run_events(run_id="<b>hostile</b>", task_id=hostile, scores=[0.0])
    for event in events:
        if isinstance(event, ToolCallCompleted):
            event.output = hostile
    write_transcript(tmp_path / "hostile.json", events)
    server = serve(tmp_path)
    open_list(page, server.url)
    assert row(page, "hostile.json").locator("td.task").text_content() == hostile
    page.goto(f"{server.url}/run?path=hostile.json")
    page.wait_for_selector("body[data-ready]", timeout=TIMEOUT_MS)
    assert hostile in page.locator(".row.tool .tool-body").first.inner_text()
    assert page.locator(".timeline img").count() == 0
    assert page.evaluate("document.body.dataset.pwned") is None
    assert page.inner_text("#title") == "<b>hostile</b>"


def test_big_transcript_opens_fast_and_renders_lazily(
    tmp_path: Path, serve: Callable[[Path], Any], page: Any
) -> None:
    big_run(tmp_path, n_events=10_000)
    server = serve(tmp_path)
    started = time.monotonic()
    page.goto(f"{server.url}/run?path=big.json")
    page.wait_for_selector("body[data-ready]", timeout=TIMEOUT_MS)
    elapsed = time.monotonic() - started
    # the benchmark (bench/bench_dashboard.py) measures this; here a loose bound for a busy CI
    assert elapsed < 8, f"10k-event transcript took {elapsed:.2f}s to open"
    assert int(page.inner_text("#summary .kv:nth-child(10) .v")) >= 10_000
    rendered = int(page.evaluate("document.body.dataset.rendered"))
    assert rendered < 1000  # only the first chunks are in the page
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    # (a locator wait, not wait_for_function: the page's CSP forbids eval, rightly)
    page.locator(f"#timeline > :nth-child({rendered + 1})").wait_for(
        state="attached", timeout=TIMEOUT_MS
    )
    # jumping to the last step renders everything up to it
    page.locator("#steps a").last.click()
    page.wait_for_selector("#step-3", timeout=TIMEOUT_MS)
    assert page.locator("#step-3").is_visible()


def test_long_tool_output_is_folded_until_asked(
    tmp_path: Path, serve: Callable[[Path], Any], page: Any
) -> None:
    make_run(tmp_path, run_id="long", output_chars=10_000)
    server = serve(tmp_path)
    page.goto(f"{server.url}/run?path=long.json")
    page.wait_for_selector("body[data-ready]", timeout=TIMEOUT_MS)
    body = page.locator(".row.tool .tool-body").first
    output = body.locator(".folded pre")
    assert len(output.inner_text()) == 4000
    button = body.locator("button.fold")
    assert "10000 chars" in button.inner_text()
    button.click()
    assert len(output.inner_text()) == 10_000
    assert body.locator("button.fold").count() == 0
