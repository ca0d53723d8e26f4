"""The host launcher: ``karotte run`` in a real sandbox.

For each run it writes the run config into the output dir, starts a sandbox (see CONTRACTS.md:
command, ``/out``, env, labels, capabilities, limits, the writable student cgroup), streams the
harness's JSON-lines events to the terminal, waits, removes the sandbox and makes sure a
transcript exists (written here, with an ``infra`` error, when the sandbox died without one).
Ctrl-C/SIGTERM remove exactly this invocation's sandboxes; orphans of killed launchers are
reaped before the run starts (:mod:`karotte.host.reaper`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import re
import shutil
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from karotte import plugins
from karotte.config import EvaluationRunConfig
from karotte.errors import ConfigError, ErrorKind, KarotteError
from karotte.events import (
    ErrorOccurred,
    Event,
    MessageAdded,
    TaskCompleted,
    TokenUsage,
    Transcript,
    parse_event,
)
from karotte.host import reaper
from karotte.host.runtimes import cgroup_delegation, disk_delegation
from karotte.host.runtimes.base import (
    LABEL_LAUNCHER_HOST,
    LABEL_LAUNCHER_PID,
    Mount,
    Runtime,
    Sandbox,
    SandboxSpec,
    get_runtime,
)
from karotte.host.runtimes.cgroup_delegation import SANDBOX_CGROUP_ROOT, CgroupDelegation
from karotte.host.runtimes.oci_cli import OciCliRuntime
from karotte.io import write_text_atomic

log = logging.getLogger(__name__)

GIB = 1024**3
MIB = 1024**2
DEFAULT_MEMORY_BYTES = 4 * GIB
DEFAULT_PIDS_LIMIT = 4096
DEFAULT_DISK_BYTES = 4 * GIB
SHM_BYTES = 64 * MIB
SANDBOX_OUT = "/out"
SANDBOX_KAROTTE = "/root/.venv/bin/karotte"
SANDBOX_PYTHON = "/root/.venv/bin/python"
PROXY_LISTEN_PORT = 18080
STDERR_TAIL_LINES = 60

# What the root harness needs inside the sandbox, until the confinement helper's
# karotte.sandbox.confinement.requirements defines it (that list wins when present).
_FALLBACK_CAPABILITIES = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "NET_ADMIN",
    "SYS_RESOURCE",
]


def harness_capabilities() -> tuple[list[str], list[str]]:
    """``(capabilities, devices)`` the harness needs; from the confinement requirements."""
    try:
        requirements = importlib.import_module("karotte.sandbox.confinement.requirements")
    except ImportError:
        return list(_FALLBACK_CAPABILITIES), []
    caps = list(getattr(requirements, "HARNESS_CAPABILITIES", _FALLBACK_CAPABILITIES))
    devices = list(getattr(requirements, "HARNESS_DEVICES", []))
    return [c.upper().removeprefix("CAP_") for c in caps], devices


class LaunchOptions(BaseModel):
    """Everything ``karotte run`` (sandboxed) was asked to do, besides the run config."""

    model_config = ConfigDict(extra="forbid")

    runtime: str
    runtime_why: str = ""
    env_dir: Path = Path(".")
    out_dir: Path | None = None
    image: str | None = None  # skip the build and use this image
    parallel: int = Field(default=1, ge=1, le=256)
    dev: bool = False
    mounts: list[Mount] = Field(default_factory=list)
    keep_containers: bool = False
    prepare_only: bool = False
    proxy: str | None = None
    ui: bool = True
    memory_bytes: int | None = None
    cpus: float | None = None
    pids_limit: int | None = None
    disk_bytes: int | None = None
    # the launcher stops a sandbox this long after the run's own time limits have passed
    backstop_grace_s: float = Field(default=120.0, gt=0)


def parse_mount(text: str) -> Mount:
    """``src:dst[:ro]`` (``rw`` is accepted too)."""
    parts = text.split(":")
    read_only = False
    if len(parts) == 3 and parts[2] in ("ro", "rw"):
        read_only = parts[2] == "ro"
        parts = parts[:2]
    if len(parts) != 2 or not parts[0] or not parts[1].startswith("/"):
        raise ConfigError(f"--mount {text!r}: expected SRC:/absolute/DST[:ro]")
    source = Path(parts[0]).expanduser().resolve()
    if not source.exists():
        raise ConfigError(f"--mount {text!r}: {source} does not exist")
    return Mount(source=source, target=parts[1], read_only=read_only)


# ---- one run -----------------------------------------------------------------------------------
class RunSlot:
    """One sandboxed run of the invocation: its config, sandbox and what streamed back."""

    def __init__(self, config: EvaluationRunConfig, name: str, out_dir: Path, index: int | None):
        self.config = config  # as the harness sees it (paths under /out)
        self.name = name
        self.index = index
        self.out_dir = out_dir
        self.sandbox_name = f"karotte-{config.run_id}"
        self.sandbox: Sandbox | None = None
        self.delegation: CgroupDelegation | None = None
        self.disk: disk_delegation.DiskDelegation | None = None
        self.events: list[Event] = []
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.exit_code: int | None = None
        self.state = "pending"
        self.detail = ""
        self.failure: str | None = None  # why the sandbox side failed, if it did
        self.timed_out: float | None = None  # the launcher's backstop stopped it after (s)
        self.started_at = time.time()
        self.finished = threading.Event()

    @property
    def run_id(self) -> str:
        return self.config.run_id

    @property
    def label(self) -> str:
        return self.run_id

    @property
    def host_transcript(self) -> Path:
        return self.out_dir / f"{self.name}.json"

    @property
    def host_run_config(self) -> Path:
        return self.out_dir / f"{self.name}.run_config.json"

    @property
    def host_event_stream(self) -> Path:
        """The run's events as they arrive (JSON lines), for the live dashboard; removed once
        the complete transcript is written."""
        return self.out_dir / f"{self.name}.events.jsonl"

    def completed(self) -> TaskCompleted | None:
        for event in reversed(self.events):
            if isinstance(event, TaskCompleted):
                return event
        return None


class LaunchResult(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    transcripts: list[Path]
    statuses: list[str]
    exit_code: int
    interrupted: bool = False


# ---- the terminal ------------------------------------------------------------------------------
class Display(Protocol):
    """How streamed events and logs reach the terminal (single run, parallel, or plain)."""

    def event(self, slot: RunSlot, event: Event) -> None: ...
    def log(self, slot: RunSlot, line: str) -> None: ...
    def message(self, text: str) -> None: ...
    def update(self, slot: RunSlot) -> None: ...
    def active(self, slots: list[RunSlot]) -> contextlib.AbstractContextManager[None]: ...


def make_display(slots: int, ui: bool) -> Display:
    from karotte.host.parallel import LiveDisplay, PlainDisplay

    if ui and slots > 1:
        return LiveDisplay()
    return PlainDisplay(prefix_runs=slots > 1, colour=ui)


# ---- the launcher ------------------------------------------------------------------------------
class Launcher:
    def __init__(
        self,
        config: EvaluationRunConfig,
        options: LaunchOptions,
        display: Display | None = None,
        build: Callable[[Runtime], str] | None = None,
    ) -> None:
        self.base_config = config
        self.options = options
        self.display = display or make_display(options.parallel, options.ui)
        self.runtime = get_runtime(options.runtime)
        self._build = build
        self.slots: list[RunSlot] = []
        self._cleaned = False
        self._proxy_relays: list[Any] = []
        self._backend_relay: Any = None  # karotte.backend.relay.HostBackendRelay, with backend_uri
        self._caps: tuple[list[str], list[str]] | None = None
        self.passthrough_devices: list[str] = []  # from hardware_limits plugins
        self._plugin_run_args: list[str] | None = None

    # -- preparation --
    def check_runtime(self) -> None:
        if self.runtime.name == "local":
            raise ConfigError("the launcher runs sandboxes; --runtime local is run in-process")
        self.runtime.ensure_available()
        why = f" ({self.options.runtime_why})" if self.options.runtime_why else ""
        self.display.message(f"runtime: {self.runtime.name}{why}")

    def reap_orphans(self) -> None:
        report = reaper.reap(self.runtime)
        if report.removed:
            self.display.message(
                f"removed {len(report.removed)} orphaned sandbox(es) of dead launchers: "
                + ", ".join(report.removed)
            )
        for error in report.errors:
            self.display.message(f"[warning] {error}")
        for run_name, problems in reaper.reap_stale_disks().items():
            self.display.message(f"removed the disk quota of dead run {run_name}")
            for problem in problems:
                self.display.message(f"[warning] {problem}")

    def image(self) -> str:
        if self.options.image:
            if not self.runtime.image_exists(self.options.image):
                raise ConfigError(
                    f"image {self.options.image!r} does not exist in {self.runtime.name}; "
                    "run `karotte build` first"
                )
            return self.options.image
        if self._build is not None:
            return self._build(self.runtime)
        return build_image(self.runtime, self.options.env_dir, self.options.dev, self.display)

    def hardware(self) -> tuple[int, float | None, int, int]:
        """(memory bytes, cpus, pids limit, disk bytes per run)."""
        memory, cpus, pids, disk = self.options.memory_bytes, self.options.cpus, None, None
        pids = self.options.pids_limit
        disk = self.options.disk_bytes
        hw, problem = task_hardware(self.base_config)
        if problem is not None:
            self.display.message(
                f"[warning] the task's required_hardware could not be read here ({problem}); "
                "the sandbox gets the default limits. Run karotte from the environment's own "
                "venv (`uv run karotte run ...` in the environment) so its tasks import."
            )
        if hw is None:
            hw = plugins.default_hardware()
        if hw is not None:
            if memory is None and hw.memory_gib:
                memory = int(hw.memory_gib * GIB)
            if cpus is None and hw.cpus:
                cpus = hw.cpus
            if pids is None and hw.max_processes:
                pids = hw.max_processes
            if disk is None and hw.disk_gib:
                disk = int(hw.disk_gib * GIB)
        memory = memory or DEFAULT_MEMORY_BYTES
        pids = pids or DEFAULT_PIDS_LIMIT
        disk = disk or DEFAULT_DISK_BYTES
        caps = plugins.hardware_limits(hw)
        if caps.memory_gib is not None:
            memory = min(memory, int(caps.memory_gib * GIB))
        if caps.disk_gib is not None:
            disk = min(disk, int(caps.disk_gib * GIB))
        if caps.cpus is not None:
            cpus = min(cpus, caps.cpus) if cpus is not None else caps.cpus
        self.passthrough_devices = caps.passthrough
        # the disk budget is split between parallel runs: N runs never take more than half of
        # what is free where their output and tmpfs data land
        free = shutil.disk_usage(self.out_dir if self.out_dir.exists() else Path(".")).free
        share = max(64 * MIB, free // 2 // self.options.parallel)
        return memory, cpus, pids, min(disk, share)

    @property
    def out_dir(self) -> Path:
        if self.options.out_dir is not None:
            return self.options.out_dir.resolve()
        return self.base_config.transcript_file.parent.resolve()

    def make_slots(self) -> list[RunSlot]:
        base = self.base_config
        stem = base.transcript_file.stem
        n = self.options.parallel
        out_dir = self.out_dir
        slots = []
        for i in range(1, n + 1) if n > 1 else [None]:
            run_id = f"{base.run_id}-{i}" if i is not None else base.run_id
            name = f"{stem}_{i}" if i is not None else stem
            data = base.model_dump()
            data.update(
                run_id=run_id,
                student_user="student",
                transcript_file=Path(SANDBOX_OUT) / f"{name}.json",
            )
            if self.options.proxy:
                data.update(proxy_url=self.options.proxy)
                data.update(model_api_base=self._sandbox_model_base(base.model))
            config = EvaluationRunConfig.model_validate(data)
            slots.append(RunSlot(config, name, out_dir, i))
        return slots

    # -- proxy --
    def _sandbox_proxy_url(self) -> str:
        return f"http://127.0.0.1:{PROXY_LISTEN_PORT}"

    def _sandbox_model_base(self, model: str) -> str:
        # Claude (anthropic/*) calls go to URL/v1/messages (litellm appends /v1/messages to the
        # base); every other provider speaks the OpenAI API under URL/v1.
        url = self._sandbox_proxy_url()
        return url if model.startswith("anthropic/") else f"{url}/v1"

    def proxy_env(self) -> dict[str, str]:
        if not self.options.proxy:
            return {}
        url = self._sandbox_proxy_url()
        return {
            "ANTHROPIC_BASE_URL": url,
            "OPENAI_BASE_URL": f"{url}/v1",
            "OPENAI_API_BASE": f"{url}/v1",
            "KAROTTE_PROXY_LISTEN": f"127.0.0.1:{PROXY_LISTEN_PORT}",
            "KAROTTE_PROXY_SOCKET": "/run/karotte/proxy/proxy.sock",
        }

    # -- sandboxes --
    def sandbox_env(self, memory: int, pids: int, disk: int) -> dict[str, str]:
        env = {
            "KAROTTE_SANDBOX": self.runtime.sandbox_kind,
            "KAROTTE_MEMORY_BYTES": str(memory),
            "KAROTTE_PIDS_LIMIT": str(pids),
            "KAROTTE_DISK_BYTES": str(disk),
            "PYTHONUNBUFFERED": "1",
        }
        env.update(model_credentials_env(self.base_config))
        env.update(self.proxy_env())
        return env

    def spec_for(
        self,
        slot: RunSlot,
        image: str,
        hardware: tuple[int, float | None, int, int],
        env_mounts: list[Mount],
    ) -> SandboxSpec:
        memory, cpus, pids, disk = hardware
        caps, devices = self.capabilities()
        env = self.sandbox_env(memory, pids, disk)
        labels = reaper.launcher_labels(slot.run_id)
        if self.options.keep_containers or self.options.prepare_only:
            labels[reaper.LABEL_KEEP] = "true" if self.options.keep_containers else "false"
        mounts = [Mount(source=self.out_dir, target=SANDBOX_OUT), *env_mounts]
        mounts += self.options.mounts
        cgroup_parent = None
        if slot.delegation is not None:
            env["KAROTTE_CGROUP_ROOT"] = SANDBOX_CGROUP_ROOT
            labels[reaper.LABEL_CGROUP] = slot.sandbox_name
            mounts += slot.delegation.mounts
            cgroup_parent = slot.delegation.cgroup_parent
        if slot.disk is not None:
            mounts += slot.disk.mounts()
            env.update(slot.disk.env())
        if self._backend_relay is not None:
            from karotte.backend.relay import SANDBOX_DIR

            mounts.append(Mount(source=self._backend_relay.socket_dir, target=SANDBOX_DIR))
            env.update(self._backend_relay.env())
        if self.options.proxy:
            relay_dir = self._proxy_relays[0].socket_dir
            mounts.append(Mount(source=relay_dir, target="/run/karotte/proxy"))
        if self.options.prepare_only:
            command = ["sleep", "infinity"]
        else:
            command = [
                SANDBOX_KAROTTE,
                "run",
                "--no-containerized",
                "--config",
                f"{SANDBOX_OUT}/{slot.host_run_config.name}",
                "--events",
                "jsonl",
            ]
        tmp_bytes = max(16 * MIB, min(disk, memory // 2))
        return SandboxSpec(
            image=image,
            name=slot.sandbox_name,
            command=command,
            labels=labels,
            env=env,
            mounts=mounts,
            memory_bytes=memory,
            cpus=cpus,
            pids_limit=engine_pids_limit(pids, self.runtime.sandbox_kind),
            disk_bytes=disk,
            cap_add=caps,
            devices=[*devices, *self.passthrough_devices],
            extra_args=self.plugin_run_args(),
            network="none",
            init=True,
            tmpfs={"/tmp": tmp_bytes, "/dev/shm": min(SHM_BYTES, tmp_bytes)},
            cgroup_parent=cgroup_parent,
        )

    def plugin_run_args(self) -> list[str]:
        """Engine arguments from ``karotte.container_run_args`` plugins (asked once; a plugin
        that raises refuses the launch)."""
        if self._plugin_run_args is None:
            task, _problem = load_task(self.base_config)
            self._plugin_run_args = plugins.container_run_args(
                task if task is not None else self.base_config.task_id, self.runtime.name
            )
        return self._plugin_run_args

    def capabilities(self) -> tuple[list[str], list[str]]:
        """What the harness needs, minus what this host cannot grant (said once, loudly)."""
        if self._caps is None:
            caps, devices = harness_capabilities()
            if isinstance(self.runtime, OciCliRuntime):
                caps, missing = self.runtime.grantable_capabilities(caps)
                if missing:
                    self.display.message(
                        f"[warning] this host's root lacks {', '.join(missing)}: the sandbox "
                        "runs without it (the harness records what it could not enforce)"
                    )
            self._caps = (caps, devices)
        return self._caps

    def _delegate_cgroup(self, slot: RunSlot, memory: int, pids: int) -> None:
        if not getattr(self.runtime, "supports_writable_cgroup", False):
            slot.detail = f"no writable cgroup: {self.runtime.name} cannot use host cgroups"
            return
        delegation, why = cgroup_delegation.delegate(slot.sandbox_name, memory, pids)
        slot.delegation = delegation
        if delegation is None:
            self.display.message(f"{slot.label}: no writable student cgroup: {why}")

    def _delegate_disk(self, slot: RunSlot, image: str, disk: int) -> None:
        if not (isinstance(self.runtime, OciCliRuntime) and self.runtime.host_disk_quota):
            return
        owner = reaper.launcher_labels(slot.run_id)
        delegation, why = disk_delegation.delegate(
            self.runtime,
            image,
            slot.sandbox_name,
            owner,
            disk,
            user=slot.config.student_user or "student",
        )
        slot.disk = delegation
        if delegation is None:
            self.display.message(
                f"[warning] {slot.label}: no disk quota for the student under "
                f"{self.runtime.name}: {why}"
            )

    def start_all(self, image: str) -> None:
        hardware = self.hardware()
        memory, _cpus, pids, disk = hardware
        env_mounts = self.dev_mounts(image) if self.options.dev else []
        for slot in self.slots:
            self._delegate_cgroup(slot, memory, pids)
            self._delegate_disk(slot, image, disk)
            spec = self.spec_for(slot, image, hardware, env_mounts)
            slot.state = "starting"
            self.display.update(slot)
            slot.sandbox = self.runtime.start(spec)
            slot.state = "running"
            self.display.update(slot)

    def dev_mounts(self, image: str) -> list[Mount]:
        source = (self.options.env_dir / "src" / "environment").resolve()
        if not source.is_dir():
            raise ConfigError(f"--dev mounts {source} over the image's copy, but it does not exist")
        target = installed_environment_path(self.runtime, image)
        return [Mount(source=source, target=target, read_only=True)]

    def _start_backend_relay(self) -> None:
        """With ``backend_uri``, the sandbox (``--network=none``) reaches the backend through a
        unix-socket relay in a root-only dir, with a synced copy of the token file
        (docs/backend.md); each run config then names the copy inside the sandbox."""
        if not self.base_config.backend_uri:
            return
        from karotte.backend.relay import HostBackendRelay

        self._backend_relay = HostBackendRelay(
            self.base_config.backend_uri, self.base_config.backend_token_file
        )
        token_inside = self._backend_relay.sandbox_token_file()
        for slot in self.slots:
            slot.config = slot.config.model_copy(update={"backend_token_file": token_inside})

    def write_configs(self) -> None:
        # the student must not read run configs (keys) or other runs' transcripts through /out:
        # a dir we make is 0700; an existing one open to others gets a warning, not a chmod
        if not self.out_dir.exists():
            self.out_dir.mkdir(parents=True)
            self.out_dir.chmod(0o700)
        elif self.out_dir.stat().st_mode & 0o007:
            self.display.message(
                f"[warning] {self.out_dir} is readable by other users, so the student (uid "
                f"1000) can read other runs' transcripts through /out: `chmod 700 {self.out_dir}`"
            )
        for slot in self.slots:
            write_text_atomic(
                slot.host_run_config, slot.config.model_dump_json(indent=2) + "\n", mode=0o600
            )

    # -- following runs --
    def follow(self, slot: RunSlot) -> None:
        assert slot.sandbox is not None
        try:
            for raw in self.runtime.stream_output(
                slot.sandbox, on_stderr=lambda line: self._on_stderr(slot, line)
            ):
                self._on_stdout(slot, raw)
            slot.exit_code = self.runtime.wait(slot.sandbox)
        except Exception as exc:  # the display thread must never die silently
            slot.failure = f"following the sandbox failed: {type(exc).__name__}: {exc}"
        finally:
            completed = slot.completed()
            slot.state = completed.status if completed else "error"
            slot.finished.set()
            self.display.update(slot)

    def _on_stdout(self, slot: RunSlot, raw: bytes) -> None:
        line = raw.decode(errors="replace").rstrip("\n")
        if not line.strip():
            return
        try:
            event = parse_event(line)
        except ValidationError:
            self.display.log(slot, line)
            return
        slot.events.append(event)
        self._append_event_line(slot, line)
        slot.detail = event.type
        self.display.event(slot, event)
        self.display.update(slot)

    def _append_event_line(self, slot: RunSlot, line: str) -> None:
        """Append to the live event stream (root-only); a full disk costs the live view, never
        the run."""
        try:
            fd = os.open(
                slot.host_event_stream,
                os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                0o600,
            )
            with os.fdopen(fd, "a", encoding="utf-8") as stream:
                stream.write(line + "\n")
        except OSError as exc:
            log.debug("event stream %s: %s", slot.host_event_stream, exc)

    def _on_stderr(self, slot: RunSlot, line: str) -> None:
        slot.stderr_tail.append(line)
        self.display.log(slot, line)

    def wait_all(self) -> None:
        threads = [
            threading.Thread(target=self.follow, args=(slot,), daemon=True, name=slot.label)
            for slot in self.slots
        ]
        for thread in threads:
            thread.start()
        # the harness enforces task_time_limit_s itself; this is the backstop for a harness
        # that hangs or dies silently: no run may hang the launcher
        config = self.base_config
        limit = config.task_time_limit_s + config.judge_timeout_s + self.options.backstop_grace_s
        deadline = time.monotonic() + limit
        for slot in self.slots:
            while not slot.finished.wait(0.2):
                if time.monotonic() > deadline and slot.timed_out is None:
                    slot.timed_out = limit
                    if slot.sandbox is not None:
                        with contextlib.suppress(KarotteError):
                            self.runtime.stop(slot.sandbox, timeout_s=5)

    def hold_open(self) -> None:
        """--prepare-only: print how to get in, then keep the sandboxes until Ctrl-C."""
        for slot in self.slots:
            assert slot.sandbox is not None
            harness = (
                f"{SANDBOX_KAROTTE} run --no-containerized "
                f"--config {SANDBOX_OUT}/{slot.host_run_config.name}"
            )
            if isinstance(self.runtime, OciCliRuntime):
                exec_cmd = " ".join(self.runtime.exec_prefix(slot.sandbox))
                self.display.message(
                    f"sandbox {slot.sandbox.name} is ready. Get a shell: {exec_cmd} bash\n"
                    f"  run the harness in it: {harness}"
                )
            else:  # a VM: commands go in one at a time (Runtime.exec), there is no terminal
                self.display.message(
                    f"sandbox {slot.sandbox.name} is ready ({self.runtime.name}: no interactive "
                    "shell into a VM; run commands in it with the runtime's exec, e.g. "
                    f"get_runtime({self.runtime.name!r}).exec(sandbox, argv))\n"
                    f"  the harness's command in it: {harness}"
                )
        if self.options.keep_containers:
            self.display.message("--keep-containers: leaving them running; `karotte clean --kept`")
            return
        self.display.message("holding the sandbox(es) open; Ctrl-C removes them")
        while True:
            time.sleep(3600)

    # -- the end --
    def cleanup(self) -> None:
        """Remove this invocation's sandboxes and cgroup dirs (idempotent; Ctrl-C is ignored
        while it runs so a second Ctrl-C cannot leave a leak)."""
        if self._cleaned:
            return
        self._cleaned = True
        with _signals_deferred():
            if not self.options.keep_containers:
                self._remove_own_sandboxes()
            for relay in self._proxy_relays:
                relay.close()
            if self._backend_relay is not None:
                self._backend_relay.close()
            for slot in self.slots:
                if slot.delegation is not None and not self.options.keep_containers:
                    dirs = cgroup_delegation.run_dirs_everywhere(slot.sandbox_name)
                    left = cgroup_delegation.remove_dirs(dirs)
                    for path in left:
                        self.display.message(f"[warning] could not remove cgroup dir {path}")
                if slot.disk is not None and not self.options.keep_containers:
                    for problem in disk_delegation.release(slot.disk):
                        self.display.message(f"[warning] {problem}")

    def _remove_own_sandboxes(self) -> None:
        mine = {
            LABEL_LAUNCHER_PID: str(os.getpid()),
            LABEL_LAUNCHER_HOST: reaper.this_host(),
        }
        known = [s.sandbox for s in self.slots if s.sandbox is not None]
        try:
            # also catches a sandbox whose start was interrupted before we learned its id
            found = self.runtime.list_sandboxes(mine)
        except KarotteError as exc:
            self.display.message(f"[warning] listing sandboxes failed: {exc}")
            found = []
        ids = {s.id: s for s in known} | {s.id: s for s in found}
        errors = reaper.remove_sandboxes(self.runtime, list(ids.values()))
        for error in errors:
            self.display.message(f"[warning] {error}")

    def finish_transcripts(self, interrupted: bool) -> None:
        """Make sure each run has a transcript: the harness's, or one written here."""
        for slot in self.slots:
            if slot.sandbox is None and not interrupted and slot.failure is None:
                continue
            existing = read_transcript(slot.host_transcript, slot.run_id)
            if existing is not None and existing.completed() is not None:
                continue
            kind = ErrorKind.INFRA
            if interrupted:
                why = "interrupted (Ctrl-C/SIGTERM) before the run finished"
            elif slot.timed_out is not None:
                kind = ErrorKind.TIMEOUT
                why = f"the launcher stopped the sandbox: no result after {slot.timed_out:.0f} s"
            elif slot.failure:
                why = slot.failure
            else:
                why = f"the sandbox exited with code {slot.exit_code} without writing a transcript"
            tail = "\n".join(slot.stderr_tail)
            message = f"{why}\nlast sandbox stderr:\n{tail}" if tail else why
            write_infra_transcript(slot, message, kind)
            slot.state = "error"
        for slot in self.slots:
            done = read_transcript(slot.host_transcript, slot.run_id)
            if done is not None and done.completed() is not None:
                slot.host_event_stream.unlink(missing_ok=True)

    def run(self) -> LaunchResult:
        self.check_runtime()
        self.reap_orphans()
        image = self.image()
        self.slots = self.make_slots()
        interrupted = False
        try:
            self._start_backend_relay()
            self.write_configs()
            if self.options.proxy:
                from karotte.host.runtimes.proxy_relay import HostProxyRelay

                self._proxy_relays.append(HostProxyRelay(self.options.proxy))
            with self.display.active(self.slots):
                self.start_all(image)
                if self.options.prepare_only:
                    self.hold_open()
                else:
                    self.wait_all()
        except KeyboardInterrupt:
            interrupted = True
            raise
        except Exception as exc:
            for slot in self.slots:
                if slot.failure is None and not slot.finished.is_set():
                    slot.failure = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.cleanup()
            if not self.options.prepare_only:
                self.finish_transcripts(interrupted)
        statuses = [_final_status(slot) for slot in self.slots]
        for slot in self.slots:
            self.display.message(f"transcript: {slot.host_transcript}")
        code = 0 if all(s in ("passed", "failed") for s in statuses) else 1
        if self.options.prepare_only:
            code = 0
        return LaunchResult(
            transcripts=[s.host_transcript for s in self.slots], statuses=statuses, exit_code=code
        )


