"""karotte check confinement: measured on this host, undone afterwards, verdict per runtime."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from karotte.sandbox.confinement import selfcheck
from karotte.sandbox.confinement.namespaces import NamespaceSupport
from karotte.sandbox.confinement.processes import processes_of_uid

pytestmark = pytest.mark.requires_root


def _leftovers() -> list[str]:
    found = []
    if "KAROTTE-sc" in subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout:
        found.append("iptables chain")
    found += [
        line
        for line in Path("/proc/mounts").read_text().splitlines()
        if "karotte-selfcheck" in line
    ]
    found += [str(p) for p in Path("/sys/fs/cgroup/pids").glob("karotte-student-*")]
    return found


def test_cli_measures_and_undoes_everything() -> None:
    before = _leftovers()
    out = subprocess.run(
        [str(Path(sys.executable).with_name("karotte")), "check", "confinement", "--json"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr + out.stdout
    report = json.loads(out.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["memory"]["enforced"] and checks["memory"]["mechanism"].startswith("cgroup")
    assert checks["pids"]["enforced"]
    assert checks["network"]["enforced"] and "refused" in checks["network"]["measured"]
    assert report["ok"] is True
    assert processes_of_uid(report["uid"]) == []
    assert _leftovers() == before


def test_verdict_fails_when_a_required_mechanism_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        selfcheck,
        "namespace_support",
        lambda: NamespaceSupport(pid=False, ipc=False, detail="forbidden (test)"),
    )
    monkeypatch.setattr(selfcheck, "_check_disk", lambda identity: [])
    report = selfcheck.run_selfcheck(sandbox="runc")
    failing = {c.name for c in report.checks if not c.ok}
    assert failing == {"pid_namespace", "ipc_namespace"}
    assert not report.ok
    # the same measurement is acceptable for a runtime that does not require namespaces
    assert selfcheck.run_selfcheck(sandbox="gvisor").ok
