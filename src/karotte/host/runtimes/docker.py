"""Docker (runc) and Docker with gVisor (``runsc``) runtimes."""

from __future__ import annotations

import json
import re
import subprocess
from typing import ClassVar

from karotte.host.runtimes.base import Availability, register_runtime
from karotte.host.runtimes.oci_cli import OciCliRuntime

DOCKERD_WITHOUT_SYSTEMD = (
    "nohup dockerd --iptables=false --ip6tables=false --bridge=none >/tmp/dockerd.log 2>&1 &"
)
GVISOR_DAEMON_JSON = (
    '{"runtimes":{"runsc":{"path":"/usr/bin/runsc","runtimeArgs":["--network=none"]}}}'
)


class DockerRuntime(OciCliRuntime):
    name: ClassVar[str] = "docker"
    sandbox_kind: ClassVar[str] = "runc"
    binary: ClassVar[str] = "docker"

    def install_fix(self) -> str:
        return (
            "install Docker: `apt-get install -y docker.io` (Debian/Ubuntu; see "
            "docs/runtimes.md for other systems), then start it: `systemctl start docker`, or "
            f"without systemd (as root): `{DOCKERD_WITHOUT_SYSTEMD}`"
        )

    def start_engine_fix(self) -> str:
        host = self.cli_env().get("DOCKER_HOST")
        where = (
            f" (DOCKER_HOST={host} is set: unset it or point it at a running engine)"
            if host
            else ""
        )
        return (
            f"start the Docker daemon{where}: `systemctl start docker`, or without systemd "
            f"(as root): `{DOCKERD_WITHOUT_SYSTEMD}`; a user outside the `docker` group needs "
            "`sudo usermod -aG docker $USER` and a new login"
        )

    def build_env(self) -> dict[str, str]:
        # The classic builder prints "Step N/M" lines, so a failure names its step; BuildKit
        # (if the user has buildx) is used when they ask for it explicitly.
        return {} if "DOCKER_BUILDKIT" in self.cli_env() else {"DOCKER_BUILDKIT": "0"}


class GVisorRuntime(DockerRuntime):
    """Docker with gVisor's ``runsc``: the student's syscalls hit a user-space kernel."""

    name: ClassVar[str] = "docker:gvisor"
    sandbox_kind: ClassVar[str] = "gvisor"
    run_args: ClassVar[tuple[str, ...]] = ("--runtime=runsc",)
    # runsc runs the sandbox's processes in its own kernel: host cgroup dirs bind-mounted in
    # cannot hold them, so the launcher does not offer a writable cgroup.
    supports_writable_cgroup: ClassVar[bool] = False
    host_disk_quota: ClassVar[bool] = True  # gVisor has no loop devices

    def grantable_capabilities(self, wanted: list[str]) -> tuple[list[str], list[str]]:
        # gVisor's kernel grants capabilities itself; the host's bounding set does not limit it
        return list(wanted), []

    def gvisor_fix(self) -> str:
        return (
            "install gVisor (`apt-get install -y runsc`, or see gvisor.dev), register it with "
            f"Docker in /etc/docker/daemon.json: `{GVISOR_DAEMON_JSON}` (merge with what is "
            "there), then reload Docker: `kill -HUP $(pidof dockerd)` (or "
            "`systemctl reload docker`). Never use runsc's --platform=kvm on a nested VM."
        )

    def extra_availability(self) -> Availability:
        proc = subprocess.run(
            self.command("info", "--format", "{{json .Runtimes}}"),
            capture_output=True,
            timeout=15,
            env=self.cli_env(),
            check=False,
        )
        try:
            runtimes = json.loads(proc.stdout or b"null") or {}
        except json.JSONDecodeError:
            runtimes = {}
        if "runsc" not in runtimes:
            return Availability(
                ok=False,
                reason="the Docker engine has no `runsc` runtime registered",
                fix=self.gvisor_fix(),
            )
        entry = runtimes.get("runsc") or {}
        return runsc_build_warning(str(entry.get("path") or "runsc")) or Availability(ok=True)


# runsc builds up to this date reject statx's AT_NO_AUTOMOUNT with EINVAL (seen with Debian 12's
# 0.0~20221219): coreutils' `ls -l` and `stat` fail in every sandbox; 0.0~20240729 works.
RUNSC_STATX_BUG_UNTIL = 20221219
_RUNSC_DATE = re.compile(r"runsc version (?:0\.0~|release-)?(\d{8})")


def runsc_build_warning(runsc: str) -> Availability | None:
    """Usable, but with a warning, when runsc is a build known to break ``ls -l``."""
    try:
        proc = subprocess.run(
            [runsc, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _RUNSC_DATE.search(proc.stdout)
    if match is None or int(match.group(1)) > RUNSC_STATX_BUG_UNTIL:
        return None
    return Availability(
        ok=True,
        reason=f"warning: runsc {match.group(1)} fails statx with EINVAL, so `ls -l` and `stat` "
        "fail inside every sandbox (an honest student's tools break)",
        fix="sudo scripts/setup-engines.sh (on Debian 12 it installs runsc from "
        "bookworm-backports: apt-get install -t bookworm-backports runsc)",
    )


register_runtime("docker")(DockerRuntime)
register_runtime("docker:gvisor")(GVisorRuntime)
