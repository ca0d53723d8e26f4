"""No leaks: who owns a sandbox, and removing the sandboxes of launchers that are gone.

Every sandbox carries labels naming its run, the launcher's pid, the launcher's start time (so a
recycled pid is not mistaken for the launcher) and the host. A sandbox whose launcher is not
alive on this host any more is an orphan: the next ``karotte run`` and ``karotte clean`` remove
it, with its student cgroup dirs.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from karotte.errors import RuntimeUnavailableError
from karotte.host.runtimes import cgroup_delegation, disk_delegation
from karotte.host.runtimes.base import (
    LABEL_LAUNCHER_HOST,
    LABEL_LAUNCHER_PID,
    LABEL_PREFIX,
    LABEL_RUN_ID,
    Runtime,
    Sandbox,
)
from karotte.host.runtimes.oci_cli import OciCliRuntime

LABEL_LAUNCHER_START = f"{LABEL_PREFIX}.launcher-start"
LABEL_CGROUP = f"{LABEL_PREFIX}.cgroup"  # the run name of its student cgroup dirs, if any
LABEL_KEEP = f"{LABEL_PREFIX}.keep"  # --keep-containers: left alone by the reaper


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    fields = stat.rsplit(")", 1)[1].split()
    return fields[19]  # field 22 overall


def this_host() -> str:
    return socket.gethostname()


def launcher_labels(run_id: str) -> dict[str, str]:
    """The labels that tie a sandbox to this launcher process."""
    pid = os.getpid()
    return {
        LABEL_RUN_ID: run_id,
        LABEL_LAUNCHER_PID: str(pid),
        LABEL_LAUNCHER_START: process_start_time(pid) or "",
        LABEL_LAUNCHER_HOST: this_host(),
    }


def launcher_alive(labels: dict[str, str]) -> bool:
    """Whether the launcher that labelled a sandbox still runs. Sandboxes of other hosts are
    assumed alive (we cannot see their processes)."""
    if labels.get(LABEL_LAUNCHER_HOST, this_host()) != this_host():
        return True
    try:
        pid = int(labels.get(LABEL_LAUNCHER_PID, ""))
    except ValueError:
        return False
    started = process_start_time(pid)
    if started is None:
        return False
    expected = labels.get(LABEL_LAUNCHER_START)
    return not expected or expected == started


class ReapReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    runtime: str
    removed: list[str] = Field(default_factory=list)  # sandbox names
    errors: list[str] = Field(default_factory=list)


def orphans(runtime: Runtime, include_kept: bool = False) -> list[Sandbox]:
    """This host's sandboxes whose launcher is gone (and, if asked, the kept ones too)."""
    found = []
    for sandbox in runtime.list_sandboxes({LABEL_LAUNCHER_PID: ""}):
        if sandbox.labels.get(LABEL_LAUNCHER_HOST, this_host()) != this_host():
            continue
        kept = sandbox.labels.get(LABEL_KEEP) == "true"
        if kept and not include_kept:
            continue
        if kept or not launcher_alive(sandbox.labels):
            found.append(sandbox)
    return found


def remove_sandboxes(runtime: Runtime, sandboxes: list[Sandbox]) -> list[str]:
    """Remove sandboxes and their student cgroup dirs; returns error messages."""
    errors: list[str] = []
    if isinstance(runtime, OciCliRuntime):
        try:
            runtime.remove_ids([s.id for s in sandboxes])
        except RuntimeUnavailableError as exc:
            errors.append(str(exc))
    else:
        for sandbox in sandboxes:
            try:
                runtime.remove(sandbox)
            except RuntimeUnavailableError as exc:
                errors.append(str(exc))
    leftovers = cgroup_delegation.leftover_run_dirs()
    for sandbox in sandboxes:
        run_name = sandbox.labels.get(LABEL_CGROUP)
        if run_name and run_name in leftovers:
            left = cgroup_delegation.remove_dirs(leftovers[run_name], attempts=5)
            errors += [f"cgroup dir {d} could not be removed (still in use?)" for d in left]
    return errors


def reap(runtime: Runtime, include_kept: bool = False) -> ReapReport:
    report = ReapReport(runtime=runtime.name)
    found = orphans(runtime, include_kept=include_kept)
    if found:
        report.errors = remove_sandboxes(runtime, found)
        report.removed = [s.name for s in found]
    return report


def stale_cgroup_dirs(runtimes: list[Runtime], min_age_s: float = 120) -> dict[str, list[Path]]:
    """Student cgroup dirs whose run has no sandbox left on any of ``runtimes`` (and that are
    older than ``min_age_s``, so a launcher that is just starting its sandbox is left alone)."""
    live: set[str] = set()
    for runtime in runtimes:
        for sandbox in runtime.list_sandboxes({LABEL_CGROUP: ""}):
            live.add(sandbox.labels[LABEL_CGROUP])
    now = time.time()

    def old(dirs: list[Path]) -> bool:
        try:
            return all(now - d.stat().st_mtime >= min_age_s for d in dirs)
        except OSError:
            return False

    return {
        name: dirs
        for name, dirs in cgroup_delegation.leftover_run_dirs().items()
        if name not in live and old(dirs)
    }


def stale_disks(min_age_s: float = 120) -> dict[str, Path]:
    """Host disk-quota run dirs whose launcher is gone (older than ``min_age_s``, so one being
    made right now is left alone). A dir without a readable owner counts as gone."""
    return {
        name: run_dir
        for name, (run_dir, owner) in disk_delegation.leftover_run_dirs().items()
        if (not owner or not launcher_alive(owner))
        and disk_delegation.dir_age_s(run_dir) >= min_age_s
    }


def reap_stale_disks(min_age_s: float = 120) -> dict[str, list[str]]:
    """Unmount and delete the stale disk quotas; run name -> problems (empty when clean)."""
    return {
        name: disk_delegation.remove_run_dir(run_dir)
        for name, run_dir in stale_disks(min_age_s).items()
    }
