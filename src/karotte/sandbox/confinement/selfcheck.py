"""``karotte check confinement``: measure what this sandbox really enforces on a throwaway uid.

Run as root inside a sandbox (or on a host, to see what it could give). Each check sets a limit
for a fresh uid that no account and no process uses, really hits it from that uid, records the
mechanism that stopped it, and undoes everything it set up (cgroup, quota, firewall, processes).
The verdict compares what was measured with what the runtime (``KAROTTE_SANDBOX``) must provide.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from karotte.sandbox.confinement.demote import Identity, preexec_for
from karotte.sandbox.confinement.disk import DiskQuotaUnavailable, LoopQuota
from karotte.sandbox.confinement.firewall import (
    CanaryError,
    FirewallError,
    StudentFirewall,
    run_canary,
)
from karotte.sandbox.confinement.limits import LimitsOptions, apply_limits
from karotte.sandbox.confinement.namespaces import namespace_support
from karotte.sandbox.confinement.processes import kill_student_processes, processes_of_uid
from karotte.sandbox.confinement.sanitize import UntrustedBinaryError, resolve_system_binary

MIB = 1 << 20

# what each runtime must give the student at least ("enforced" = any working mechanism)
REQUIRED: dict[str, set[str]] = {
    "runc": {"memory", "pids", "disk", "network", "pid_namespace", "ipc_namespace"},
    "gvisor": {"memory", "pids", "network"},
    "firecracker": {"memory", "pids", "disk", "network", "pid_namespace", "ipc_namespace"},
    "qemu": {"memory", "pids", "disk", "network", "pid_namespace", "ipc_namespace"},
}
DEFAULT_REQUIRED = {"memory", "pids", "network"}


class CheckResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    enforced: bool
    mechanism: str
    measured: str
    required: bool = False

    @property
    def ok(self) -> bool:
        return self.enforced or not self.required


class SelfCheckReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sandbox: str | None
    uid: int
    checks: list[CheckResult]

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)


def _free_uid() -> int:
    for _ in range(100):
        uid = 300_000 + secrets.randbelow(600_000)
        try:
            pwd.getpwuid(uid)
        except KeyError:
            if not processes_of_uid(uid):
                return uid
    raise RuntimeError("no free uid for the self-check")


def _spawn(identity: Identity, script: str, preexec: Callable[[], None]) -> subprocess.Popen[bytes]:
    shell = resolve_system_binary("sh")

    def child() -> None:
        preexec()
        preexec_for(identity)()

    return subprocess.Popen(
        [shell, "-c", script],
        preexec_fn=child,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _check_memory(identity: Identity) -> CheckResult:
    applied = apply_limits(
        identity, LimitsOptions(memory_bytes=64 * MIB, pids=256, watchdog_interval_s=0.1)
    )
    try:
        # a shell variable of 256 MiB: portable (no python needed), really resident
        hog = _spawn(
            identity, "x=$(head -c 268435456 /dev/zero | tr '\\000' a); sleep 30", applied.preexec
        )
        try:
            code = hog.wait(timeout=30)
        except subprocess.TimeoutExpired:
            hog.kill()
            code = None
        killed = code is not None and code < 0
        mechanism = applied.report.memory.mechanism
        if applied.watchdog_kills():
            mechanism = "watchdog (kernel limit missing)"
        measured = f"256 MiB hog vs 64 MiB limit: {'killed' if killed else f'exit {code}'}"
        return CheckResult(name="memory", enforced=killed, mechanism=mechanism, measured=measured)
    finally:
        applied.close()


def _check_pids(identity: Identity) -> CheckResult:
    limit = 32
    applied = apply_limits(
        identity, LimitsOptions(memory_bytes=256 * MIB, pids=limit, watchdog_interval_s=0.1)
    )
    try:
        spawner = _spawn(
            identity,
            "i=0; while [ $i -lt 200 ]; do sleep 20 & i=$((i+1)); done; wait",
            applied.preexec,
        )
        peak = 0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            peak = max(peak, len(processes_of_uid(identity.uid)))
            time.sleep(0.05)
        spawner.kill()
        spawner.wait()
        enforced = peak <= limit
        return CheckResult(
            name="pids",
            enforced=enforced,
            mechanism=applied.report.pids.mechanism,
            measured=f"200 forks tried, peak {peak} processes (limit {limit})",
        )
    finally:
        applied.close()


def _check_disk(identity: Identity) -> list[CheckResult]:
    base = Path(tempfile.mkdtemp(prefix="karotte-selfcheck-"))
    target = base / "data"
    target.mkdir()
    os.chmod(base, 0o755)  # noqa: S103 - the throwaway uid must reach its directory
    os.chown(target, identity.uid, identity.gid)
    quota = LoopQuota(target, size_bytes=8 * MIB, inodes=64, uid=identity.uid, gid=identity.gid)
    try:
        try:
            report = quota.create()
        except (DiskQuotaUnavailable, OSError) as exc:
            why = f"not measurable: {exc}"
            return [
                CheckResult(name="disk", enforced=False, mechanism="none", measured=why),
                CheckResult(name="files", enforced=False, mechanism="none", measured=why),
            ]
        writer = _spawn(identity, f"head -c 33554432 /dev/zero > {target}/fill", lambda: None)
        writer.wait(timeout=60)
        written = (target / "fill").stat().st_size if (target / "fill").exists() else 0
        toucher = _spawn(
            identity,
            f"i=0; while [ $i -lt 500 ]; do : > {target}/f$i || exit 3; i=$((i+1)); done",
            lambda: None,
        )
        toucher.wait(timeout=60)
        files = len(os.listdir(target))
        return [
            CheckResult(
                name="disk",
                enforced=written <= 9 * MIB,
                mechanism=report.mechanism,
                measured=f"32 MiB writer vs 8 MiB quota: {written} bytes written",
            ),
            CheckResult(
                name="files",
                enforced=files <= 64 + 32,
                mechanism=report.mechanism,
                measured=f"500 files tried vs 64 inodes: {files} created",
            ),
        ]
    finally:
        quota.remove()
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)


def _check_network(identity: Identity) -> CheckResult:
    mode = os.environ.get("KAROTTE_STUDENT_NETWORK", "strict")
    firewall = StudentFirewall(identity.uid, mode="strict", tag=f"sc{os.getpid()}")
    mechanism = "none"
    installed = False
    try:
        try:
            report = firewall.install()
            mechanism, installed = report.backend or "none", True
        except FirewallError as exc:
            mechanism = f"none ({exc})"
        try:
            results = run_canary(identity, [])
        except CanaryError as exc:
            return CheckResult(
                name="network", enforced=False, mechanism=mechanism, measured=str(exc)
            )
        outcome = ", ".join(f"{k} {v}" for k, v in results.items())
        # without a firewall a timeout is ambiguous (the SYN may have left); refused/unreachable
        # means this sandbox has no route out at all
        blocked = installed or all(v != "timeout" for v in results.values())
        return CheckResult(
            name="network",
            enforced=blocked,
            mechanism=mechanism,
            measured=f"canary ({mode} mode): {outcome}",
        )
    finally:
        firewall.remove()


def _check_namespaces() -> list[CheckResult]:
    support = namespace_support()
    return [
        CheckResult(
            name="pid_namespace",
            enforced=support.pid,
            mechanism="unshare --pid" if support.pid else "none",
            measured=support.detail,
        ),
        CheckResult(
            name="ipc_namespace",
            enforced=support.ipc,
            mechanism="unshare --ipc" if support.ipc else "none",
            measured=support.detail,
        ),
    ]


def run_selfcheck(sandbox: str | None = None) -> SelfCheckReport:
    """Measure every confinement mechanism on a throwaway uid and undo it all."""
    if os.geteuid() != 0:
        raise PermissionError("karotte check confinement must run as root")
    sandbox = sandbox if sandbox is not None else os.environ.get("KAROTTE_SANDBOX")
    uid = _free_uid()
    identity = Identity(name=f"uid{uid}", uid=uid, gid=uid, home="/")
    checks: list[CheckResult] = []
    try:
        checks.append(_guarded("memory", lambda: _check_memory(identity)))
        checks.append(_guarded("pids", lambda: _check_pids(identity)))
        checks.extend(_check_disk(identity))
        checks.append(_guarded("network", lambda: _check_network(identity)))
        checks.extend(_check_namespaces())
    finally:
        with contextlib.suppress(Exception):
            kill_student_processes(uid, uid, timeout_s=10)
    if os.environ.get("KAROTTE_CGROUP_ROOT"):
        # the launcher promised a cgroup: a watchdog is then less than this sandbox should give
        for result in checks:
            if result.name in ("memory", "pids") and not result.mechanism.startswith("cgroup"):
                result.enforced = False
                result.measured += " (KAROTTE_CGROUP_ROOT is set, but no cgroup enforced it)"
    required = REQUIRED.get(sandbox or "", DEFAULT_REQUIRED)
    for result in checks:
        result.required = result.name in required or (result.name == "files" and "disk" in required)
    return SelfCheckReport(sandbox=sandbox, uid=uid, checks=checks)


def _guarded(name: str, check: Callable[[], CheckResult]) -> CheckResult:
    try:
        return check()
    except (OSError, UntrustedBinaryError, subprocess.SubprocessError) as exc:
        return CheckResult(
            name=name, enforced=False, mechanism="none", measured=f"check failed: {exc}"
        )


def render_selfcheck(report: SelfCheckReport, as_json: bool) -> None:
    """Print the report: a table on stderr-friendly rich output, or JSON on stdout."""
    import json

    from rich.console import Console
    from rich.table import Table

    if as_json:
        data = report.model_dump(mode="json")
        data["ok"] = report.ok
        for check, raw in zip(report.checks, data["checks"], strict=True):
            raw["ok"] = check.ok
        print(json.dumps(data, indent=2))
        return
    table = Table(title=f"Student confinement (sandbox: {report.sandbox or 'unknown'})")
    for column in ("check", "enforced", "required", "mechanism", "measured"):
        table.add_column(column)
    for check in report.checks:
        mark = "[green]yes[/]" if check.enforced else ("[red]NO[/]" if check.required else "no")
        table.add_row(
            check.name, mark, "yes" if check.required else "-", check.mechanism, check.measured
        )
    console = Console()
    console.print(table)
    console.print(
        "[green]ok[/]" if report.ok else "[red]the student gets less protection than required[/]"
    )
