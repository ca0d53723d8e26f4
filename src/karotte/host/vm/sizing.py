"""How big a VM is: the sandbox's budget plus room for the guest kernel.

Guest RAM = sandbox memory (default 4 GiB) + 1 GiB for the guest kernel and the init. Inside, the
init bounds harness + student by the sandbox memory (cgroup v2 ``karotte``), and the harness keeps
1 GiB of that for itself, so the student's limit is sandbox - 1 GiB. vCPUs: the task's ``cpus``
rounded up (at most the host's), else 2 (at most the host's).
"""

from __future__ import annotations

import math
import os

MIB = 1024**2
GIB = 1024**3
DEFAULT_SANDBOX_MEMORY = 4 * GIB
GUEST_KERNEL_RESERVE = 1 * GIB
DEFAULT_VCPUS = 2


def guest_memory_mib(sandbox_bytes: int | None) -> int:
    sandbox = sandbox_bytes or DEFAULT_SANDBOX_MEMORY
    return math.ceil((sandbox + GUEST_KERNEL_RESERVE) / MIB)


def student_memory_bytes(sandbox_bytes: int | None) -> int:
    return (sandbox_bytes or DEFAULT_SANDBOX_MEMORY) - GUEST_KERNEL_RESERVE


def guest_vcpus(cpus: float | None, host_cpus: int | None = None) -> int:
    host = host_cpus or os.cpu_count() or 1
    wanted = math.ceil(cpus) if cpus else DEFAULT_VCPUS
    return max(1, min(wanted, host))
