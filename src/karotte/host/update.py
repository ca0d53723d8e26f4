"""``karotte update``: bring an environment up to date with the current templates.

A 3-way merge per file, with ``git merge-file``:

* **base**   the files the templates rendered last time (kept in ``.karotte/base/``),
* **theirs** the files the current templates render now (with this Karotte),
* **mine**   the files in the environment (the user's edits).

Rules, for each path rendered now or last time:

* new in the templates → written, unless the user has a different file there (then merged
  against an empty base: a conflict unless equal);
* the user deleted it → recreated, unless it matches ``do_not_recreate_if_deleted``;
* the user did not change it → replaced by the new rendering;
* the templates did not change it → the user's file is kept;
* both changed → merged; conflicts are written with markers and reported;
* the templates dropped it → removed if the user did not change it, else kept and reported.

Afterwards ``.karotte/base/``, the vendored Karotte wheel and ``.manifest.json`` are renewed and
``uv lock`` runs again.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from karotte._version import __version__
from karotte.errors import ConfigError
from karotte.host.create_env import (
    LockResult,
    karotte_source,
    render_environment,
    template_records,
    uv_lock,
    write_base,
    write_file,
)
from karotte.host.manifest import BASE_DIR, KAROTTE_DIR, Manifest, now_iso
from karotte.host.templates import RenderedFile, matches_any, resolve_stack

Action = Literal[
    "added",
    "updated",
    "merged",
    "conflict",
    "recreated",
    "removed",
    "kept-deleted",
    "kept-modified",
]


@dataclass
class FileChange:
    path: str
    action: Action
    detail: str = ""


@dataclass
class UpdateReport:
    changes: list[FileChange] = field(default_factory=list)
    lock: LockResult | None = None
    manifest: Manifest | None = None

    @property
    def conflicts(self) -> list[str]:
        return [c.path for c in self.changes if c.action == "conflict"]

    def add(self, path: str, action: Action, detail: str = "") -> None:
        self.changes.append(FileChange(path, action, detail))


def _read(path: Path) -> bytes | None:
    if path.is_symlink() or not path.is_file():
        return None
    return path.read_bytes()


def _is_text(data: bytes) -> bool:
    if b"\0" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def merge_file(mine: bytes, base: bytes, theirs: bytes) -> tuple[bytes, int]:
    """``git merge-file`` of three versions: (merged content, number of conflicts)."""
    git = shutil.which("git")
    if git is None:
        raise ConfigError("`karotte update` merges files with `git merge-file`; install git")
    with tempfile.TemporaryDirectory(prefix="karotte-merge-") as tmp:
        paths = []
        for name, data in (("mine", mine), ("base", base), ("theirs", theirs)):
            path = Path(tmp) / name
            path.write_bytes(data)
            paths.append(str(path))
        proc = subprocess.run(
            [git, "merge-file", "-p", "-L", "yours", "-L", "base", "-L", "template", *paths],
            capture_output=True,
            check=False,
            timeout=120,
        )
    if proc.returncode < 0 or proc.returncode >= 128:
        raise ConfigError(f"git merge-file failed: {proc.stderr.decode(errors='replace')}")
    return proc.stdout, proc.returncode


def update_env(
    env_dir: Path,
    add_templates: Sequence[str] = (),
    *,
    lock: bool = True,
    karotte_from_index: bool | None = None,
) -> UpdateReport:
    """Merge the current templates into ``env_dir``. See the module docstring."""
    env_dir = env_dir.resolve()
    manifest = Manifest.load(env_dir)
    requested = list(manifest.templates)
    for template_id in add_templates:
        if template_id not in requested:
            requested.append(template_id)
    stack = resolve_stack(requested)
    from_index = (
        manifest.karotte_source.kind == "index"
        if karotte_from_index is None
        else karotte_from_index
    )

    old_wheel = manifest.karotte_source.path
    source = karotte_source(env_dir, from_index)
    if old_wheel and old_wheel != source.path:
        (env_dir / old_wheel).unlink(missing_ok=True)
    theirs_rendering = render_environment(manifest.env_name, stack, source)
    theirs = theirs_rendering.files
    base_dir = env_dir / BASE_DIR
    keep_deleted = theirs_rendering.do_not_recreate()
    report = UpdateReport()

    for rel in sorted(set(theirs) | set(manifest.base_files)):
        target = env_dir / rel
        mine = _read(target)
        base = _read(base_dir / rel) if rel in manifest.base_files else None
        new: RenderedFile | None = theirs.get(rel)
        if new is None:
            # the templates no longer have it
            if mine is None:
                continue
            if base is not None and mine == base:
                target.unlink()
                report.add(rel, "removed", "the template removed it")
            else:
                report.add(rel, "kept-modified", "the template removed it; you changed it")
            continue
        if mine is None:
            if target.exists() or target.is_symlink():
                report.add(rel, "conflict", "not a regular file; left alone")
            elif base is None:
                write_file(target, new.content, new.executable)
                report.add(rel, "added")
            elif matches_any(rel, keep_deleted):
                report.add(rel, "kept-deleted", "you deleted it (do_not_recreate_if_deleted)")
            else:
                write_file(target, new.content, new.executable)
                report.add(rel, "recreated", "you deleted it; the template still has it")
            continue
        if mine == new.content:
            continue
        if base is not None and mine == base:
            write_file(target, new.content, new.executable)
            report.add(rel, "updated")
            continue
        if base is not None and base == new.content:
            continue  # only the user changed it
        if not (_is_text(mine) and _is_text(new.content) and (base is None or _is_text(base))):
            side = target.with_name(target.name + ".template")
            write_file(side, new.content, new.executable)
            report.add(rel, "conflict", f"binary file changed on both sides; new one in {side}")
            continue
        merged, conflicts = merge_file(mine, base or b"", new.content)
        target.write_bytes(merged)
        if conflicts:
            report.add(rel, "conflict", f"{conflicts} conflict(s) marked in the file")
        else:
            report.add(rel, "merged")

    records = template_records(stack)
    manifest.karotte_version = __version__
    manifest.karotte_source = source
    manifest.templates = requested
    manifest.resolved_templates = records
    manifest.extra_template_packages = [r for r in records if r.distribution != "karotte"]
    manifest.base_files = write_base(env_dir, theirs_rendering)
    manifest.updated_at = now_iso()
    manifest.save(env_dir)
    (env_dir / KAROTTE_DIR).mkdir(exist_ok=True)
    report.manifest = manifest
    report.lock = uv_lock(env_dir) if lock else None
    return report
