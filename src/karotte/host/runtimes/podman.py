"""Podman (rootful here; crun or runc underneath)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from karotte.host.runtimes.base import Availability, register_runtime
from karotte.host.runtimes.oci_cli import OciCliRuntime

CAP_SYS_RESOURCE = 24
PODMAN_ULIMITS_FIX = (
    "add to /etc/containers/containers.conf:\n"
    "[containers]\n"
    'default_ulimits = ["nofile=16384:16384", "nproc=8192:8192"]'
)
HUGETLB_FIX = (
    "mkdir -p /sys/fs/cgroup/hugetlb && mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb"
)


def _containers_conf_files() -> list[Path]:
    files = [Path("/usr/share/containers/containers.conf"), Path("/etc/containers/containers.conf")]
    files += sorted(Path("/etc/containers/containers.conf.d").glob("*.conf"))
    if env := os.environ.get("CONTAINERS_CONF"):
        files.append(Path(env))
    return files


def _has_cap(cap: int) -> bool:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> cap & 1)
    except OSError:
        pass
    return True


def _ulimits_configured() -> bool:
    for path in _containers_conf_files():
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.strip().startswith("default_ulimits") and "nofile" in line:
                return True
    return False


def _hybrid_cgroups_without_hugetlb() -> bool:
    """crun refuses cgroup-v1 hybrid hosts until the hugetlb controller has a v1 mount."""
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists() or not (root / "unified").is_dir():
        return False  # pure v2, or no hybrid mount
    return not (root / "hugetlb" / "tasks").exists()


class PodmanRuntime(OciCliRuntime):
    name: ClassVar[str] = "podman"
    sandbox_kind: ClassVar[str] = "runc"
    binary: ClassVar[str] = "podman"

    def install_fix(self) -> str:
        return "install Podman: `apt-get install -y podman crun runc catatonit uidmap`"

    def start_engine_fix(self) -> str:
        if any(arg.startswith("--url") or arg == "--remote" for arg in self.global_args):
            return (
                "the podman service given by --url is not running: start it with "
                "`podman system service --time=0 <url> &`, or drop --url to use local podman"
            )
        return (
            "check `podman info` (podman needs no daemon; a broken storage or config shows "
            "there); " + self.install_fix()
        )

    def extra_availability(self) -> Availability:
        if os.geteuid() == 0 and not _has_cap(CAP_SYS_RESOURCE) and not _ulimits_configured():
            return Availability(
                ok=False,
                reason="root lacks CAP_SYS_RESOURCE here, so podman's default rlimits fail "
                "(`setrlimit RLIMIT_NOFILE`)",
                fix=PODMAN_ULIMITS_FIX,
            )
        if _hybrid_cgroups_without_hugetlb():
            return Availability(
                ok=False,
                reason="cgroup v1 hybrid host without a v1 hugetlb mount: crun refuses it",
                fix=HUGETLB_FIX,
            )
        return Availability(ok=True)


register_runtime("podman")(PodmanRuntime)
