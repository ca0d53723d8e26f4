"""The dashboard's view of a directory of runs: which files are transcripts, a summary of each
(cached by file identity, so a listing re-reads only what changed) and the events of one run.

Two kinds of files hold runs:

* ``*.json`` — a transcript (:class:`karotte.events.Transcript`), written whole at the end of a
  run, or rewritten while it goes on. A file that is cut short (half-written) keeps the events
  that were complete; one that cannot be read at all is listed as malformed.
* ``*.jsonl`` — the harness's event stream (``--events jsonl``), one event per line, growing
  while the run goes on. Lines that are not JSON are logs and are skipped.

Nothing here trusts the files: every event is validated with the protocol's pydantic models and
every problem becomes a message on the run's row, never an exception out of the listing.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from karotte.events import (
    ErrorOccurred,
    Event,
    MessageAdded,
    ScoringCompleted,
    StepCompleted,
    TaskCompleted,
    TaskStarted,
    TokenUsage,
    Transcript,
    event_adapter,
)

# A run without its ``task_completed`` event whose file changed this recently is "running";
# older ones are "unfinished" (the launcher or harness died without finishing the file).
LIVE_WINDOW_S = 15 * 60.0
SKIP_SUFFIXES = (".run_config.json",)
ARTIFACTS_SUFFIX = "_artifacts"
MAX_ARTIFACTS = 500
_EVENT_TYPES = {
    "task_started",
    "hook_completed",
    "limits_applied",
    "step_started",
    "message_added",
    "tool_call_started",
    "tool_call_completed",
    "scoring",
    "step_completed",
    "error",
    "task_completed",
}

Status = Literal["passed", "failed", "error", "running", "unfinished", "malformed"]


class RunSummary(BaseModel):
    """One row of the runs list."""

    model_config = ConfigDict(extra="forbid")

    path: str  # relative to the dashboard's root, with "/" separators
    kind: Literal["transcript", "events"]
    run_id: str | None = None
    task_id: str | None = None
    model: str | None = None
    status: Status
    error_kind: str | None = None
    scores: list[float | None] = []
    score: float | None = None
    duration_s: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    started_at: float | None = None
    updated_at: float  # the file's mtime
    size: int
    event_count: int = 0
    misbehavior: list[str] = []
    problem: str | None = None  # why the file is malformed or only partly readable


@dataclass
class ParsedRun:
    """A run's events as far as they could be read, and what was wrong with the file."""

    events: list[Event]
    kind: Literal["transcript", "events"]
    header: dict[str, Any] = field(default_factory=dict)  # transcript header fields, if read
    problem: str | None = None
    not_a_run: bool = False  # valid JSON of another kind: not listed at all
    unreadable: bool = False  # nothing usable in it: listed as malformed


