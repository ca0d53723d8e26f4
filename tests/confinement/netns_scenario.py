"""Run inside a fresh network namespace (``unshare --net``): a whole firewall scenario, as JSON.

argv: uid gid backend mode. Addresses on the namespace's own ``lo`` stand in for "outside"
(192.0.2.1, TEST-NET-1) and "internal" (10.11.12.13): no packet ever leaves the namespace.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from karotte.sandbox.confinement.demote import Identity
from karotte.sandbox.confinement.firewall import (
    StudentFirewall,
    _try_connect,
    probe_as,
    run_canary,
)

uid, gid, backend, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
for address in ("192.0.2.1/32", "10.11.12.13/32"):
    subprocess.run(["ip", "addr", "add", address, "dev", "lo"], check=True)

listeners = []
targets = {
    "service": ("127.0.0.1", 8001),
    "harness": ("127.0.0.1", 8002),
    "outside": ("192.0.2.1", 80),
    "internal": ("10.11.12.13", 80),
    "proxy": ("10.11.12.13", 4000),
}
for host, port in targets.values():
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(16)
    listeners.append(sock)

student = Identity(name=str(uid), uid=uid, gid=gid, home="/")
firewall = StudentFirewall(
    uid,
    mode=mode,
    proxy_url="http://10.11.12.13:4000",
    harness_ports=[8002],
    backend=backend,  # type: ignore[arg-type]
)
out: dict[str, object] = {}
try:
    out["report"] = firewall.install().model_dump()
    as_student = probe_as(student, targets.values(), 1.0)
    out["student"] = {name: as_student[f"{h}:{p}"] for name, (h, p) in targets.items()}
    out["root"] = {name: _try_connect(h, p, 1.0) for name, (h, p) in targets.items()}
    try:
        out["canary"] = run_canary(student, [8002])
    except Exception as exc:
        out["canary_error"] = str(exc)
finally:
    firewall.remove()
after = probe_as(student, [targets["outside"]], 1.0)
out["student_after_remove"] = after["192.0.2.1:80"]
print(json.dumps(out))
