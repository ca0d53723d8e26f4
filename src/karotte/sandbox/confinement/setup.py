"""Confining the student for one run: limits, disk quota, firewall, canary — and undoing it.

The harness calls :func:`setup_confinement` once before the first step (after ``task_started``),
emits ``Confinement.payload()`` as the ``limits_applied`` event, hands ``Confinement.limits`` to
the tools layer (``limits.preexec`` for every student process) and calls
:meth:`Confinement.teardown` when the run ends, whatever happened.

Without ``config.student_user`` (local development) nothing is confined and the payload says so.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from karotte.config import EvaluationRunConfig
from karotte.sandbox.confinement.demote import Identity, student_identity
from karotte.sandbox.confinement.disk import DiskQuotaUnavailable, LoopQuota
from karotte.sandbox.confinement.firewall import FirewallError, StudentFirewall, run_canary
from karotte.sandbox.confinement.limits import (
    DEFAULT_PIDS,
    AppliedLimits,
    LimitsOptions,
    apply_limits,
    set_active_limits,
)
from karotte.sandbox.confinement.namespaces import namespace_support

GIB = 1 << 30
QUOTA_IMAGE_DIR = Path("/var/lib/karotte/disk")  # root-only, on the sandbox's root filesystem
HARNESS_PIDS_RESERVE = 256  # processes kept for the harness below the sandbox's own pids limit
# Under gVisor (ptrace platform) one student process costs ~8.4 host tasks in the sandbox's pids
# cgroup (measured: 100 sleeping processes added ~837; runsc 2024's systrap: ~222); divide by 10
# to stay below it whichever platform runs.
GVISOR_HOST_TASKS_PER_PROCESS = 10


class ConfinementOptions(BaseModel):
    """What to set up. Budgets default to the launcher's ``KAROTTE_*`` variables."""

    model_config = ConfigDict(extra="forbid")

    limits: LimitsOptions = Field(default_factory=LimitsOptions)
    disk_quota: bool = True
    disk_paths: list[str] | None = None  # default: the student's home (student-owned)
    temp_quota_dirs: list[str] = Field(default_factory=lambda: ["/tmp", "/var/tmp"])
    # ^ shared temp dirs (root-owned, sticky) get a quarter of the budget each, unless tmpfs
    disk_bytes: int | None = Field(default=None, gt=0)  # default: KAROTTE_DISK_BYTES or 10 GiB
    disk_inodes: int = Field(default=200_000, ge=64)
    firewall: bool = True
    canary: bool = True


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def student_pids_limit(sandbox_pids: int, sandbox: str | None) -> int:
    """The student's process limit inside a sandbox limited to ``sandbox_pids`` tasks.

    The student must run out of processes before the sandbox does, or a fork bomb takes the
    harness (and under gVisor the whole sandbox) down with it: keep a reserve for the harness.
    Never more than the default student limit (2048, `limits.DEFAULT_PIDS`).
    Under gVisor each student task also costs the sandbox ~8-9 host tasks, so the student gets a
    tenth of what is left.
    """
    reserve = max(HARNESS_PIDS_RESERVE, sandbox_pids // 4)
    available = min(max(sandbox_pids - reserve, 8), DEFAULT_PIDS)
    return max(available // GVISOR_HOST_TASKS_PER_PROCESS, 8) if sandbox == "gvisor" else available


class Confinement:
    """Everything set up for the run; :meth:`teardown` undoes it (idempotent)."""

    def __init__(self, identity: Identity | None) -> None:
        self.identity = identity
        self.limits: AppliedLimits | None = None
        self.quotas: list[LoopQuota] = []
        self.firewall: StudentFirewall | None = None
        self.report: dict[str, Any] = {}

    def payload(self) -> dict[str, Any]:
        """The ``limits`` field of the ``limits_applied`` event."""
        return dict(self.report)

    def teardown(self) -> None:
        set_active_limits(None)
        if self.limits is not None:
            with contextlib.suppress(Exception):
                self.limits.close()
        if self.firewall is not None:
            with contextlib.suppress(Exception):
                self.firewall.remove()
        for quota in reversed(self.quotas):
            with contextlib.suppress(Exception):
                quota.remove()
        self.quotas.clear()


def setup_confinement(
    config: EvaluationRunConfig,
    harness_ports: list[int] | None = None,
    options: ConfinementOptions | None = None,
) -> Confinement:
    """Confine ``config.student_user``; raises ``CanaryError`` (infra) if the network leaks."""
    options = options or ConfinementOptions()
    if not config.student_user:
        confinement = Confinement(None)
        confinement.report = {
            "student_user": None,
            "mechanism": "none: local run, tools act as the harness's own user",
        }
        return confinement
    identity = student_identity(config.student_user)
    confinement = Confinement(identity)
    try:
        limits_options = options.limits
        sandbox_pids = _env_int("KAROTTE_PIDS_LIMIT")
        if limits_options.pids == LimitsOptions().pids and sandbox_pids:
            limits_options = limits_options.model_copy(
                update={"pids": student_pids_limit(sandbox_pids, os.environ.get("KAROTTE_SANDBOX"))}
            )
        confinement.limits = apply_limits(identity, limits_options)
        set_active_limits(confinement.limits)
        report: dict[str, Any] = confinement.limits.report.event_payload()
        report["sandbox"] = os.environ.get("KAROTTE_SANDBOX")
        report["disk"] = _setup_disk(confinement, identity, options)
        report["network"] = _setup_network(
            confinement, identity, config, harness_ports or [], options
        )
        support = namespace_support()
        report["namespaces"] = {
            "pid": "per session (unshare --pid)" if support.pid else f"none ({support.detail})",
            "ipc": "per session (unshare --ipc)" if support.ipc else f"none ({support.detail})",
        }
        confinement.report = report
    except BaseException:
        confinement.teardown()
        raise
    return confinement


def _fs_type(path: str) -> str | None:
    """The filesystem type of the mount that holds ``path`` (from /proc/self/mountinfo)."""
    best, fstype = "", None
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    real = os.path.realpath(path)
    for line in lines:
        fields, _, rest = line.partition(" - ")
        mount_point = fields.split()[4].replace("\\040", " ")
        inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, fstype = mount_point, rest.split()[0]
    return fstype


def _setup_disk(
    confinement: Confinement, identity: Identity, options: ConfinementOptions
) -> list[dict[str, Any]]:
    if not options.disk_quota:
        return [{"mechanism": "none (disabled)"}]
    in_sandbox = bool(os.environ.get("KAROTTE_SANDBOX"))
    if options.disk_paths is None and not in_sandbox:
        # never mount over a real home or /tmp of a development machine by default
        return [{"mechanism": "none", "detail": "not in a sandbox (KAROTTE_SANDBOX unset)"}]
    size = options.disk_bytes or _env_int("KAROTTE_DISK_BYTES") or 10 * GIB
    wanted: list[tuple[str, int, int, int]] = [
        (path, identity.uid, identity.gid, size) for path in options.disk_paths or [identity.home]
    ]
    for path in options.temp_quota_dirs if in_sandbox or options.disk_paths else []:
        if os.path.isdir(path) and _fs_type(path) != "tmpfs":
            wanted.append((path, 0, 0, max(size // 4, 16 << 20)))
    results: list[dict[str, Any]] = []
    host_made = launcher_disk_mounts()
    for claim in host_made:
        results.append(verify_launcher_disk(claim))
    done = {claim.get("path") for claim in host_made}
    for path, uid, gid, budget in wanted:
        if path in done:
            continue
        quota = LoopQuota(
            Path(path),
            size_bytes=budget,
            inodes=options.disk_inodes,
            uid=uid,
            gid=gid,
            # In a sandbox the backing file goes on the disk-backed root filesystem: the
            # launcher's /tmp is a small tmpfs, and a quota image there would fill it (and
            # every root-side temp file with it) before the student hit the quota.
            image_dir=QUOTA_IMAGE_DIR / (path.strip("/").replace("/", "_") or "root")
            if in_sandbox
            else None,
        )
        try:
            results.append(quota.create().model_dump())
            confinement.quotas.append(quota)
        except (DiskQuotaUnavailable, OSError) as exc:
            results.append(
                {
                    "path": path,
                    "bytes": budget,
                    "mechanism": "none",
                    "detail": f"{exc}; the launcher's tmpfs/storage limits are the only bound",
                }
            )
    return results


def launcher_disk_mounts() -> list[dict[str, Any]]:
    """The quota filesystems the launcher mounted for us (``KAROTTE_DISK_MOUNTS``), if any."""
    raw = os.environ.get("KAROTTE_DISK_MOUNTS", "")
    if not raw:
        return []
    try:
        claims = json.loads(raw)
    except ValueError:
        return []
    if not isinstance(claims, list):
        return []
    return [c for c in claims if isinstance(c, dict) and isinstance(c.get("path"), str)]


def verify_launcher_disk(claim: dict[str, Any]) -> dict[str, Any]:
    """Trust, but check: the path must be its own filesystem whose free space and free inodes
    are within the budget the launcher claims; otherwise it is recorded as unbounded."""
    path = str(claim["path"])
    budget = int(claim.get("bytes", 0))
    inodes = int(claim.get("inodes", 0))
    result: dict[str, Any] = {"path": path, "bytes": budget, "inodes": inodes}
    try:
        st = os.statvfs(path)
        separate = os.stat(path).st_dev != os.stat("/").st_dev
    except OSError as exc:
        return result | {"mechanism": "none", "detail": f"launcher quota unreadable: {exc}"}
    free_bytes = st.f_bavail * st.f_frsize
    free_files = st.f_favail
    measured = f"free {free_bytes} bytes, {free_files} files"
    slack = 16 << 20
    if separate and free_bytes <= budget + budget // 20 + slack and free_files <= inodes * 2 + 64:
        return result | {
            "mechanism": str(claim.get("mechanism", "launcher quota")),
            "detail": f"checked with statvfs: {measured}",
        }
    return result | {
        "mechanism": "none",
        "detail": f"the launcher's quota does not hold: separate filesystem {separate}, {measured}",
    }


def _setup_network(
    confinement: Confinement,
    identity: Identity,
    config: EvaluationRunConfig,
    harness_ports: list[int],
    options: ConfinementOptions,
) -> dict[str, Any]:
    result: dict[str, Any] = {"mode": config.student_network}
    if options.firewall:
        firewall = StudentFirewall(
            identity.uid,
            mode=config.student_network,
            proxy_url=config.proxy_url,
            harness_ports=harness_ports,
        )
        try:
            result.update(firewall.install().model_dump())
            confinement.firewall = firewall
        except FirewallError as exc:
            result["backend"] = None
            result["detail"] = f"no firewall: {exc}"
    if options.canary and config.student_network != "open":
        result["canary"] = run_canary(identity, harness_ports)
    elif options.canary:
        # open network: the outside is allowed, only the harness ports must stay closed
        result["canary"] = run_canary(identity, harness_ports, outside=None)
    return result
