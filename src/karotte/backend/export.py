"""``karotte backend export``: write the runs of a backend database as files the dashboard lists
(``<dir>/<run_id>.json``, a ``karotte.events.Transcript`` like ``out/transcript.json``, and
``<dir>/<run_id>_artifacts/<name>``, decompressed)."""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from pathlib import Path

from karotte.backend.store import Store
from karotte.errors import ConfigError
from karotte.io import write_bytes_atomic, write_text_atomic


@dataclass
class ExportResult:
    transcripts: list[Path] = field(default_factory=list)
    artifacts: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def export_runs(db: Path, out_dir: Path, run_ids: list[str] | None = None) -> ExportResult:
    if not db.is_file():
        raise ConfigError(f"backend database {db} does not exist")
    store = Store(db)
    result = ExportResult()
    try:
        wanted = run_ids or [r.run_id for r in store.runs()]
        root = out_dir.resolve()
        for run_id in wanted:
            transcript = store.transcript(run_id)
            if transcript is None:
                result.skipped.append(f"{run_id}: no such run")
                continue
            path = root / f"{run_id}.json"
            write_text_atomic(path, transcript.model_dump_json(indent=1) + "\n")
            result.transcripts.append(path)
            for info in store.artifacts(run_id):
                target = (root / f"{run_id}_artifacts" / info.name).resolve()
                if not target.is_relative_to(
                    root
                ):  # names are validated on upload; belt and braces
                    result.skipped.append(f"{run_id}: artifact name {info.name!r}")
                    continue
                data = store.artifact(run_id, info.name)
                if data is None:
                    continue
                write_bytes_atomic(target, gzip.decompress(data))
                result.artifacts.append(target)
    finally:
        store.close()
    return result
