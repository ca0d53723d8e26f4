"""``apple-container``: Apple's ``container`` CLI on macOS 26+ (Apple silicon). Every container is
its own lightweight VM (own Linux kernel) under Apple's Virtualization framework.

The flow is docker's (:class:`OciCliRuntime`) with these differences:

* availability: ``container --version`` must be at least :data:`MIN_VERSION`, and
  ``container system status`` must answer (else the fix is ``container system start``);
* builds: ``container build --progress plain``; a build context or Containerfile under a
  symlinked path (``/tmp`` → ``/private/tmp``, ``/var`` → ``/private/var`` on macOS) is refused,
  because Apple's builder resolves paths differently from the CLI and silently builds the wrong
  tree; images are imported by building ``FROM scratch`` + ``ADD rootfs.tar /``;
* mounts are *copied in and out*: each ``--mount`` source is copied into a private staging dir
  (regular files and directories only, no links), the staging dir is what the VM sees, and after
  the sandbox stopped the writable mounts' regular files are copied back (never through a link);
* no ``--cap-*``/``--device``/``--cgroup-parent``/``--init`` (a VM per container: the harness is
  root in its own kernel), memory in MiB, ``--tmpfs`` without a size, no ``wait`` command (the
  state is polled with ``inspect``).

No Mac is available to us: the argument construction is tested against a fake ``container``
executable that records its argv and plays canned answers (tests/test_apple_container.py).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

from karotte.errors import RuntimeUnavailableError
from karotte.host.runtimes.base import (
    Availability,
    Sandbox,
    SandboxSpec,
    register_runtime,
)
from karotte.host.runtimes.oci_cli import BuildError, OciCliRuntime

MIN_VERSION = (0, 5, 0)
INSTALL_FIX = (
    "install Apple's container (the signed installer package from "
    "https://github.com/apple/container/releases) on macOS 26+ with Apple silicon, then "
    "`container system start`"
)
START_FIX = "start Apple's container services: `container system start`"
_VERSION_RE = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def macos_major() -> int:
    try:
        return int(platform.mac_ver()[0].split(".")[0])
    except ValueError:
        return 0


def platform_problem() -> str | None:
    """Why Apple's container cannot run on this machine at all, or None."""
    if sys.platform != "darwin":
        return f"apple-container needs macOS 26+ on Apple silicon (this is {sys.platform})"
    if platform.machine() != "arm64":
        return f"apple-container needs Apple silicon (this Mac is {platform.machine()})"
    if macos_major() < 26:
        return f"apple-container needs macOS 26+ (this is macOS {platform.mac_ver()[0]})"
    return None


def symlinked_component(path: Path) -> Path | None:
    """The first component of ``path`` (made absolute, not resolved) that is a symlink."""
    current = Path(path.anchor)
    for part in path.absolute().parts[1:]:
        current = current / part
        if current.is_symlink():
            return current
    return None


def _fingerprint(path: Path) -> list[int]:
    st = path.lstat()
    return [st.st_size, st.st_mtime_ns]


def copy_in(source: Path, stage: Path) -> dict[str, list[int]]:
    """Copy ``source`` (file or tree) into ``stage``: regular files and directories only; links
    and special files are left out (a link could point anywhere on the host). Returns each
    copied file's (size, mtime) in the stage, so that :func:`copy_out` brings back only what the
    guest wrote (a stale copy must not overwrite what another run wrote meanwhile)."""
    st = source.lstat()
    if stat.S_ISREG(st.st_mode):
        stage.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, stage, follow_symlinks=False)
        return {".": _fingerprint(stage)}
    copied: dict[str, list[int]] = {}
    if not stat.S_ISDIR(st.st_mode):
        raise RuntimeUnavailableError(f"mount source {source} is neither a file nor a directory")
    stage.mkdir(parents=True, exist_ok=True)
    for root, dirs, files in os.walk(source, followlinks=False):
        rel = Path(root).relative_to(source)
        for name in dirs:
            if not (Path(root) / name).is_symlink():
                (stage / rel / name).mkdir(exist_ok=True)
        for name in files:
            item = Path(root) / name
            if stat.S_ISREG(item.lstat().st_mode):
                shutil.copy2(item, stage / rel / name, follow_symlinks=False)
                copied[str(rel / name)] = _fingerprint(stage / rel / name)
    return copied


