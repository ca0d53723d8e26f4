"""The reference backend's storage: one SQLite file (stdlib ``sqlite3``, WAL mode).

Tables: ``runs`` (one row per run, with its state), ``events`` (``(run_id, seq)`` is the key, so
storing a seq again replaces it: replay is idempotent), ``artifacts`` (gzip blobs), ``uploads``
(presigned-URL nonces already used), ``agent_messages`` / ``agent_waits`` (the external agent's
inbox) and ``meta`` (the upload-signing secret, made once per database).
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from karotte.backend.protocol import (
    AgentMessage,
    AgentState,
    ArtifactInfo,
    CreateRun,
    RunRecord,
    RunState,
)
from karotte.events import Event, TaskCompleted, TaskStarted, Transcript, event_adapter

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, task_id TEXT NOT NULL, model TEXT NOT NULL, host TEXT,
    sandbox TEXT, agent TEXT NOT NULL, state TEXT NOT NULL,
    created_at REAL NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL, body TEXT NOT NULL,
    received_at REAL NOT NULL, PRIMARY KEY (run_id, seq));
CREATE TABLE IF NOT EXISTS artifacts (
    run_id TEXT NOT NULL, name TEXT NOT NULL, size INTEGER NOT NULL, sha256 TEXT NOT NULL,
    data BLOB NOT NULL, uploaded_at REAL NOT NULL, PRIMARY KEY (run_id, name));
CREATE TABLE IF NOT EXISTS uploads (nonce TEXT PRIMARY KEY, used_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS agent_messages (
    run_id TEXT NOT NULL, turn INTEGER NOT NULL, body TEXT NOT NULL, posted_at REAL NOT NULL,
    delivered_at REAL, PRIMARY KEY (run_id, turn));
CREATE TABLE IF NOT EXISTS agent_waits (
    run_id TEXT PRIMARY KEY, turn INTEGER NOT NULL, step_index INTEGER NOT NULL,
    since REAL NOT NULL, tools TEXT);
"""


class Conflict(Exception):
    """The request contradicts what is stored (HTTP 409)."""


