"""Which runtime ``karotte run`` uses when ``--runtime`` is not given, and why."""

from __future__ import annotations

import platform
import sys


def _macos_major() -> int:
    release = platform.mac_ver()[0]
    try:
        return int(release.split(".")[0])
    except ValueError:
        return 0


def firecracker_can_boot() -> tuple[bool, str]:
    """Whether a Firecracker microVM really boots here.

    ``/dev/kvm`` existing proves nothing (on nested/PVM hosts it answers the API but guests
    die), so only a boot probe with a timeout may say yes. That probe is not written yet.
    """
    return False, "no boot probe yet / KVM not verified"


def select_default_runtime() -> tuple[str, str]:
    """``(runtime name, why)`` for this machine. Never checks availability: a picked runtime that
    is not running stops the run with its fix, it does not fall back silently."""
    if sys.platform == "darwin":
        if platform.machine() == "arm64" and _macos_major() >= 26:
            return "apple-container", "macOS 26+ on Apple silicon"
        return (
            "docker",
            f"macOS {platform.mac_ver()[0]} on {platform.machine()}: Apple's container "
            "needs macOS 26+ on Apple silicon",
        )
    if sys.platform.startswith("linux"):
        ok, why = firecracker_can_boot()
        if ok:
            return "firecracker", why
        return "docker", f"Linux; firecracker not used: {why}"
    return "docker", f"{sys.platform}: docker is the only runtime offered"