def copy_out(stage: Path, dest: Path, copied_in: dict[str, list[int]] | None = None) -> list[str]:
    """Copy the regular files of ``stage`` that the guest created or changed (unlike
    ``copied_in``) back to ``dest`` (a writable mount's source); never follows or creates a
    link, on either side. Returns what was refused."""
    copied_in = copied_in or {}
    refused: list[str] = []
    if not stage.is_dir():
        return refused
    for root, dirs, files in os.walk(stage, followlinks=False):
        rel = Path(root).relative_to(stage)
        target_dir = dest / rel
        if _link_below(dest, rel):  # links at or above dest are the user's; below, the guest's
            refused.append(f"{rel}: a link on the host side")
            dirs[:] = []
            continue
        target_dir.mkdir(parents=True, exist_ok=True)
        for name in list(dirs):
            if (Path(root) / name).is_symlink():
                refused.append(f"{rel / name}: a link")
                dirs.remove(name)
        for name in files:
            item = Path(root) / name
            if not stat.S_ISREG(item.lstat().st_mode):
                refused.append(f"{rel / name}: not a regular file")
                continue
            if copied_in.get(str(rel / name)) == _fingerprint(item):
                continue  # unchanged since it was copied in
            target = target_dir / name
            if target.is_symlink():
                refused.append(f"{rel / name}: the host file is a link")
                continue
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
            fd = os.open(target, flags, item.lstat().st_mode & 0o777)
            with os.fdopen(fd, "wb") as out, item.open("rb") as src:
                shutil.copyfileobj(src, out)
    return refused


def _link_below(dest: Path, rel: Path) -> bool:
    current = dest
    for part in rel.parts:
        current = current / part
        if current.is_symlink():
            return True
    return False


def state_root() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "karotte" / "apple-container"


