"""Where the VM layer keeps its cache and the state of running sandboxes."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Kernel, initramfs and root drives (``$KAROTTE_VM_CACHE``, else a system or user cache)."""
    if value := os.environ.get("KAROTTE_VM_CACHE"):
        return Path(value)
    if os.geteuid() == 0:
        return Path("/var/cache/karotte/vm")
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "karotte" / "vm"


def kernel_package_dir() -> Path:
    """The unpacked Debian kernel package (``scripts/setup-vm.sh`` puts it there)."""
    if value := os.environ.get("KAROTTE_VM_KERNEL_DIR"):
        return Path(value)
    return Path("/var/cache/karotte/vm/kernel")


def state_dir() -> Path:
    """One directory per VM sandbox (its drives, channel log, pids, exit status)."""
    if value := os.environ.get("KAROTTE_VM_STATE"):
        return Path(value)
    if os.geteuid() == 0:
        return Path("/var/lib/karotte/vm/sandboxes")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "karotte" / "vm" / "sandboxes"