def _final_status(slot: RunSlot) -> str:
    transcript = read_transcript(slot.host_transcript, slot.run_id)
    if transcript is not None and transcript.status is not None:
        return transcript.status
    completed = slot.completed()
    return completed.status if completed else "error"


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# ---- helpers -----------------------------------------------------------------------------------
_ENV_REF = re.compile(r"^\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?$")
_PROVIDER_KEYS = (
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "GEMINI_API_KEY",
    "MISTRAL_API_KEY",
    "OPENROUTER_API_KEY",
    "TOGETHERAI_API_KEY",
    "DEEPSEEK_API_KEY",
    "XAI_API_KEY",
)


def model_credentials_env(config: EvaluationRunConfig) -> dict[str, str]:
    """Variables the harness needs to reach the model: a ``$VAR`` key reference and the
    providers' standard key variables, taken from this environment (never written to disk)."""
    if config.use_fake_model:
        return {}
    env: dict[str, str] = {}
    if config.model_api_key and (match := _ENV_REF.match(config.model_api_key)):
        name = match.group(1)
        if name not in os.environ:
            raise ConfigError(f"model_api_key refers to ${name}, which is not set here")
        env[name] = os.environ[name]
    for name in _PROVIDER_KEYS:
        if name in os.environ:
            env.setdefault(name, os.environ[name])
    return env


