"""One runtime class for every engine with a Docker-compatible CLI (docker, podman, docker+runsc).

Everything goes through the engine's command line as a subprocess (never a shell). Subclasses
only say which binary, which extra ``run`` flags and how to diagnose the engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

from karotte.errors import RuntimeUnavailableError
from karotte.host.runtimes.base import (
    Availability,
    ExecResult,
    OutputCallback,
    Runtime,
    Sandbox,
    SandboxSpec,
)

# Substrings of engine errors meaning "the engine is not there", not "your command failed".
_ENGINE_DOWN_MARKERS = (
    "cannot connect to the docker daemon",
    "is the docker daemon running",
    "error during connect",
    "cannot connect to podman",
    "unable to connect to podman",
    "connection refused",
    "no such file or directory: unix",
    "permission denied while trying to connect",
)
_CAPABILITIES = (  # in kernel order: the index is the capability's number
    "CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP "
    "LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER "
    "SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE "
    "SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP "
    "MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF "
    "CHECKPOINT_RESTORE"
)
CAPABILITY_NUMBERS = {name: number for number, name in enumerate(_CAPABILITIES.split(" "))}


def host_bounding_set() -> int | None:
    """This process's capability bounding set (the engine on this host has the same one)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapBnd:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return None


_NO_SUCH_MARKERS = ("no such container", "no container with name or id", "no such object")


class BuildError(RuntimeUnavailableError):
    """``build`` failed. The message holds the failing step and its output."""


