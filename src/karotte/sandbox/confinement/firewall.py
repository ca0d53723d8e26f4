"""A per-user firewall for the student: loopback and the model proxy only, never the harness.

Rules match only packets sent by the student's uid (iptables ``-m owner --uid-owner`` in a
dedicated ``KAROTTE-<pid>`` chain jumped to from ``OUTPUT``; or an nftables table
``inet karotte_<pid>`` matching ``meta skuid``), so root and every other user are unaffected.
Modes (``student_network``):

- ``strict`` (default): 127.0.0.0/8, ::1 and the model proxy's address and port;
- ``internal``: ``strict`` plus the private ranges (10/8, 172.16/12, 192.168/16, fc00::/7);
- ``open``: no restriction, except:

in every mode the harness's own ports (tool server, event stream, …) are refused to the student,
on any address including localhost. Everything else is rejected at once (TCP reset / ICMP), so a
student connect fails fast instead of hanging. :func:`run_canary` proves it from the student's
side before the first step.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from karotte.errors import KarotteError
from karotte.sandbox.confinement.demote import Identity, run_as
from karotte.sandbox.confinement.sanitize import UntrustedBinaryError, resolve_system_binary

Mode = Literal["strict", "internal", "open"]
Backend = Literal["iptables", "nftables", "iptables-legacy"]

PRIVATE_V4 = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
PRIVATE_V6 = ("fc00::/7",)
CANARY_OUTSIDE = ("192.0.2.1", 80)  # TEST-NET-1: reserved for documentation, never routed


class FirewallError(KarotteError):
    """The firewall could not be installed (no iptables/nft, no CAP_NET_ADMIN, …)."""


class CanaryError(KarotteError):
    """The student reached something the firewall must block: the run cannot be trusted."""


class FirewallReport(BaseModel):
    """What the firewall enforces (part of the limits_applied event)."""

    model_config = ConfigDict(extra="forbid")

    mode: Mode
    backend: str | None
    allowed: list[str]
    closed_ports: list[int]
    ipv6: bool = False
    detail: str | None = None


@dataclass
class _Target:
    network: str  # "127.0.0.0/8" or "1.2.3.4/32"
    port: int | None = None
    family: int = 4


def proxy_targets(proxy_url: str | None) -> list[_Target]:
    """The addresses and port of the model proxy (resolved now, by the harness)."""
    if not proxy_url:
        return []
    parts = urlsplit(proxy_url if "://" in proxy_url else f"http://{proxy_url}")
    if not parts.hostname:
        return []
    port = parts.port or (443 if parts.scheme == "https" else 80)
    targets: list[_Target] = []
    try:
        infos = socket.getaddrinfo(parts.hostname, port, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise FirewallError(f"cannot resolve the model proxy host {parts.hostname}: {exc}") from exc
    for family, *_, address in infos:
        ip = address[0]
        version = 6 if family == socket.AF_INET6 else 4
        target = _Target(f"{ip}/{128 if version == 6 else 32}", port, version)
        if all(t.network != target.network for t in targets):
            targets.append(target)
    return targets


@dataclass
class StudentFirewall:
    """Install with :meth:`install`, always :meth:`remove` in teardown (idempotent)."""

    uid: int
    mode: Mode = "strict"
    proxy_url: str | None = None
    harness_ports: list[int] = field(default_factory=list)
    backend: Backend | None = None  # None: iptables, then nftables, then iptables-legacy
    tag: str = field(default_factory=lambda: str(os.getpid()))
    installed: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.uid == 0:
            raise FirewallError("refusing to firewall uid 0")
        self.chain = f"KAROTTE-{self.tag}"[:28]
        self.table = f"karotte_{self.tag}"

    # ---- rule sets ----------------------------------------------------------------------------
    def _allowed(self, version: int) -> list[_Target]:
        allowed = [_Target("127.0.0.0/8" if version == 4 else "::1/128", None, version)]
        allowed += [t for t in proxy_targets(self.proxy_url) if t.family == version]
        if self.mode == "internal":
            allowed += [
                _Target(n, None, version) for n in (PRIVATE_V4 if version == 4 else PRIVATE_V6)
            ]
        return allowed

    def _iptables_rules(self, version: int) -> list[list[str]]:
        rules: list[list[str]] = []
        for port in self.harness_ports:
            rules.append(
                ["-p", "tcp", "--dport", str(port), "-j", "REJECT", "--reject-with", "tcp-reset"]
            )
            rules.append(["-p", "udp", "--dport", str(port), "-j", "REJECT"])
        if self.mode == "open":
            return rules
        for target in self._allowed(version):
            rule = ["-d", target.network]
            if target.port is not None:
                rule += ["-p", "tcp", "--dport", str(target.port)]
            rules.append([*rule, "-j", "RETURN"])
        rules.append(["-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"])
        rules.append(["-j", "REJECT"])
        return rules

    def _nft_script(self) -> str:
        lines = [
            f"table inet {self.table} {{",
            "  chain output {",
            "    type filter hook output priority 0; policy accept;",
            f"    meta skuid != {self.uid} accept",
        ]
        if self.harness_ports:
            ports = ", ".join(str(p) for p in self.harness_ports)
            lines.append(f"    tcp dport {{ {ports} }} reject with tcp reset")
            lines.append(f"    udp dport {{ {ports} }} reject")
        if self.mode != "open":
            for version in (4, 6):
                family = "ip" if version == 4 else "ip6"
                for target in self._allowed(version):
                    rule = f"    {family} daddr {target.network}"
                    if target.port is not None:
                        rule += f" tcp dport {target.port}"
                    lines.append(rule + " accept")
            lines.append("    meta l4proto tcp reject with tcp reset")
            lines.append("    reject")
        lines += ["  }", "}"]
        return "\n".join(lines) + "\n"

    # ---- install / remove ---------------------------------------------------------------------
    def install(self) -> FirewallReport:
        """Install with the chosen backend, or the first that works; FirewallError if none."""
        candidates: list[Backend] = (
            [self.backend] if self.backend else ["iptables", "nftables", "iptables-legacy"]
        )
        errors: list[str] = []
        for backend in candidates:
            try:
                if backend == "nftables":
                    ipv6 = self._install_nft()
                else:
                    suffix = "-legacy" if backend == "iptables-legacy" else ""
                    ipv6 = self._install_iptables(suffix)
            except FirewallError as exc:
                self.remove()
                errors.append(f"{backend}: {exc}")
                continue
            except BaseException:
                self.remove()
                raise
            allowed = [
                t.network + (f":{t.port}" if t.port else "")
                for v in (4, 6)
                for t in self._allowed(v)
            ]
            return FirewallReport(
                mode=self.mode,
                backend=f"{backend} (owner match on uid {self.uid})",
                allowed=["everything"] if self.mode == "open" else allowed,
                closed_ports=list(self.harness_ports),
                ipv6=ipv6,
                detail="; ".join(errors) or None,
            )
        raise FirewallError("; ".join(errors))

    def _run(self, argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=30, check=False
        )

    def _install_iptables(self, suffix: str = "") -> bool:
        ipv6 = True
        for version, name in ((4, f"iptables{suffix}"), (6, f"ip6tables{suffix}")):
            try:
                binary = resolve_system_binary(name)
            except UntrustedBinaryError as exc:
                if version == 4:
                    raise FirewallError(str(exc)) from exc
                ipv6 = False
                continue
            steps = [["-N", self.chain]]
            steps += [["-A", self.chain, *rule] for rule in self._iptables_rules(version)]
            steps.append(
                ["-I", "OUTPUT", "1", "-m", "owner", "--uid-owner", str(self.uid), "-j", self.chain]
            )
            for step in steps:
                result = self._run([binary, "-w", "5", *step])
                if result.returncode != 0:
                    if version == 6:
                        ipv6 = False
                        self._remove_iptables(binary)
                        break
                    raise FirewallError(
                        f"{name} {' '.join(step)} failed: {result.stderr.strip()} "
                        "(the harness needs CAP_NET_ADMIN and the xt_owner match)"
                    )
                self.installed.append(f"{name}:{' '.join(step)}")
        return ipv6

    def _install_nft(self) -> bool:
        try:
            binary = resolve_system_binary("nft")
        except UntrustedBinaryError as exc:
            raise FirewallError(f"neither iptables nor nft is usable: {exc}") from exc
        result = self._run([binary, "-f", "-"], stdin=self._nft_script())
        if result.returncode != 0:
            raise FirewallError(f"nft failed: {result.stderr.strip()} (needs CAP_NET_ADMIN)")
        self.installed.append(f"nft:table inet {self.table}")
        return True

    def _remove_iptables(self, binary: str) -> None:
        jump = ["OUTPUT", "-m", "owner", "--uid-owner", str(self.uid), "-j", self.chain]
        for _ in range(10):  # delete every jump we may have added
            if self._run([binary, "-w", "5", "-D", *jump]).returncode != 0:
                break
        self._run([binary, "-w", "5", "-F", self.chain])
        self._run([binary, "-w", "5", "-X", self.chain])

    def remove(self) -> None:
        """Remove every rule this firewall added (safe to call more than once)."""
        for name in ("iptables", "ip6tables", "iptables-legacy", "ip6tables-legacy"):
            if any(entry.startswith(f"{name}:") for entry in self.installed):
                with contextlib.suppress(UntrustedBinaryError):
                    self._remove_iptables(resolve_system_binary(name))
        if any(entry.startswith("nft:") for entry in self.installed):
            with contextlib.suppress(UntrustedBinaryError):
                self._run([resolve_system_binary("nft"), "delete", "table", "inet", self.table])
        self.installed.clear()


# ---- canary ----------------------------------------------------------------------------------


def _try_connect(host: str, port: int, timeout_s: float) -> str:
    family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect((host, port))
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return f"blocked ({exc.strerror or exc})"
    finally:
        sock.close()
    return "connected"


def probe_as(
    identity: Identity, targets: Iterable[tuple[str, int]], timeout_s: float = 1.0
) -> dict[str, str]:
    """Try each ``(host, port)`` from a child demoted to the student; ``{"host:port": result}``."""
    wanted = list(targets)

    def probe() -> dict[str, str]:
        return {f"{h}:{p}": _try_connect(h, p, timeout_s) for h, p in wanted}

    return run_as(identity, probe, timeout_s=timeout_s * len(wanted) + 5)


def run_canary(
    identity: Identity,
    harness_ports: Iterable[int] = (),
    outside: tuple[str, int] | None = CANARY_OUTSIDE,
    timeout_s: float = 1.0,
) -> dict[str, str]:
    """Prove the student can reach neither the outside nor the harness's ports.

    Sends one connection attempt to ``outside`` (a TEST-NET-1 address by default, which the
    firewall must reject before it leaves) and one to each harness port on 127.0.0.1. Raises
    :class:`CanaryError` when any of them connects. ``outside=None`` probes only the ports
    (for the ``open`` network mode, where the outside is allowed).
    """
    targets = [*([outside] if outside else []), *(("127.0.0.1", port) for port in harness_ports)]
    results = probe_as(identity, targets, timeout_s)
    leaks = [target for target, result in results.items() if result == "connected"]
    if leaks:
        raise CanaryError(
            f"network canary: the student connected to {', '.join(leaks)}; the firewall does "
            "not hold, so this run cannot be trusted"
        )
    return results