# gVisor (ptrace platform) spends several host tasks per sandboxed process (~8.4 measured, more
# while a fork bomb churns), all counted in the container's host pids cgroup; if that runs out,
# runsc dies and the run is lost. The sandbox's own budget (KAROTTE_PIDS_LIMIT, enforced inside
# on the student) stays as asked; the host cgroup gets room for the sentry's overhead.
GVISOR_HOST_PIDS_FACTOR = 16


def engine_pids_limit(pids: int, sandbox_kind: str) -> int:
    """The pids limit given to the engine for a sandbox whose processes may number ``pids``."""
    return pids * GVISOR_HOST_PIDS_FACTOR if sandbox_kind == "gvisor" else pids


def load_task(config: EvaluationRunConfig) -> tuple[Any, str | None]:
    """The task instance (None when it can't be imported here) and, then, why."""
    try:
        from karotte.discovery import find_task

        return find_task(config.task_id)(config), None
    except Exception as exc:
        log.debug("the task does not load on the host: %s", exc)
        return None, str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def task_hardware(config: EvaluationRunConfig) -> tuple[Any, str | None]:
    """The task's ``required_hardware`` and, when it can't be read here, why."""
    task, problem = load_task(config)
    if task is None:
        return None, problem
    try:
        return task.required_hardware, None
    except Exception as exc:
        log.debug("required_hardware unavailable on the host: %s", exc)
        return None, str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def installed_environment_path(runtime: Runtime, image: str) -> str:
    """Where the image's root venv has the ``environment`` package (for ``--dev``)."""
    import uuid

    spec = SandboxSpec(
        image=image,
        name=f"karotte-probe-{uuid.uuid4().hex[:8]}",
        command=[
            SANDBOX_PYTHON,
            "-c",
            "import environment, os; print(os.path.dirname(environment.__file__))",
        ],
        labels=reaper.launcher_labels("probe"),
    )
    sandbox = runtime.start(spec)
    try:
        code = runtime.wait(sandbox, timeout_s=60)
        out = b"".join(runtime.stream_output(sandbox)).decode().strip().splitlines()
    finally:
        runtime.remove(sandbox)
    if code != 0 or not out or not out[-1].startswith("/"):
        raise ConfigError(f"cannot find the installed `environment` package in {image}")
    return out[-1]


