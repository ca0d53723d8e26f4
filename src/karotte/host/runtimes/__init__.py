"""Sandbox runtimes, registered by name: ``docker``, ``podman``, ``docker:gvisor``, ``local``."""

from karotte.host.runtimes import (  # noqa: F401  (registration)
    apple_container,
    docker,
    firecracker,
    local,
    podman,
    qemu,
)
from karotte.host.runtimes.base import (
    Availability,
    ExecResult,
    Mount,
    Runtime,
    Sandbox,
    SandboxSpec,
    get_runtime,
    register_runtime,
    runtime_names,
)
from karotte.host.runtimes.selection import select_default_runtime

__all__ = [
    "Availability",
    "ExecResult",
    "Mount",
    "Runtime",
    "Sandbox",
    "SandboxSpec",
    "get_runtime",
    "register_runtime",
    "runtime_names",
    "select_default_runtime",
]
