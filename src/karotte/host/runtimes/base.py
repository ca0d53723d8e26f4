"""The one interface every sandbox runtime implements (containers now, VMs later).

A runtime builds images and runs sandboxes. It is registered by name (``docker``, ``podman``,
``docker:gvisor``, ``local`` …) and must pass the shared conformance suite in
``tests/runtimes/``. Keep the surface small: the launcher only uses what is here.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from karotte.errors import RuntimeUnavailableError

LABEL_PREFIX = "dev.karotte"
LABEL_RUN_ID = f"{LABEL_PREFIX}.run-id"
LABEL_LAUNCHER_PID = f"{LABEL_PREFIX}.launcher-pid"
LABEL_LAUNCHER_HOST = f"{LABEL_PREFIX}.launcher-host"


class Availability(BaseModel):
    """Whether a runtime works on this machine; when not, ``fix`` is the exact remedy."""

    model_config = ConfigDict(extra="forbid")

    ok: bool
    reason: str = ""
    fix: str = ""

    def raise_if_unavailable(self, runtime: str) -> None:
        if not self.ok:
            raise RuntimeUnavailableError(
                f"runtime {runtime!r} is not usable here: {self.reason}\nfix: {self.fix}"
            )


class Mount(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: Path
    target: str
    read_only: bool = False


class SandboxSpec(BaseModel):
    """Everything needed to start one sandbox."""

    model_config = ConfigDict(extra="forbid")

    image: str
    name: str
    command: list[str]
    labels: dict[str, str] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    mounts: list[Mount] = Field(default_factory=list)
    memory_bytes: int | None = None
    cpus: float | None = None
    pids_limit: int | None = None
    disk_bytes: int | None = None
    # confinement of the sandbox itself (every runtime drops all other capabilities)
    cap_add: list[str] = Field(default_factory=list)
    devices: list[str] = Field(default_factory=list)
    network: str = "none"
    init: bool = False  # a tiny init as PID 1 (reaps zombies, forwards signals)
    tmpfs: dict[str, int] = Field(default_factory=dict)  # mount point -> size in bytes
    cgroup_parent: str | None = None
    workdir: str | None = None
    # engine arguments from karotte.container_run_args plugins (OCI engines only)
    extra_args: list[str] = Field(default_factory=list)


class Sandbox(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    name: str
    runtime: str
    labels: dict[str, str] = Field(default_factory=dict)


class ExecResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    returncode: int
    stdout: bytes
    stderr: bytes


OutputCallback = Callable[[str], None]


class Runtime(abc.ABC):
    """A sandbox runtime. One subclass per engine; instances are cheap."""

    name: ClassVar[str]
    sandbox_kind: ClassVar[str]  # value of KAROTTE_SANDBOX inside: runc, gvisor, firecracker, …

    @abc.abstractmethod
    def availability(self) -> Availability:
        """Probe (quickly) whether this runtime really works here."""

    def ensure_available(self) -> None:
        self.availability().raise_if_unavailable(self.name)

    @abc.abstractmethod
    def build(
        self,
        context: Path,
        containerfile: Path,
        tag: str,
        build_args: dict[str, str],
        on_output: OutputCallback | None = None,
    ) -> str:
        """Build an image; return its id. Errors show the failing step's output."""

    @abc.abstractmethod
    def image_exists(self, tag: str) -> bool: ...

    @abc.abstractmethod
    def import_rootfs(self, tarball: Path, tag: str) -> str:
        """Import a root filesystem tarball as an image; return its id."""

    @abc.abstractmethod
    def start(self, spec: SandboxSpec) -> Sandbox:
        """Start a sandbox running ``spec.command`` in the background."""

    @abc.abstractmethod
    def exec(
        self,
        sandbox: Sandbox,
        argv: list[str],
        user: str | None = None,
        timeout_s: float | None = None,
    ) -> ExecResult: ...

    @abc.abstractmethod
    def stream_output(
        self, sandbox: Sandbox, on_stderr: OutputCallback | None = None
    ) -> Iterator[bytes]:
        """The sandbox command's stdout, line by line, until it exits (stderr lines go to
        ``on_stderr``, and so do the runtime's own diagnostics, each prefixed with its source in
        brackets, e.g. ``[vm] …``)."""

    @abc.abstractmethod
    def wait(self, sandbox: Sandbox, timeout_s: float | None = None) -> int: ...

    @abc.abstractmethod
    def stop(self, sandbox: Sandbox, timeout_s: float = 10) -> None: ...

    @abc.abstractmethod
    def remove(self, sandbox: Sandbox) -> None:
        """Remove the sandbox (idempotent)."""

    @abc.abstractmethod
    def list_sandboxes(self, labels: dict[str, str]) -> list[Sandbox]:
        """Sandboxes (running or not) carrying all the given labels."""


_REGISTRY: dict[str, Callable[[], Runtime]] = {}


def register_runtime(name: str) -> Callable[[Callable[[], Runtime]], Callable[[], Runtime]]:
    def decorator(factory: Callable[[], Runtime]) -> Callable[[], Runtime]:
        _REGISTRY[name] = factory
        return factory

    return decorator


def runtime_names() -> list[str]:
    return sorted(_REGISTRY)


def get_runtime(name: str) -> Runtime:
    if name not in _REGISTRY:
        raise RuntimeUnavailableError(
            f"unknown runtime {name!r}; known runtimes: {', '.join(runtime_names())}"
        )
    return _REGISTRY[name]()