@dataclass
class _Stat:
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> _Stat:
        st = path.stat()
        return cls(st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class _JsonlState:
    """Incremental reading of a growing event stream: where the last complete line ended."""

    ino: int
    offset: int
    events: list[Event]
    problems: list[str]


def _first_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _validation_problem(exc: ValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return "invalid transcript"
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return _first_line(f"{where}: {first.get('msg', 'invalid')}{more}")


_EVENTS_KEY = re.compile(rb'"events"\s*:\s*\[')


def _salvage_events(data: bytes) -> tuple[list[Event], int]:
    """The complete, valid events of a transcript that is cut short or partly invalid.

    Returns the events and how many objects in the list were invalid.
    """
    match = _EVENTS_KEY.search(data)
    if match is None:
        return [], 0
    text = data[match.end() :].decode("utf-8", errors="replace")
    decoder = json.JSONDecoder()
    events: list[Event] = []
    invalid = 0
    pos = 0
    length = len(text)
    while True:
        while pos < length and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= length or text[pos] == "]":
            break
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break  # the cut: everything after it is incomplete
        try:
            events.append(event_adapter.validate_python(obj))
        except ValidationError:
            invalid += 1
    return events, invalid


def _header_of(data: bytes) -> dict[str, Any]:
    """The transcript's header fields (those before ``"events"``), when they can be read."""
    match = _EVENTS_KEY.search(data)
    if match is None:
        return {}
    head = data[: match.start()].rstrip().rstrip(b",")
    try:
        value = json.loads(head + b"}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def parse_transcript_bytes(data: bytes) -> ParsedRun:
    """Read a ``*.json`` transcript, keeping whatever can be kept of a broken one."""
    try:
        transcript = Transcript.model_validate_json(data)
    except ValidationError as exc:
        validation = exc
    else:
        header = transcript.model_dump(exclude={"events"}, mode="json")
        return ParsedRun(events=transcript.events, kind="transcript", header=header)

    if not data.strip():
        return ParsedRun([], "transcript", problem="empty file", unreadable=True)
    try:
        document = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        # not JSON: cut short while being written, or not a transcript at all
        if not data.lstrip().startswith(b"{") or (
            b'"run_id"' not in data[:8192] and b'"events"' not in data[:8192]
        ):
            return ParsedRun([], "transcript", problem=f"not JSON: {exc}", unreadable=True)
        events, invalid = _salvage_events(data)
        problem = f"cut short (half-written?): {exc}; {len(events)} complete events kept"
        if invalid:
            problem += f", {invalid} invalid events skipped"
        return ParsedRun(
            events, "transcript", header=_header_of(data), problem=problem, unreadable=not events
        )
    if not isinstance(document, dict) or not ({"run_id", "events"} & document.keys()):
        return ParsedRun([], "transcript", not_a_run=True)
    # JSON, shaped like a transcript, but not a valid one: keep the valid events
    events = []
    invalid = 0
    raw_events = document.get("events")
    for raw in raw_events if isinstance(raw_events, list) else []:
        try:
            events.append(event_adapter.validate_python(raw))
        except ValidationError:
            invalid += 1
    header = {k: v for k, v in document.items() if k != "events"}
    problem = f"invalid transcript: {_validation_problem(validation)}"
    if invalid:
        problem += f"; {invalid} invalid events skipped"
    return ParsedRun(events, "transcript", header=header, problem=problem, unreadable=not events)


def parse_jsonl_chunk(chunk: bytes) -> tuple[list[Event], list[str], int]:
    """Parse the complete lines of ``chunk``: (events, problems, bytes consumed).

    An unterminated last line is left for later (it is still being written). Lines that are not
    JSON are logs and skipped; JSON objects that are not valid events are reported.
    """
    events: list[Event] = []
    problems: list[str] = []
    end = chunk.rfind(b"\n") + 1
    for line in chunk[:end].splitlines():
        stripped = line.strip()
        if not stripped.startswith(b"{"):
            continue  # a log line
        try:
            raw = json.loads(stripped)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if not isinstance(raw, dict) or raw.get("type") not in _EVENT_TYPES:
            continue  # JSON of another kind
        try:
            events.append(event_adapter.validate_python(raw))
        except ValidationError as exc:
            problems.append(f"invalid {raw.get('type')} event: {_validation_problem(exc)}")
    return events, problems, end


def summarize(
    rel: str, parsed: ParsedRun, stat: os.stat_result | _Stat, now: float | None = None
) -> RunSummary:
    """The list row of a parsed run."""
    mtime = stat.st_mtime_ns / 1e9 if isinstance(stat, os.stat_result) else stat.mtime_ns / 1e9
    size = stat.st_size if isinstance(stat, os.stat_result) else stat.size
    summary = RunSummary(
        path=rel,
        kind=parsed.kind,
        status="malformed",
        updated_at=mtime,
        size=size,
        event_count=len(parsed.events),
        problem=parsed.problem,
    )
    header = parsed.header
    for key in ("run_id", "task_id", "model"):
        value = header.get(key)
        if isinstance(value, str):
            setattr(summary, key, value)
    if parsed.unreadable:
        return summary

    started: TaskStarted | None = None
    completed: TaskCompleted | None = None
    step_scores: dict[int, float | None] = {}
    input_tokens = output_tokens = 0
    last_error: str | None = None
    for event in parsed.events:
        # the most common events first: this loop runs over every listed file
        if isinstance(event, MessageAdded):
            if event.usage is not None:
                input_tokens += event.usage.input_tokens
                output_tokens += event.usage.output_tokens
        elif event.type in ("tool_call_started", "tool_call_completed"):
            continue
        elif isinstance(event, TaskStarted):
            started = started or event
        elif isinstance(event, TaskCompleted):
            completed = event
        elif isinstance(event, ScoringCompleted):
            step_scores[event.step_index] = event.score
            reason = event.metadata.get("misbehavior")
            if reason:
                summary.misbehavior.append(f"step {event.step_index}: {reason}")
        elif isinstance(event, StepCompleted):
            step_scores[event.step_index] = event.score
        elif isinstance(event, ErrorOccurred):
            last_error = str(event.kind)
    usage = TokenUsage(input_tokens=input_tokens, output_tokens=output_tokens)
    if started is not None:
        summary.run_id = summary.run_id or started.run_id
        summary.task_id = summary.task_id or started.task_id
        summary.model = summary.model or started.model
        summary.started_at = started.timestamp
    if completed is not None:
        summary.status = completed.status
        summary.error_kind = str(completed.error_kind) if completed.error_kind else None
        summary.scores = list(completed.scores)
        summary.score = completed.score
        summary.duration_s = completed.duration_s
        usage = completed.usage
    else:
        header_status = header.get("status")
        if parsed.problem is None and header_status in ("passed", "failed", "error"):
            # a transcript whose header says how it ended, without the final event
            summary.status = header_status
            score = header.get("score")
            summary.score = float(score) if isinstance(score, (int, float)) else None
            kind = header.get("error_kind")
            summary.error_kind = str(kind) if kind else None
        else:
            fresh = (now if now is not None else time.time()) - mtime < LIVE_WINDOW_S
            summary.status = _live_status(summary, fresh)
            summary.error_kind = last_error
        count = len(step_scores) if started is None else max(started.step_count, len(step_scores))
        summary.scores = [step_scores.get(i) for i in range(count)]
        if started is not None and parsed.events:
            summary.duration_s = max(0.0, parsed.events[-1].timestamp - started.timestamp)
    summary.input_tokens = usage.input_tokens
    summary.output_tokens = usage.output_tokens
    return summary


class RunIndex:
    """The runs under one directory, with summaries cached by file identity and size/mtime.

    Thread-safe: the web app calls it from worker threads.
    """

    def __init__(self, root: Path, full_cache_size: int = 4) -> None:
        self.root = root.resolve(strict=True)
        if not self.root.is_dir():
            raise NotADirectoryError(str(root))
        self._lock = threading.Lock()
        self._summaries: dict[str, tuple[_Stat, RunSummary | None]] = {}
        self._jsonl: dict[str, _JsonlState] = {}
        self._full: OrderedDict[str, tuple[_Stat, ParsedRun]] = OrderedDict()
        self._full_cache_size = full_cache_size

    # ---- paths -------------------------------------------------------------------------------

    def resolve(self, rel: str) -> Path:
        """The file ``rel`` names inside the root. Raises ``PermissionError`` for anything that
        leads outside it (absolute paths, ``..``, symlinks pointing out) and
        ``FileNotFoundError`` when it does not exist."""
        if not rel or "\x00" in rel or rel.startswith(("/", "\\")) or "\\" in rel:
            raise PermissionError(f"refused path: {rel!r}")
        parts = rel.split("/")
        if any(part in ("", ".", "..") for part in parts):
            raise PermissionError(f"refused path: {rel!r}")
        candidate = self.root.joinpath(*parts)
        real = candidate.resolve(strict=True)
        if real != self.root and self.root not in real.parents:
            raise PermissionError(f"refused path (leads outside the directory): {rel!r}")
        return real

    def relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def candidates(self) -> list[tuple[str, Path]]:
        """Every run file under the root (recursively), skipping artifacts and run configs.

        Symlinked directories are not followed; a symlinked file is listed only when it points
        inside the root.
        """
        found: list[tuple[str, Path]] = []
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False):
            dirnames[:] = sorted(
                d for d in dirnames if not d.startswith(".") and not d.endswith(ARTIFACTS_SUFFIX)
            )
            base = Path(dirpath)
            for name in sorted(filenames):
                if name.startswith(".") or name.endswith(SKIP_SUFFIXES):
                    continue
                if not name.endswith((".json", ".jsonl")) or not _utf8(dirpath, name):
                    continue
                path = base / name
                if path.is_symlink():
                    try:
                        real = path.resolve(strict=True)
                    except OSError:
                        continue
                    if self.root not in real.parents or not real.is_file():
                        continue
                found.append((path.relative_to(self.root).as_posix(), path))
        return found

    # ---- reading -----------------------------------------------------------------------------

    def _read_jsonl(self, rel: str, path: Path, stat: _Stat) -> ParsedRun:
        state = self._jsonl.get(rel)
        if state is None or state.ino != stat.ino or stat.size < state.offset:
            state = _JsonlState(stat.ino, 0, [], [])
        if stat.size > state.offset:
            with path.open("rb") as handle:
                handle.seek(state.offset)
                chunk = handle.read(stat.size - state.offset)
            events, problems, consumed = parse_jsonl_chunk(chunk)
            state.events.extend(events)
            state.problems.extend(problems)
            state.offset += consumed
        self._jsonl[rel] = state
        if not state.events and not state.problems and stat.size > 0:
            # only logs (or another kind of JSON lines) so far: not a run's event stream
            return ParsedRun([], "events", not_a_run=True)
        problem = None
        if state.problems:
            more = f" (and {len(state.problems) - 1} more)" if len(state.problems) > 1 else ""
            problem = state.problems[0] + more
        # an empty stream is a run that has just started
        return ParsedRun(
            list(state.events),
            "events",
            problem=problem,
            unreadable=bool(state.problems) and not state.events,
        )

    def _parse(self, rel: str, path: Path, stat: _Stat) -> ParsedRun:
        if path.name.endswith(".jsonl"):
            return self._read_jsonl(rel, path, stat)
        return parse_transcript_bytes(path.read_bytes())

    def load(self, rel: str) -> tuple[RunSummary, ParsedRun]:
        """The whole run ``rel`` (a path relative to the root), parsed, with its summary."""
        path = self.resolve(rel)
        if not path.is_file():
            raise FileNotFoundError(rel)
        with self._lock:
            stat = _Stat.of(path)
            cached = self._full.get(rel)
            if cached is not None and cached[0] == stat:
                parsed = cached[1]
                self._full.move_to_end(rel)
            else:
                parsed = self._parse(rel, path, stat)
                self._full[rel] = (stat, parsed)
                while len(self._full) > self._full_cache_size:
                    self._full.popitem(last=False)
            summary = summarize(rel, parsed, stat)
            self._summaries[rel] = (stat, None if parsed.not_a_run else summary)
        return summary, parsed

    def runs(self) -> list[RunSummary]:
        """Summaries of every run under the root; only new or changed files are parsed."""
        now = time.time()
        rows: list[RunSummary] = []
        with self._lock:
            seen: set[str] = set()
            for rel, path in self.candidates():
                try:
                    stat = _Stat.of(path)
                except OSError:
                    continue  # removed while listing
                seen.add(rel)
                cached = self._summaries.get(rel)
                if cached is not None and cached[0] == stat:
                    summary = cached[1]
                    if summary is not None and summary.status in ("running", "unfinished"):
                        fresh = now - summary.updated_at < LIVE_WINDOW_S
                        status = _live_status(summary, fresh)
                        if status != summary.status:
                            summary = summary.model_copy(update={"status": status})
                else:
                    try:
                        parsed = self._parse(rel, path, stat)
                    except OSError as exc:
                        parsed = ParsedRun([], "transcript", problem=str(exc), unreadable=True)
                    summary = None if parsed.not_a_run else summarize(rel, parsed, stat, now)
                    self._summaries[rel] = (stat, summary)
                if summary is not None:
                    rows.append(summary)
            for gone in set(self._summaries) - seen:
                del self._summaries[gone]
                self._jsonl.pop(gone, None)
                self._full.pop(gone, None)
        return _drop_stream_duplicates(rows)

    def artifacts(self, rel: str, run_id: str | None) -> list[dict[str, Any]]:
        """Files in the run's ``<dir>/<run_id>_artifacts/`` (at most :data:`MAX_ARTIFACTS`)."""
        if not run_id:
            return []
        parent = rel.rsplit("/", 1)[0] if "/" in rel else ""
        name = f"{run_id}{ARTIFACTS_SUFFIX}"
        dir_rel = f"{parent}/{name}" if parent else name
        try:
            directory = self.resolve(dir_rel)
        except (PermissionError, OSError):
            return []
        if not directory.is_dir():
            return []
        found: list[dict[str, Any]] = []
        for dirpath, dirnames, filenames in os.walk(directory, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                if not _utf8(dirpath, name):
                    continue  # a name that cannot be shown or linked (not UTF-8)
                path = Path(dirpath) / name
                try:
                    real = path.resolve(strict=True)
                except OSError:
                    continue
                if self.root not in real.parents or not real.is_file():
                    continue  # a symlink out of the root is never offered
                found.append(
                    {
                        "path": self.relative(path),
                        "name": path.relative_to(directory).as_posix(),
                        "size": real.stat().st_size,
                    }
                )
                if len(found) >= MAX_ARTIFACTS:
                    return found
        return found


def _utf8(*names: str) -> bool:
    try:
        for name in names:
            name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _live_status(summary: RunSummary, fresh: bool) -> Status:
    """A run without its final event: still going (its file changed recently) or abandoned. A
    transcript file that is cut short is never still going: transcripts are written whole."""
    going = summary.problem is None or summary.kind == "events"
    return "running" if fresh and going else "unfinished"


def _drop_stream_duplicates(rows: list[RunSummary]) -> list[RunSummary]:
    """An event stream whose run also has a finished transcript in the same directory is the
    same run twice: keep the transcript."""
    finished = {
        (r.path.rsplit("/", 1)[0] if "/" in r.path else "", r.run_id)
        for r in rows
        if r.kind == "transcript" and r.run_id and r.status in ("passed", "failed", "error")
    }
    return [
        r
        for r in rows
        if not (
            r.kind == "events"
            and (r.path.rsplit("/", 1)[0] if "/" in r.path else "", r.run_id) in finished
        )
    ]