class OciCliRuntime(Runtime):
    """A runtime driven through a Docker-compatible CLI.

    ``global_args`` go before the sub-command (e.g. podman ``--url``); ``env`` is added to the
    CLI's environment (e.g. ``DOCKER_HOST``). Both exist so that tests can point a runtime at an
    engine that is not running.
    """

    binary: ClassVar[str]
    run_args: ClassVar[tuple[str, ...]] = ()
    supports_writable_cgroup: ClassVar[bool] = True
    # the sandbox cannot loop-mount its own disk quota (no loop devices): the launcher makes it
    host_disk_quota: ClassVar[bool] = False
    cli_timeout_s: ClassVar[float] = 60.0

    def __init__(
        self, global_args: list[str] | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.global_args = list(global_args or [])
        self.env_overrides = dict(env or {})

    def grantable_capabilities(self, wanted: list[str]) -> tuple[list[str], list[str]]:
        """``(granted, not grantable here)``: a container cannot get a capability the host's
        root lacks (runc then refuses to start, podman drops it silently)."""
        bounding = host_bounding_set()
        if bounding is None:
            return list(wanted), []
        granted, missing = [], []
        for cap in wanted:
            number = CAPABILITY_NUMBERS.get(cap.upper().removeprefix("CAP_"))
            if number is None or bounding >> number & 1:
                granted.append(cap)
            else:
                missing.append(cap)
        return granted, missing

    # ---- subprocess plumbing ---------------------------------------------------------------
    def command(self, *args: str) -> list[str]:
        return [self.binary, *self.global_args, *args]

    def cli_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env_overrides)
        env.update(extra or {})
        return env

    def _run(
        self,
        *args: str,
        timeout_s: float | None = None,
        check: bool = True,
        env: dict[str, str] | None = None,
        input_bytes: bytes | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        argv = self.command(*args)
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                input=input_bytes,
                timeout=timeout_s if timeout_s is not None else self.cli_timeout_s,
                env=self.cli_env(env),
                check=False,
            )
        except FileNotFoundError as exc:
            raise RuntimeUnavailableError(self._missing_binary_message()) from exc
        if proc.returncode != 0 and check:
            stderr = proc.stderr.decode(errors="replace").strip()
            if self._engine_down(stderr):
                raise RuntimeUnavailableError(
                    f"runtime {self.name!r}: the engine is not answering: {stderr}\n"
                    f"fix: {self.start_engine_fix()}"
                )
            raise RuntimeUnavailableError(
                f"runtime {self.name!r}: `{' '.join(argv[:4])} …` failed "
                f"(exit {proc.returncode}): {stderr}"
            )
        return proc

    @staticmethod
    def _engine_down(stderr: str) -> bool:
        low = stderr.lower()
        return any(marker in low for marker in _ENGINE_DOWN_MARKERS)

    @staticmethod
    def _no_such(stderr: bytes) -> bool:
        low = stderr.decode(errors="replace").lower()
        return any(marker in low for marker in _NO_SUCH_MARKERS)

    def _missing_binary_message(self) -> str:
        return f"runtime {self.name!r}: `{self.binary}` is not installed\nfix: {self.install_fix()}"

    # ---- diagnosis (subclasses give the exact fixes) -----------------------------------------
    def install_fix(self) -> str:
        raise NotImplementedError

    def start_engine_fix(self) -> str:
        raise NotImplementedError

    def availability(self) -> Availability:
        if shutil.which(self.binary, path=self.cli_env().get("PATH")) is None:
            return Availability(
                ok=False, reason=f"`{self.binary}` is not installed", fix=self.install_fix()
            )
        try:
            proc = subprocess.run(
                self.command("version", "--format", "{{.Server.Version}}"),
                capture_output=True,
                timeout=15,
                env=self.cli_env(),
                check=False,
            )
        except subprocess.TimeoutExpired:
            return Availability(
                ok=False,
                reason=f"`{self.binary} version` did not answer within 15 s",
                fix=self.start_engine_fix(),
            )
        if proc.returncode != 0 or not proc.stdout.strip():
            stderr = proc.stderr.decode(errors="replace").strip().splitlines()
            detail = stderr[-1] if stderr else f"exit {proc.returncode}"
            return Availability(
                ok=False,
                reason=f"the engine is not answering: {detail}",
                fix=self.start_engine_fix(),
            )
        return self.extra_availability()

    def extra_availability(self) -> Availability:
        """Engine-specific checks after the engine answered (runsc registered, rlimits …)."""
        return Availability(ok=True)

    # ---- images ------------------------------------------------------------------------------
    def build_command(
        self,
        context: Path,
        containerfile: Path,
        tag: str,
        build_args: dict[str, str],
        iid: Path,
        no_cache: bool = False,
    ) -> list[str]:
        # --force-rm: a failing step's intermediate container must not be left behind
        args = ["build", "--network=host", "--force-rm", "-f", str(containerfile), "-t", tag]
        if no_cache:
            args.append("--no-cache")
        args += ["--iidfile", str(iid)]
        for key, value in sorted(build_args.items()):
            args += ["--build-arg", f"{key}={value}"]
        args.append(str(context))
        return self.command(*args)

    def build_env(self) -> dict[str, str]:
        return {}

    def build(
        self,
        context: Path,
        containerfile: Path,
        tag: str,
        build_args: dict[str, str],
        on_output: OutputCallback | None = None,
        no_cache: bool = False,
    ) -> str:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="karotte-build-") as tmp:
            iid = Path(tmp) / "iid"
            argv = self.build_command(context, containerfile, tag, build_args, iid, no_cache)
            lines: list[str] = []
            try:
                proc = subprocess.Popen(
                    argv,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    env=self.cli_env(self.build_env()),
                )
            except FileNotFoundError as exc:
                raise RuntimeUnavailableError(self._missing_binary_message()) from exc
            assert proc.stdout is not None
            with proc:
                for raw in proc.stdout:
                    line = raw.decode(errors="replace").rstrip("\n")
                    lines.append(line)
                    if on_output is not None:
                        on_output(line)
            if proc.returncode != 0:
                text = "\n".join(lines)
                if self._engine_down(text):
                    raise RuntimeUnavailableError(
                        f"runtime {self.name!r}: the engine is not answering\n"
                        f"fix: {self.start_engine_fix()}"
                    )
                raise BuildError(_build_failure_message(self.name, tag, lines))
            image_id = iid.read_text().strip() if iid.exists() else ""
        return image_id or self.image_id(tag)

    def image_id(self, tag: str) -> str:
        proc = self._run("image", "inspect", "--format", "{{.Id}}", tag)
        return proc.stdout.decode().strip()

    def image_exists(self, tag: str) -> bool:
        proc = self._run("image", "inspect", "--format", "{{.Id}}", tag, check=False)
        if proc.returncode == 0:
            return True
        stderr = proc.stderr.decode(errors="replace")
        if self._engine_down(stderr):
            raise RuntimeUnavailableError(
                f"runtime {self.name!r}: the engine is not answering: {stderr.strip()}\n"
                f"fix: {self.start_engine_fix()}"
            )
        return False

    def import_rootfs(self, tarball: Path, tag: str) -> str:
        self._run("import", str(tarball), tag, timeout_s=600)
        return self.image_id(tag)

    def remove_image(self, tag: str) -> None:
        self._run("image", "rm", "-f", tag, check=False)

    def copy_from_image(self, image: str, paths: list[str]) -> dict[str, bytes | None]:
        """Each path's content in ``image`` as a tar archive (``cp … -``), None where the image
        has no such path. A container is created for it (never started) and removed."""
        name = f"karotte-copy-{uuid.uuid4().hex[:12]}"
        self._run("create", "--name", name, "--network=none", "--", image, "true")
        try:
            found: dict[str, bytes | None] = {}
            for path in paths:
                proc = self._run("cp", f"{name}:{path}", "-", check=False, timeout_s=600)
                found[path] = proc.stdout if proc.returncode == 0 else None
            return found
        finally:
            self._run("rm", "-f", name, check=False)

    # ---- sandboxes ---------------------------------------------------------------------------
    def run_command(self, spec: SandboxSpec) -> tuple[list[str], dict[str, str]]:
        """The ``run -d`` argv and the environment to pass it (env values never go in argv)."""
        args: list[str] = ["run", "-d", "--name", spec.name, *self.run_args]
        args += ["--cap-drop=ALL", "--security-opt=no-new-privileges"]
        for cap in spec.cap_add:
            args.append(f"--cap-add={cap}")
        for device in spec.devices:
            args.append(f"--device={device}")
        args.append(f"--network={spec.network}")
        if spec.init:
            args.append("--init")
        for key, value in sorted(spec.labels.items()):
            args += ["--label", f"{key}={value}"]
        secret_env: dict[str, str] = {}
        for key, value in sorted(spec.env.items()):
            args += ["--env", key]  # value comes from the CLI's environment: not visible in ps
            secret_env[key] = value
        for mount in spec.mounts:
            args += ["--mount", _mount_arg(mount.source, mount.target, mount.read_only)]
        if spec.memory_bytes is not None:
            args += [f"--memory={spec.memory_bytes}", f"--memory-swap={spec.memory_bytes}"]
        if spec.cpus is not None:
            args.append(f"--cpus={spec.cpus:g}")
        if spec.pids_limit is not None:
            args.append(f"--pids-limit={spec.pids_limit}")
        for path, size in sorted(spec.tmpfs.items()):
            args += ["--tmpfs", f"{path}:rw,nosuid,nodev,size={size},mode=1777"]
        if spec.cgroup_parent:
            args.append(f"--cgroup-parent={spec.cgroup_parent}")
        if spec.workdir:
            args += ["--workdir", spec.workdir]
        args += spec.extra_args
        args += ["--", spec.image, *spec.command]
        return self.command(*args), secret_env

    def start(self, spec: SandboxSpec) -> Sandbox:
        argv, secret_env = self.run_command(spec)
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                timeout=self.cli_timeout_s,
                env=self.cli_env(secret_env),
                check=False,
            )
        except FileNotFoundError as exc:
            raise RuntimeUnavailableError(self._missing_binary_message()) from exc
        if proc.returncode != 0:
            stderr = proc.stderr.decode(errors="replace").strip()
            # a half-created container must not leak
            self._run("rm", "-f", spec.name, check=False)
            if self._engine_down(stderr):
                raise RuntimeUnavailableError(
                    f"runtime {self.name!r}: the engine is not answering: {stderr}\n"
                    f"fix: {self.start_engine_fix()}"
                )
            raise RuntimeUnavailableError(
                f"runtime {self.name!r}: starting sandbox {spec.name} failed: {stderr}"
            )
        sandbox_id = proc.stdout.decode().strip().splitlines()[-1]
        return Sandbox(id=sandbox_id, name=spec.name, runtime=self.name, labels=dict(spec.labels))

    def exec(
        self,
        sandbox: Sandbox,
        argv: list[str],
        user: str | None = None,
        timeout_s: float | None = None,
    ) -> ExecResult:
        args = ["exec"]
        if user is not None:
            args += ["--user", user]
        args += [sandbox.id, *argv]
        try:
            proc = subprocess.run(
                self.command(*args),
                capture_output=True,
                timeout=timeout_s,
                env=self.cli_env(),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(f"exec in {sandbox.name} timed out after {timeout_s} s") from exc
        return ExecResult(returncode=proc.returncode, stdout=proc.stdout, stderr=proc.stderr)

    def stream_output(
        self, sandbox: Sandbox, on_stderr: OutputCallback | None = None
    ) -> Iterator[bytes]:
        proc = subprocess.Popen(
            self.command("logs", "--follow", sandbox.id),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.cli_env(),
        )
        assert proc.stdout is not None and proc.stderr is not None
        err_stream = proc.stderr

        def pump_stderr() -> None:
            for raw in err_stream:
                if on_stderr is not None:
                    with contextlib.suppress(Exception):
                        on_stderr(raw.decode(errors="replace").rstrip("\n"))

        pump = threading.Thread(target=pump_stderr, daemon=True)
        pump.start()
        try:
            yield from proc.stdout
        finally:
            if proc.poll() is None:
                proc.terminate()
            proc.wait()
            pump.join(timeout=5)
            proc.stdout.close()
            err_stream.close()

    def wait(self, sandbox: Sandbox, timeout_s: float | None = None) -> int:
        try:
            proc = self._run("wait", sandbox.id, timeout_s=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(f"sandbox {sandbox.name} still running after {timeout_s} s") from exc
        out = proc.stdout.decode().strip().splitlines()
        return int(out[-1]) if out else -1

    def stop(self, sandbox: Sandbox, timeout_s: float = 10) -> None:
        proc = self._run(
            "stop", "-t", str(int(timeout_s)), sandbox.id, timeout_s=timeout_s + 60, check=False
        )
        if proc.returncode != 0 and not self._no_such(proc.stderr):
            stderr = proc.stderr.decode(errors="replace").strip()
            if self._engine_down(stderr):
                raise RuntimeUnavailableError(
                    f"runtime {self.name!r}: the engine is not answering: {stderr}\n"
                    f"fix: {self.start_engine_fix()}"
                )
            raise RuntimeUnavailableError(f"stopping {sandbox.name} failed: {stderr}")

    def remove(self, sandbox: Sandbox) -> None:
        self.remove_ids([sandbox.id])

    def remove_ids(self, ids: list[str]) -> None:
        """Force-remove sandboxes (running or not); ids that no longer exist are fine."""
        if not ids:
            return
        proc = self._run("rm", "-f", *ids, timeout_s=120, check=False)
        if proc.returncode != 0:
            stderr = proc.stderr.decode(errors="replace").strip()
            lines = [ln for ln in stderr.splitlines() if ln.strip()]
            if lines and all(self._no_such(ln.encode()) for ln in lines):
                return
            if self._engine_down(stderr):
                raise RuntimeUnavailableError(
                    f"runtime {self.name!r}: the engine is not answering: {stderr}\n"
                    f"fix: {self.start_engine_fix()}"
                )
            raise RuntimeUnavailableError(f"removing sandboxes failed: {stderr}")

    def list_sandboxes(self, labels: dict[str, str]) -> list[Sandbox]:
        args = ["ps", "-a", "--no-trunc", "--format", "{{.ID}}"]
        for key, value in sorted(labels.items()):
            args += ["--filter", f"label={key}={value}" if value else f"label={key}"]
        ids = self._run(*args).stdout.decode().split()
        if not ids:
            return []
        proc = self._run(
            "inspect", "--format", "{{.Id}}\t{{.Name}}\t{{json .Config.Labels}}", *ids, check=False
        )
        found: list[Sandbox] = []
        for line in proc.stdout.decode().splitlines():
            parts = line.split("\t", 2)
            if len(parts) != 3:
                continue
            sandbox_labels = json.loads(parts[2]) or {}
            if not all(
                sandbox_labels.get(key) == value if value else key in sandbox_labels
                for key, value in labels.items()
            ):
                continue
            found.append(
                Sandbox(
                    id=parts[0],
                    name=parts[1].lstrip("/"),
                    runtime=self.name,
                    labels=sandbox_labels,
                )
            )
        return found

    def is_running(self, sandbox: Sandbox) -> bool:
        proc = self._run("inspect", "--format", "{{.State.Running}}", sandbox.id, check=False)
        return proc.returncode == 0 and proc.stdout.decode().strip() == "true"

    def exec_prefix(self, sandbox: Sandbox, user: str | None = None) -> list[str]:
        """The argv to exec into ``sandbox`` interactively (printed by ``--prepare-only``)."""
        args = ["exec", "-it"]
        if user:
            args += ["--user", user]
        return [*self.command(*args), sandbox.name]


def _mount_arg(source: Path, target: str, read_only: bool) -> str:
    for value in (str(source), target):
        if "," in value or "=" in value:
            raise RuntimeUnavailableError(
                f"mount path {value!r} contains ',' or '=', which the engine CLI cannot take"
            )
    arg = f"type=bind,source={source},target={target}"
    return arg + ",readonly" if read_only else arg


def _build_failure_message(runtime: str, tag: str, lines: list[str]) -> str:
    """The failing step and its output (not the whole log)."""
    start = 0
    for index, line in enumerate(lines):
        stripped = line.lstrip()
        if stripped.startswith(("Step ", "STEP ")):
            start = index
    tail = lines[start:] if len(lines) - start <= 80 else lines[-80:]
    return f"building {tag} with {runtime} failed:\n" + "\n".join(tail)