def read_transcript(path: Path, run_id: str) -> Transcript | None:
    try:
        transcript = Transcript.model_validate_json(path.read_bytes())
    except (OSError, ValidationError, json.JSONDecodeError):
        return None
    return transcript if transcript.run_id == run_id else None


def write_infra_transcript(slot: RunSlot, message: str, kind: ErrorKind = ErrorKind.INFRA) -> None:
    """The host-side transcript of a run whose sandbox left none: every event that streamed
    back, then the error (``infra``, or ``timeout`` when the launcher's backstop stopped it)."""
    config = slot.config
    transcript = Transcript(run_id=config.run_id, task_id=config.task_id, model=config.model)
    events: list[Event] = [e for e in slot.events if not isinstance(e, TaskCompleted)]
    usage = TokenUsage()
    for event in events:
        if isinstance(event, MessageAdded) and event.usage is not None:
            usage = usage + event.usage
    events.append(ErrorOccurred(kind=kind, message=message))
    events.append(
        TaskCompleted(
            status="error",
            error_kind=kind,
            scores=[],
            score=0.0,
            duration_s=time.time() - slot.started_at,
            usage=usage,
        )
    )
    for seq, event in enumerate(events):
        event.seq = seq
    transcript.events = events
    transcript.status = "error"
    transcript.error_kind = kind
    transcript.score = 0.0
    slot.events = events
    write_text_atomic(slot.host_transcript, transcript.model_dump_json(indent=1) + "\n")


def build_image(runtime: Runtime, env_dir: Path, dev: bool, display: Display) -> str:
    """The environment's image: built (layer-cached) by ``karotte build``'s code, or for
    ``--dev`` the image built before (the mounted ``src/environment`` replaces its copy)."""
    from karotte.host.build import build_environment, default_tag, environment_name

    if dev:
        tag = default_tag(environment_name(env_dir))
        if not runtime.image_exists(tag):
            raise ConfigError(
                f"--dev uses the image built before, but {tag} does not exist in "
                f"{runtime.name}: run `karotte build --runtime {runtime.name}` once"
            )
        return tag
    started = time.monotonic()
    built = build_environment(env_dir, runtime=runtime)
    display.message(
        f"image {built.tag} ({built.cached_steps}/{built.steps} steps cached, "
        f"{time.monotonic() - started:.1f}s)"
    )
    return built.tag


__all__ = ["LaunchOptions", "LaunchResult", "Launcher", "parse_mount"]
