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
    """Whether a Firecracker microVM really boots here, and why (the boot probe's answer).

    ``/dev/kvm`` existing proves nothing (on nested/PVM hosts it answers the API but guests
    die), so only :func:`karotte.host.boot_probe.firecracker_boot_probe` may say yes: it boots
    the guest kernel to a marker with a timeout (cached per binary, kernel and host kernel).
    A guest that boots is not enough either: the ``firecracker`` runtime must be usable.
    """
    from karotte.host.boot_probe import firecracker_boot_probe

    probe = firecracker_boot_probe()
    if not probe.ok:
        cached = " (cached probe)" if probe.cached else ""
        return False, f"boot probe: {probe.reason}{cached}"
    from karotte.host.runtimes.base import get_runtime

    availability = get_runtime("firecracker").availability()
    if not availability.ok:
        return False, f"boot probe: {probe.reason}, but {availability.reason}"
    return True, f"boot probe: {probe.reason}"


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
