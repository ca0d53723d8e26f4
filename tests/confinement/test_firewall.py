"""The student firewall, tested in a private network namespace and (rules only) on this host."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from karotte.sandbox.confinement.demote import Identity
from karotte.sandbox.confinement.firewall import CanaryError, StudentFirewall, run_canary

pytestmark = pytest.mark.requires_root

SCENARIO = Path(__file__).with_name("netns_scenario.py")
BLOCKED = {
    "iptables": ("refused",),
    "iptables-legacy": ("refused",),
    "nftables": ("refused", "timeout"),
}


def _scenario(student: Identity, backend: str, mode: str) -> dict[str, object]:
    result = subprocess.run(
        [
            "unshare",
            "--net",
            "--",
            sys.executable,
            str(SCENARIO),
            str(student.uid),
            str(student.gid),
            backend,
            mode,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0 and "unshare failed" in result.stderr:
        pytest.skip(f"cannot create a network namespace: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("backend", ["iptables", "nftables", "iptables-legacy"])
def test_strict_mode_blocks_the_student_but_not_root(student: Identity, backend: str) -> None:
    out = _scenario(student, backend, "strict")
    student_view = out["student"]
    assert student_view["service"] == "connected", out  # localhost services stay reachable
    assert student_view["proxy"] == "connected", out  # the model proxy is allowed
    assert student_view["harness"] == "refused", out  # the harness port, even on localhost
    # nftables' reject of a non-127 address that lives on lo is not answered (the SYN is still
    # dropped): "timeout" is as blocked as "refused"
    assert student_view["outside"] in BLOCKED[backend], out
    assert student_view["internal"] in BLOCKED[backend], out
    assert set(out["root"].values()) == {"connected"}, out  # type: ignore[union-attr]
    assert "canary_error" not in out, out
    assert out["canary"]["192.0.2.1:80"] in BLOCKED[backend]  # type: ignore[index]
    assert out["student_after_remove"] == "connected"  # teardown removed every rule


@pytest.mark.parametrize("backend", ["iptables", "nftables"])
def test_internal_mode_adds_private_ranges(student: Identity, backend: str) -> None:
    out = _scenario(student, backend, "internal")
    assert out["student"]["internal"] == "connected"  # type: ignore[index]
    assert out["student"]["outside"] in BLOCKED[backend]  # type: ignore[index]
    assert out["student"]["harness"] == "refused"  # type: ignore[index]


def test_open_mode_still_closes_harness_ports(student: Identity) -> None:
    out = _scenario(student, "iptables", "open")
    assert out["student"]["outside"] == "connected"  # type: ignore[index]
    assert out["student"]["harness"] == "refused"  # type: ignore[index]
    assert "canary_error" in out  # the canary notices that the outside is reachable


def _chains() -> str:
    return subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=True).stdout


def test_on_this_host_rules_match_only_the_student_and_are_removed(student: Identity) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    firewall = StudentFirewall(student.uid, harness_ports=[port], tag=f"t{student.uid}")
    try:
        report = firewall.install()
        assert f"uid {student.uid}" in (report.backend or "")
        assert firewall.chain in _chains()
        # root is unaffected by the student's rules
        probe = socket.create_connection(("127.0.0.1", port), timeout=2)
        probe.close()
        # the student: harness port refused; the single canary SYN to TEST-NET-1 is rejected
        results = run_canary(student, [port])
        assert results[f"127.0.0.1:{port}"] == "refused"
        assert results["192.0.2.1:80"] == "refused"
    finally:
        firewall.remove()
        listener.close()
    assert firewall.chain not in _chains()


def test_canary_raises_when_the_student_reaches_a_harness_port(student: Identity) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    try:
        # no firewall at all: the harness port is reachable, the canary must say so (no probe of
        # the outside here: without a firewall it would leave this host)
        with pytest.raises(CanaryError, match="connected"):
            run_canary(student, [port], outside=None)
    finally:
        listener.close()


def test_auto_backend_falls_back_and_reports_why(student: Identity, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import karotte.sandbox.confinement.firewall as firewall_module

    real = firewall_module.resolve_system_binary

    def no_iptables(name: str) -> str:
        if name.startswith(("iptables", "ip6tables")) and "legacy" not in name:
            raise firewall_module.UntrustedBinaryError(f"{name}: hidden by the test")
        return real(name)

    monkeypatch.setattr(firewall_module, "resolve_system_binary", no_iptables)
    firewall = StudentFirewall(student.uid, tag=f"fb{student.uid}")
    try:
        report = firewall.install()
        assert (report.backend or "").startswith("nftables")
        assert "iptables: " in (report.detail or "")
        assert run_canary(student, [])["192.0.2.1:80"] in ("refused", "timeout")
    finally:
        firewall.remove()
    assert (
        f"karotte_fb{student.uid}"
        not in subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    )
