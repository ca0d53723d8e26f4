"""Resource limits for the student, with the strongest mechanism available, and a report of which.

Mechanisms, strongest first: the student's cgroup (v1 or v2: memory incl. page cache, tmpfs files
and SysV shared memory, no swap; pids; cpu), then per-process rlimits (``RLIMIT_NPROC`` counts the
uid's processes system-wide, ``RLIMIT_FSIZE``, ``RLIMIT_CORE``), then a watchdog thread that polls
``/proc`` and kills the student's processes when their summed RSS or count exceeds a limit the
kernel does not enforce. ``oom_score_adj=1000`` makes the student the global OOM killer's first
choice. :class:`LimitsReport` records which mechanism enforces each limit; the harness emits it as
the ``limits_applied`` event.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from karotte.sandbox.confinement.cgroups import (
    CGROUP_MOUNT,
    StudentCgroup,
    open_student_cgroup,
    unenforced_controllers,
)
from karotte.sandbox.confinement.demote import Identity
from karotte.sandbox.confinement.processes import kill_student_processes, processes_of_uid

GIB = 1 << 30
HARNESS_RESERVE_BYTES = GIB
DEFAULT_PIDS = 2048
DEFAULT_FILE_SIZE_BYTES = 16 * GIB


class LimitsOptions(BaseModel):
    """What to limit. ``None`` memory = (sandbox memory - 1 GiB kept for the harness)."""

    model_config = ConfigDict(extra="forbid")

    memory_bytes: int | None = Field(default=None, gt=0)
    pids: int = Field(default=DEFAULT_PIDS, ge=8)
    cpu_cores: float | None = Field(default=None, gt=0)
    file_size_bytes: int = Field(default=DEFAULT_FILE_SIZE_BYTES, gt=0)
    oom_score_adj: int = Field(default=1000, ge=-1000, le=1000)
    watchdog_interval_s: float = Field(default=0.25, gt=0)
    cgroup_name: str | None = None  # default: karotte-student-<uid>-<harness pid>


class Enforcement(BaseModel):
    """One limit and what enforces it. ``mechanism`` is "none" when nothing does."""

    model_config = ConfigDict(extra="forbid")

    value: int | float | None
    mechanism: str
    detail: str | None = None


class LimitsReport(BaseModel):
    """Which mechanism enforces each limit (emitted as the ``limits_applied`` event)."""

    model_config = ConfigDict(extra="forbid")

    student_user: str
    student_uid: int
    cgroup: str | None = None
    cgroup_version: str | None = None
    cgroup_source: str
    sandbox_memory_bytes: int
    memory: Enforcement
    swap: Enforcement
    pids: Enforcement
    cpu: Enforcement
    file_size: Enforcement
    core_dumps: Enforcement
    oom_score_adj: Enforcement
    watchdog: list[str] = Field(default_factory=list)
    extra: dict[str, Enforcement] = Field(default_factory=dict)

    def event_payload(self) -> dict[str, object]:
        return self.model_dump(mode="json")


def _cgroup_memory_limit() -> int | None:
    """The smallest memory limit on this process's cgroup path (v1 or v2), if any."""
    best: int | None = None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "" and (CGROUP_MOUNT / "cgroup.controllers").exists():
            base, knob = CGROUP_MOUNT, "memory.max"
        elif "memory" in controllers.split(","):
            base, knob = CGROUP_MOUNT / "memory", "memory.limit_in_bytes"
        else:
            continue
        current = base / path.lstrip("/")
        while True:
            with contextlib.suppress(OSError, ValueError):
                raw = (current / knob).read_text().strip()
                if raw != "max" and int(raw) < (1 << 60):
                    best = int(raw) if best is None else min(best, int(raw))
            if current == base or base not in current.parents:
                break
            current = current.parent
    return best


def _mem_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise OSError("MemTotal missing from /proc/meminfo")


def sandbox_memory_bytes() -> int:
    """The memory this sandbox has: its cgroup's limit or the machine's RAM, the smaller."""
    total = _mem_total()
    limit = _cgroup_memory_limit()
    return min(total, limit) if limit else total


