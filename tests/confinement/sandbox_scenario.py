"""Run as root inside a real sandbox: confine a student, attack, take custody; print JSON.

Used by test_in_sandbox.py (the karotte sources and dependencies are bind-mounted).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

from karotte.config import EvaluationRunConfig
from karotte.errors import StudentMisbehaviorError
from karotte.sandbox.confinement.custody import collect_submission
from karotte.sandbox.confinement.demote import preexec_for, student_identity
from karotte.sandbox.confinement.firewall import CanaryError
from karotte.sandbox.confinement.namespaces import kill_session, wrap_student_command
from karotte.sandbox.confinement.processes import processes_of_uid
from karotte.sandbox.confinement.setup import setup_confinement

subprocess.run(["useradd", "-u", "1000", "-m", "-d", "/workdir", "student"], check=True)
os.makedirs("/root_data", mode=0o700, exist_ok=True)
Path("/root_data/answer").write_text("the answer\n")
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(4)
port = listener.getsockname()[1]

config = EvaluationRunConfig(
    task_id="t", student_user="student", transcript_file=Path("/out/run.json")
)
identity = student_identity("student")
out: dict[str, object] = {}
try:
    confinement = setup_confinement(config, harness_ports=[port])
except CanaryError as exc:
    # no firewall here (e.g. gVisor without iptables): the canary must have said so; go on
    # without harness ports to exercise the rest
    out["canary_error"] = str(exc)
    confinement = setup_confinement(config, harness_ports=[])
out["limits"] = confinement.payload()
limits = confinement.limits
assert limits is not None


def session(script: str) -> subprocess.Popen[str]:
    command, demoted = wrap_student_command(["/bin/bash", "-c", script], identity)
    preexec = limits.preexec if demoted else (lambda: (limits.preexec(), preexec_for(identity)()))
    return subprocess.Popen(
        command,
        preexec_fn=preexec,
        cwd="/workdir",
        env={"PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


try:
    hog = session(
        "python3 -c 'import time\nb = []\nfor _ in range(64):\n"
        "    b.append(bytearray(64 << 20)); time.sleep(0.02)' && echo survived"
    )
    out["memory_hog"] = {"output": hog.communicate(timeout=120)[0][-200:], "code": hog.returncode}
    # a watchdog kill round (no cgroup) may still be sweeping: let it finish
    deadline = time.monotonic() + 10
    while processes_of_uid(identity.uid) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1)
    disk = confinement.payload()["disk"]
    if disk and str(disk[0].get("mechanism", "")).startswith("loop-mounted"):
        filler = session("head -c 20000000000 /dev/zero > /workdir/fill; echo rc=$?")
        out["disk_fill"] = filler.communicate(timeout=120)[0][-300:]
    else:
        # no quota in this sandbox: a real fill would land on the host's disk; don't
        out["disk_fill"] = "skipped: no disk quota here"
    if os.path.exists("/workdir/fill"):
        os.unlink("/workdir/fill")
    probe = session(f"timeout 3 bash -c 'echo > /dev/tcp/127.0.0.1/{port}' && echo reached")
    out["harness_port"] = probe.communicate(timeout=30)[0]
    # the swapper keeps changing the answer; a /dev/shm file and a /tmp file outlive commands
    swapper = session(
        "echo x > /dev/shm/leftover; echo y > /tmp/leftover; "
        "while true; do echo right > a.tmp && mv a.tmp answer.txt; "
        "echo wrong > a.tmp && mv a.tmp answer.txt; done"
    )
    time.sleep(1)
    copies = collect_submission(config, ["/workdir/answer.txt"])
    copy = copies["/workdir/answer.txt"]
    first = copy.read_text()
    time.sleep(0.3)
    out["custody"] = {
        "copy": first,
        "stable": copy.read_text() == first,
        "mode": oct(copy.stat().st_mode & 0o777),
        "left_processes": len(processes_of_uid(identity.uid)),
        "shm_left": os.path.exists("/dev/shm/leftover"),
        "tmp_left": os.path.exists("/tmp/leftover"),
    }
    kill_session(swapper.pid)
    swapper.wait()
    linker = session("ln -sf /root_data/answer /workdir/answer.txt")
    linker.wait()
    try:
        collect_submission(config, ["/workdir/answer.txt"])
        out["symlink"] = "accepted"
    except StudentMisbehaviorError as exc:
        out["symlink"] = exc.reason
finally:
    confinement.teardown()
    out["mounts_after"] = [
        line for line in Path("/proc/mounts").read_text().splitlines() if "/dev/loop" in line
    ]
print(json.dumps(out))