class Store:
    """Thread-safe access to the database (one connection, one lock: requests are short)."""

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # ---- meta ----------------------------------------------------------------------------
    def upload_secret(self) -> bytes:
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO meta VALUES ('upload_secret', ?)", (secrets.token_hex(32),)
            )
            row = self._db.execute("SELECT value FROM meta WHERE key='upload_secret'").fetchone()
        return bytes.fromhex(row[0])

    # ---- runs ----------------------------------------------------------------------------
    def create_run(self, body: CreateRun) -> tuple[RunRecord, bool]:
        """The run, and whether it was created now (False: it existed, same task)."""
        now = time.time()
        with self._lock:
            row = self._db.execute(
                "SELECT task_id FROM runs WHERE run_id=?", (body.run_id,)
            ).fetchone()
            if row is not None and row[0] != body.task_id:
                raise Conflict(f"run {body.run_id!r} exists with task {row[0]!r}")
            if row is None:
                self._db.execute(
                    "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?)",
                    (
                        body.run_id,
                        body.task_id,
                        body.model,
                        body.host,
                        body.sandbox,
                        body.agent,
                        RunState(status="running").model_dump_json(),
                        now,
                        now,
                    ),
                )
        record = self.run(body.run_id)
        assert record is not None
        return record, row is None

    def set_state(self, run_id: str, state: RunState) -> RunRecord | None:
        with self._lock:
            self._db.execute(
                "UPDATE runs SET state=?, updated_at=? WHERE run_id=?",
                (state.model_dump_json(), time.time(), run_id),
            )
        return self.run(run_id)

    def run(self, run_id: str) -> RunRecord | None:
        rows = self._query(
            "SELECT run_id, task_id, model, host, sandbox, agent, state, created_at, updated_at "
            "FROM runs WHERE run_id=?",
            (run_id,),
        )
        return self._record(rows[0]) if rows else None

    def runs(self) -> list[RunRecord]:
        rows = self._query(
            "SELECT run_id, task_id, model, host, sandbox, agent, state, created_at, updated_at "
            "FROM runs ORDER BY created_at"
        )
        return [self._record(row) for row in rows]

    def _record(self, row: tuple[Any, ...]) -> RunRecord:
        run_id = row[0]
        state = RunState.model_validate_json(row[6])
        count, last = self._query(
            "SELECT COUNT(*), COALESCE(MAX(seq), -1) FROM events WHERE run_id=?", (run_id,)
        )[0]
        # every seq up to `contiguous` is stored when count == last + 1; else find the first gap
        contiguous = last if count == last + 1 else self._first_gap(run_id) - 1
        return RunRecord(
            run_id=run_id,
            task_id=row[1],
            model=row[2],
            host=row[3],
            sandbox=row[4],
            agent=row[5],
            status=state.status,
            error_kind=state.error_kind,
            score=state.score,
            usage=state.usage,
            warnings=state.warnings,
            created_at=row[7],
            updated_at=row[8],
            event_count=count,
            last_seq=last,
            contiguous_seq=contiguous,
        )

    def _first_gap(self, run_id: str) -> int:
        expected = 0
        for (seq,) in self._query("SELECT seq FROM events WHERE run_id=? ORDER BY seq", (run_id,)):
            if seq != expected:
                return expected
            expected += 1
        return expected

    # ---- events --------------------------------------------------------------------------
    def put_events(self, run_id: str, events: list[Event]) -> int:
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany(
                    "INSERT OR REPLACE INTO events VALUES (?,?,?,?,?)",
                    [(run_id, e.seq, e.type, e.model_dump_json(), now) for e in events],
                )
                self._db.execute("UPDATE runs SET updated_at=? WHERE run_id=?", (now, run_id))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return len(events)

    def events(self, run_id: str, after: int = -1, limit: int = 100_000) -> list[Event]:
        rows = self._query(
            "SELECT body FROM events WHERE run_id=? AND seq>? ORDER BY seq LIMIT ?",
            (run_id, after, limit),
        )
        return [event_adapter.validate_json(body) for (body,) in rows]

    def has_completed(self, run_id: str) -> bool:
        rows = self._query(
            "SELECT 1 FROM events WHERE run_id=? AND type='task_completed' LIMIT 1", (run_id,)
        )
        return bool(rows)

    def transcript(self, run_id: str) -> Transcript | None:
        """The run in the format of ``out/transcript.json`` (``karotte.events.Transcript``)."""
        record = self.run(run_id)
        if record is None:
            return None
        events = self.events(run_id)
        transcript = Transcript(
            run_id=record.run_id, task_id=record.task_id, model=record.model, events=events
        )
        started = next((e for e in events if isinstance(e, TaskStarted)), None)
        if started is not None:
            transcript.model = started.model
        completed = transcript.completed()
        if isinstance(completed, TaskCompleted):
            transcript.status = completed.status
            transcript.error_kind = completed.error_kind
            transcript.score = completed.score
        return transcript

    # ---- artifacts -----------------------------------------------------------------------
    def use_nonce(self, nonce: str) -> bool:
        """Mark a presigned upload's nonce used; False when it was used before."""
        with self._lock:
            cursor = self._db.execute(
                "INSERT OR IGNORE INTO uploads VALUES (?, ?)", (nonce, time.time())
            )
            return cursor.rowcount == 1

    def put_artifact(self, run_id: str, name: str, size: int, sha256: str, gz: bytes) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO artifacts VALUES (?,?,?,?,?,?)",
                (run_id, name, size, sha256, gz, time.time()),
            )

    def artifacts(self, run_id: str) -> list[ArtifactInfo]:
        rows = self._query(
            "SELECT name, size, sha256, length(data), uploaded_at FROM artifacts "
            "WHERE run_id=? ORDER BY name",
            (run_id,),
        )
        return [
            ArtifactInfo(name=r[0], size=r[1], sha256=r[2], compressed_size=r[3], uploaded_at=r[4])
            for r in rows
        ]

    def artifact(self, run_id: str, name: str) -> bytes | None:
        rows = self._query("SELECT data FROM artifacts WHERE run_id=? AND name=?", (run_id, name))
        return bytes(rows[0][0]) if rows else None

    # ---- external agent ------------------------------------------------------------------
    def post_agent_message(self, run_id: str, body: AgentMessage) -> bool:
        """Queue the trainer's message for a turn; True when it replaced a queued one."""
        with self._lock:
            row = self._db.execute(
                "SELECT delivered_at FROM agent_messages WHERE run_id=? AND turn=?",
                (run_id, body.turn),
            ).fetchone()
            if row is not None and row[0] is not None:
                raise Conflict(f"turn {body.turn} was already taken by the harness")
            self._db.execute(
                "INSERT OR REPLACE INTO agent_messages VALUES (?,?,?,?,NULL)",
                (run_id, body.turn, body.model_dump_json(), time.time()),
            )
        return row is not None

    def take_agent_message(self, run_id: str, turn: int) -> AgentMessage | None:
        """The message for ``turn``, marked delivered (asking again gives it again)."""
        with self._lock:
            row = self._db.execute(
                "SELECT body FROM agent_messages WHERE run_id=? AND turn=?", (run_id, turn)
            ).fetchone()
            if row is None:
                return None
            self._db.execute(
                "UPDATE agent_messages SET delivered_at=COALESCE(delivered_at, ?) "
                "WHERE run_id=? AND turn=?",
                (time.time(), run_id, turn),
            )
        return AgentMessage.model_validate_json(row[0])

    def set_agent_wait(
        self, run_id: str, turn: int, step_index: int, tools: list[dict[str, Any]] | None
    ) -> None:
        with self._lock:
            row = self._db.execute(
                "SELECT turn, since FROM agent_waits WHERE run_id=?", (run_id,)
            ).fetchone()
            since = row[1] if row is not None and row[0] == turn else time.time()
            self._db.execute(
                "INSERT OR REPLACE INTO agent_waits VALUES (?,?,?,?,?)",
                (run_id, turn, step_index, since, None if tools is None else json.dumps(tools)),
            )

    def agent_state(self, run_id: str) -> AgentState:
        waits = self._query(
            "SELECT turn, step_index, since, tools FROM agent_waits WHERE run_id=?", (run_id,)
        )
        turns = self._query(
            "SELECT turn, delivered_at FROM agent_messages WHERE run_id=? ORDER BY turn",
            (run_id,),
        )
        state = AgentState(
            delivered_turns=[t for t, d in turns if d is not None],
            queued_turns=[t for t, d in turns if d is None],
        )
        if waits:
            turn, step, since, tools = waits[0]
            if turn not in state.delivered_turns:
                state.awaiting_turn, state.awaiting_step, state.awaiting_since = turn, step, since
            state.tools = None if tools is None else json.loads(tools)
        return state
