"""What the root harness needs from the sandbox runtime to confine the student.

The launcher starts the sandbox with ``--cap-drop=ALL`` plus ``--cap-add`` for each of
:data:`HARNESS_CAPABILITIES`, ``--security-opt no-new-privileges`` and :data:`HARNESS_DEVICES`
(never ``--privileged``). The student (uid 1000) gets none of these: it loses every capability
when the harness drops to it.
"""

from __future__ import annotations

HARNESS_CAPABILITIES: list[str] = [
    "CHOWN",  # give the student its writable dirs (and the quota filesystem)
    "DAC_OVERRIDE",  # root reads/writes across permission bits (custody, cleanup)
    "FOWNER",  # chmod/utime on files the student owns (cleanup, custody dirs)
    "KILL",  # kill the student's processes
    "SETUID",  # drop to the student
    "SETGID",  # drop to the student's group, clear supplementary groups
    "NET_ADMIN",  # the student's firewall (iptables/nftables)
    "NET_RAW",  # legacy iptables backends open raw sockets
    "SYS_ADMIN",  # mount the loop quota; unshare PID/IPC namespaces; remove student SysV IPC
]
"""Linux capabilities the harness (root inside the sandbox) needs, without the ``CAP_`` prefix.

``SYS_RESOURCE`` is deliberately absent: the hosts we run on lack it in their bounding set, and the
harness only ever *lowers* limits.
"""

HARNESS_DEVICES: list[str] = ["/dev/loop-control", *(f"/dev/loop{n}" for n in range(8))]
"""Devices for the loop-mounted disk quota. Without them the quota falls back (see disk.py)."""