def student_memory_bytes() -> int:
    """Sandbox memory minus 1 GiB for the harness, capped by ``KAROTTE_MEMORY_BYTES`` if set."""
    sandbox = sandbox_memory_bytes()
    allowed = max(sandbox - HARNESS_RESERVE_BYTES, sandbox // 2)
    budget = os.environ.get("KAROTTE_MEMORY_BYTES")
    if budget and budget.isdigit() and int(budget) > 0:
        allowed = min(allowed, int(budget))
    return allowed


class _Watchdog(threading.Thread):
    """Polls /proc for the student's processes; kills them all when a limit is exceeded."""

    def __init__(
        self,
        identity: Identity,
        memory_bytes: int | None,
        pids: int | None,
        interval_s: float,
    ) -> None:
        super().__init__(name="karotte-limits-watchdog", daemon=True)
        self.identity, self.memory_bytes, self.pids = identity, memory_bytes, pids
        self.interval_s = interval_s
        self.stopped = threading.Event()
        self.kills: list[str] = []

    def check_once(self) -> str | None:
        procs = processes_of_uid(self.identity.uid)
        reason = None
        if self.pids is not None and len(procs) > self.pids:
            reason = f"{len(procs)} processes > limit {self.pids}"
        rss = sum(p.rss_bytes for p in procs)
        if self.memory_bytes is not None and rss > self.memory_bytes:
            reason = f"resident memory {rss} B > limit {self.memory_bytes} B"
        if reason is not None:
            self.kills.append(reason)
            with contextlib.suppress(Exception):
                kill_student_processes(self.identity.uid, self.identity.gid, timeout_s=5.0)
        return reason

    def run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            with contextlib.suppress(Exception):
                self.check_once()


class AppliedLimits:
    """The limits in force for the student. Use :meth:`preexec` for every student process."""

    def __init__(
        self,
        identity: Identity,
        options: LimitsOptions,
        cgroup: StudentCgroup | None,
        report: LimitsReport,
        watchdog: _Watchdog | None,
    ) -> None:
        self.identity, self.options, self.cgroup = identity, options, cgroup
        self.report, self._watchdog = report, watchdog

    # ---- for the tools layer -------------------------------------------------------------------
    def preexec(self) -> None:
        """Run in a forked child, as root, *before* it drops to the student (preexec_fn).

        Enters the student cgroup, sets ``oom_score_adj`` and the rlimits. Chain it with the
        demotion: ``preexec_fn=lambda: (limits.preexec(), demote())``.
        """
        if self.cgroup is not None:
            self.cgroup.add_pid(0)
        with (
            contextlib.suppress(OSError),
            open("/proc/self/oom_score_adj", "w", encoding="ascii") as handle,
        ):
            handle.write(str(self.options.oom_score_adj))
        for limit, value in self._rlimits():
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(limit, (value, value))

    def enter_student_cgroup(self, pid: int) -> None:
        """Move an already started process into the student cgroup (prefer :meth:`preexec`)."""
        if self.cgroup is not None:
            self.cgroup.add_pid(pid)

    def _rlimits(self) -> list[tuple[int, int]]:
        return [
            (resource.RLIMIT_NPROC, self.options.pids),
            (resource.RLIMIT_FSIZE, self.options.file_size_bytes),
            (resource.RLIMIT_CORE, 0),
        ]

    # ---- for custody and teardown --------------------------------------------------------------
    def cgroup_kill(self) -> Callable[[], None] | None:
        return self.cgroup.kill_all if self.cgroup is not None else None

    def watchdog_kills(self) -> list[str]:
        return list(self._watchdog.kills) if self._watchdog else []

    def close(self) -> None:
        """Stop the watchdog, kill the student's processes and remove the cgroup we created."""
        if self._watchdog is not None:
            self._watchdog.stopped.set()
            self._watchdog.join(timeout=2)
        with contextlib.suppress(Exception):
            kill_student_processes(
                self.identity.uid, self.identity.gid, timeout_s=5.0, cgroup_kill=self.cgroup_kill()
            )
        if self.cgroup is not None:
            self.cgroup.remove()


def apply_limits(identity: Identity, options: LimitsOptions | None = None) -> AppliedLimits:
    """Set up the student's limits with the strongest mechanism available, and report them."""
    options = options or LimitsOptions()
    sandbox = sandbox_memory_bytes()
    memory = options.memory_bytes or student_memory_bytes()
    name = options.cgroup_name or f"{identity.uid}-{os.getpid()}"
    cgroup, source = open_student_cgroup(name)
    unenforced = unenforced_controllers()
    controllers = (cgroup.controllers() - set(unenforced)) if cgroup else set()
    kind = f"cgroup {cgroup.version}" if cgroup else None

    def enforce(
        value: int | float | None, setter: Callable[[], list[str]] | None, controller: str
    ) -> Enforcement | None:
        if cgroup is None or controller not in controllers or setter is None:
            return None
        try:
            knobs = setter()
        except OSError as exc:
            return Enforcement(value=value, mechanism="none", detail=f"{kind} failed: {exc}")
        return Enforcement(value=value, mechanism=f"{kind} ({', '.join(knobs)})")

    mem = enforce(memory, (lambda: cgroup.set_memory(memory)) if cgroup else None, "memory")
    pids = enforce(
        options.pids, (lambda: cgroup.set_pids(options.pids)) if cgroup else None, "pids"
    )
    cpu: Enforcement | None = None
    if options.cpu_cores is not None:
        cores = options.cpu_cores
        cpu = enforce(cores, (lambda: cgroup.set_cpu(cores)) if cgroup else None, "cpu")

    watch_memory = memory if mem is None or mem.mechanism == "none" else None
    watch_pids = options.pids if pids is None or pids.mechanism == "none" else None
    watchdog = None
    watched: list[str] = []
    if watch_memory is not None or watch_pids is not None:
        watchdog = _Watchdog(identity, watch_memory, watch_pids, options.watchdog_interval_s)
        watched = [n for n, v in (("memory", watch_memory), ("pids", watch_pids)) if v is not None]
        watchdog.start()

    def fallback(value: int | float | None, name: str, rlimit: str | None) -> Enforcement:
        parts = []
        if rlimit:
            parts.append(rlimit)
        if name in watched:
            parts.append(f"watchdog (polls /proc every {options.watchdog_interval_s:g}s)")
        return Enforcement(value=value, mechanism=" + ".join(parts) or "none")

    if mem is None or mem.mechanism == "none":
        mem = fallback(memory, "memory", None)
        mem.detail = "RSS only: tmpfs files and SysV shm are not counted without a cgroup"
        if "memory" in unenforced:
            mem.detail = f"{unenforced['memory']}; {mem.detail}"
    if pids is None or pids.mechanism == "none":
        pids = fallback(options.pids, "pids", "RLIMIT_NPROC (per uid)")
    else:
        pids.mechanism += " + RLIMIT_NPROC (per uid)"
    swap = (
        Enforcement(value=0, mechanism=mem.mechanism)
        if mem.mechanism.startswith("cgroup")
        and ("memsw" in mem.mechanism or "swap" in mem.mechanism)
        else Enforcement(value=None, mechanism="none", detail=_swap_detail())
    )
    report = LimitsReport(
        student_user=identity.name,
        student_uid=identity.uid,
        cgroup=cgroup.describe() if cgroup else None,
        cgroup_version=cgroup.version if cgroup else None,
        cgroup_source=source,
        sandbox_memory_bytes=sandbox,
        memory=mem,
        swap=swap,
        pids=pids,
        cpu=cpu or Enforcement(value=None, mechanism="none", detail="not requested"),
        file_size=Enforcement(value=options.file_size_bytes, mechanism="RLIMIT_FSIZE"),
        core_dumps=Enforcement(value=0, mechanism="RLIMIT_CORE"),
        oom_score_adj=Enforcement(
            value=options.oom_score_adj, mechanism="/proc/<pid>/oom_score_adj"
        ),
        watchdog=watched,
    )
    return AppliedLimits(identity, options, cgroup, report, watchdog)


def _swap_detail() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("SwapTotal:") and int(line.split()[1]) == 0:
                return "no swap configured in this sandbox"
    except OSError:
        pass
    return "swap is not limited for the student"


_active: AppliedLimits | None = None


def set_active_limits(applied: AppliedLimits | None) -> None:
    """Register the run's limits, so custody can kill through the student cgroup."""
    global _active
    _active = applied


def active_limits() -> AppliedLimits | None:
    """The limits registered for this run (``None`` before setup or in local runs)."""
    return _active