class AppleContainerRuntime(OciCliRuntime):
    name: ClassVar[str] = "apple-container"
    sandbox_kind: ClassVar[str] = "apple-container"
    binary: ClassVar[str] = "container"
    supports_writable_cgroup: ClassVar[bool] = False
    isolation: ClassVar[str] = "vm"

    def __init__(
        self,
        global_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        check_platform: bool = True,
    ) -> None:
        super().__init__(global_args, env)
        self.check_platform = check_platform

    # ---- diagnosis ---------------------------------------------------------------------------
    def install_fix(self) -> str:
        return INSTALL_FIX

    def start_engine_fix(self) -> str:
        return START_FIX

    def version(self) -> tuple[int, int, int] | None:
        proc = self._run("--version", check=False, timeout_s=15)
        match = _VERSION_RE.search(proc.stdout.decode(errors="replace"))
        return (int(match[1]), int(match[2]), int(match[3])) if match else None

    def availability(self) -> Availability:
        if self.check_platform and (why := platform_problem()) is not None:
            return Availability(
                ok=False, reason=why, fix="use docker (or podman / docker:gvisor) on this machine"
            )
        if shutil.which(self.binary, path=self.cli_env().get("PATH")) is None:
            return Availability(ok=False, reason="`container` is not installed", fix=INSTALL_FIX)
        try:
            found = self.version()
        except (RuntimeUnavailableError, subprocess.TimeoutExpired):
            found = None
        if found is None:
            return Availability(
                ok=False, reason="`container --version` printed no version", fix=INSTALL_FIX
            )
        if found < MIN_VERSION:
            have = ".".join(map(str, found))
            need = ".".join(map(str, MIN_VERSION))
            return Availability(
                ok=False,
                reason=f"Apple container {have} is too old (karotte needs {need}+)",
                fix=INSTALL_FIX,
            )
        try:
            status = self._run("system", "status", check=False, timeout_s=15)
        except subprocess.TimeoutExpired:
            return Availability(
                ok=False, reason="`container system status` did not answer", fix=START_FIX
            )
        if status.returncode != 0:
            detail = (status.stderr or status.stdout).decode(errors="replace").strip()
            return Availability(
                ok=False,
                reason=f"Apple's container services are not running: {detail or 'not running'}",
                fix=START_FIX,
            )
        return Availability(ok=True)

    # ---- images ------------------------------------------------------------------------------
    def _refuse_symlinked(self, what: str, path: Path) -> None:
        link = symlinked_component(path)
        if link is not None:
            raise BuildError(
                f"apple-container: the {what} {path} is under a symlinked path ({link} -> "
                f"{os.readlink(link)}); Apple's builder resolves it differently and would build "
                f"the wrong tree. Use the real path: {path.resolve()}"
            )

    def build_command(
        self,
        context: Path,
        containerfile: Path,
        tag: str,
        build_args: dict[str, str],
        iid: Path,
        no_cache: bool = False,
    ) -> list[str]:
        self._refuse_symlinked("build context", context)
        self._refuse_symlinked("Containerfile", containerfile)
        args = ["build", "--progress", "plain", "-f", str(containerfile), "-t", tag]
        if no_cache:
            args.append("--no-cache")
        for key, value in sorted(build_args.items()):
            args += ["--build-arg", f"{key}={value}"]
        args.append(str(context))
        return self.command(*args)

    def build_env(self) -> dict[str, str]:
        return {}

    def image_id(self, tag: str) -> str:
        proc = self._run("image", "inspect", tag)
        data = _json(proc.stdout)
        entry = data[0] if isinstance(data, list) and data else data
        if isinstance(entry, dict):
            for key in ("id", "digest"):
                if isinstance(entry.get(key), str):
                    return str(entry[key])
            index = entry.get("index")
            if isinstance(index, dict) and isinstance(index.get("digest"), str):
                return str(index["digest"])
        return tag

    def image_exists(self, tag: str) -> bool:
        proc = self._run("image", "inspect", tag, check=False)
        if proc.returncode == 0:
            return True
        stderr = proc.stderr.decode(errors="replace")
        if self._engine_down(stderr) or "xpc" in stderr.lower():
            raise RuntimeUnavailableError(
                f"runtime {self.name!r}: the container services are not answering: "
                f"{stderr.strip()}\nfix: {START_FIX}"
            )
        return False

    def import_rootfs(self, tarball: Path, tag: str) -> str:
        """No ``import`` command: build ``FROM scratch`` with the tarball added at ``/``."""
        with tempfile.TemporaryDirectory(prefix="karotte-import-") as tmp:
            context = Path(tmp).resolve()  # macOS: /var/folders… is under the /var symlink
            shutil.copy2(tarball, context / "rootfs.tar")
            containerfile = context / "Containerfile"
            containerfile.write_text("FROM scratch\nADD rootfs.tar /\n")
            return self.build(context, containerfile, tag, {})

    def remove_image(self, tag: str) -> None:
        self._run("image", "delete", tag, check=False)

    # ---- sandboxes ---------------------------------------------------------------------------
    def _state_dir(self, name: str) -> Path:
        return state_root().resolve() / "sandboxes" / name

    def run_command(self, spec: SandboxSpec) -> tuple[list[str], dict[str, str]]:
        args: list[str] = ["run", "--detach", "--name", spec.name]
        if spec.network == "none":
            args.append("--no-dns")
        elif spec.network:
            args += ["--network", spec.network]
        for key, value in sorted(spec.labels.items()):
            args += ["--label", f"{key}={value}"]
        secret_env: dict[str, str] = {}
        for key, value in sorted(spec.env.items()):
            args += ["--env", key]  # inherited from the CLI's environment: not in argv/ps
            secret_env[key] = value
        for index, mount in enumerate(spec.mounts):
            stage = self._state_dir(spec.name) / "mounts" / str(index)
            arg = f"type=bind,source={stage},target={mount.target}"
            args += ["--mount", arg + (",readonly" if mount.read_only else "")]
        if spec.memory_bytes is not None:
            args += ["--memory", f"{max(1, spec.memory_bytes >> 20)}M"]
        if spec.cpus is not None:
            args += ["--cpus", str(max(1, round(spec.cpus)))]
        for path in sorted(spec.tmpfs):
            args += ["--tmpfs", path]
        if spec.workdir:
            args += ["--workdir", spec.workdir]
        args += [spec.image, *spec.command]
        return self.command(*args), secret_env

    def _stage_mounts(self, spec: SandboxSpec) -> None:
        state = self._state_dir(spec.name)
        if state.exists():
            shutil.rmtree(state)
        records: list[dict[str, Any]] = []
        for index, mount in enumerate(spec.mounts):
            for value in (str(mount.source), mount.target):
                if "," in value or "=" in value:
                    raise RuntimeUnavailableError(
                        f"mount path {value!r} contains ',' or '=', which the CLI cannot take"
                    )
            stage = state / "mounts" / str(index)
            copied = copy_in(mount.source, stage)
            records.append(
                {
                    "stage": str(stage),
                    "source": str(mount.source),
                    "read_only": mount.read_only,
                    "dir": mount.source.is_dir(),
                    "copied_in": copied,
                }
            )
        state.mkdir(parents=True, exist_ok=True)
        (state / "mounts.json").write_text(json.dumps(records))

    def copy_back(self, name: str) -> list[str]:
        """Copy the writable mounts' regular files back to their sources (once)."""
        state = self._state_dir(name)
        manifest = state / "mounts.json"
        done = state / "copied-back"
        if not manifest.exists() or done.exists():
            return []
        refused: list[str] = []
        for record in json.loads(manifest.read_text()):
            if record["read_only"] or not record["dir"]:
                continue
            refused += copy_out(
                Path(record["stage"]), Path(record["source"]), record.get("copied_in")
            )
        done.touch()
        return refused

    def start(self, spec: SandboxSpec) -> Sandbox:
        self._stage_mounts(spec)
        try:
            sandbox = super().start(spec)
        except BaseException:
            shutil.rmtree(self._state_dir(spec.name), ignore_errors=True)
            raise
        return sandbox.model_copy(update={"id": spec.name})

    def _inspect(self, sandbox_id: str) -> dict[str, Any] | None:
        proc = self._run("inspect", sandbox_id, check=False)
        if proc.returncode != 0:
            return None
        data = _json(proc.stdout)
        entry = data[0] if isinstance(data, list) and data else data
        return entry if isinstance(entry, dict) else None

    def wait(self, sandbox: Sandbox, timeout_s: float | None = None) -> int:
        """Apple's CLI has no ``wait``: poll ``inspect`` until the container is not running."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            info = self._inspect(sandbox.id)
            if info is None:
                return -1
            if str(info.get("status", "")).lower() not in ("running", "stopping", "starting"):
                self.copy_back(sandbox.name)
                for key in ("exitCode", "exit_code", "exitStatus"):
                    if isinstance(info.get(key), int):
                        return int(info[key])
                return 0
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"sandbox {sandbox.name} still running after {timeout_s} s")
            time.sleep(0.2)

    def stop(self, sandbox: Sandbox, timeout_s: float = 10) -> None:
        proc = self._run(
            "stop", "--time", str(int(timeout_s)), sandbox.id, timeout_s=timeout_s + 60, check=False
        )
        if proc.returncode != 0 and not self._no_such(proc.stderr):
            stderr = proc.stderr.decode(errors="replace").strip()
            if "not found" not in stderr.lower():
                raise RuntimeUnavailableError(f"stopping {sandbox.name} failed: {stderr}")
        self.copy_back(sandbox.name)

    def remove(self, sandbox: Sandbox) -> None:
        self.copy_back(sandbox.name)
        self.remove_ids([sandbox.id])
        shutil.rmtree(self._state_dir(sandbox.name), ignore_errors=True)

    def remove_ids(self, ids: list[str]) -> None:
        if not ids:
            return
        proc = self._run("delete", "--force", *ids, timeout_s=120, check=False)
        if proc.returncode != 0:
            stderr = proc.stderr.decode(errors="replace").strip()
            lines = [ln for ln in stderr.splitlines() if ln.strip()]
            if lines and all(
                self._no_such(ln.encode()) or "not found" in ln.lower() for ln in lines
            ):
                return
            raise RuntimeUnavailableError(f"removing sandboxes failed: {stderr}")

    def list_sandboxes(self, labels: dict[str, str]) -> list[Sandbox]:
        data = _json(self._run("list", "--all", "--format", "json").stdout)
        found: list[Sandbox] = []
        for entry in data if isinstance(data, list) else []:
            if not isinstance(entry, dict):
                continue
            config = (
                entry.get("configuration")
                if isinstance(entry.get("configuration"), dict)
                else entry
            )
            assert isinstance(config, dict)
            sandbox_id = str(config.get("id") or entry.get("id") or "")
            sandbox_labels = config.get("labels") or entry.get("labels") or {}
            if not sandbox_id or not isinstance(sandbox_labels, dict):
                continue
            if all(
                sandbox_labels.get(key) == value if value else key in sandbox_labels
                for key, value in labels.items()
            ):
                found.append(
                    Sandbox(
                        id=sandbox_id,
                        name=sandbox_id,
                        runtime=self.name,
                        labels={str(k): str(v) for k, v in sandbox_labels.items()},
                    )
                )
        return found

    def is_running(self, sandbox: Sandbox) -> bool:
        info = self._inspect(sandbox.id)
        return info is not None and str(info.get("status", "")).lower() == "running"

    def exec_prefix(self, sandbox: Sandbox, user: str | None = None) -> list[str]:
        args = ["exec", "--interactive", "--tty"]
        if user:
            args += ["--user", user]
        return [*self.command(*args), sandbox.name]

    def copy_from_image(self, image: str, paths: list[str]) -> dict[str, bytes | None]:
        raise RuntimeUnavailableError(
            "apple-container cannot copy files out of an image (no `cp` from a created "
            "container in its CLI); build with docker for image checks"
        )

    def grantable_capabilities(self, wanted: list[str]) -> tuple[list[str], list[str]]:
        # each container is its own VM: the harness is root in its own kernel
        return list(wanted), []


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw.decode(errors="replace") or "null")
    except json.JSONDecodeError:
        return None


register_runtime("apple-container")(AppleContainerRuntime)
