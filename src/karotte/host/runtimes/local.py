"""``local``: no sandbox at all. The harness runs in the ``karotte run`` process itself.

The launcher special-cases it (``karotte run --runtime local``) and prints a loud warning. It is
registered so that ``--runtime local`` is a known name and its availability can be reported, but
it has no sandboxes: every sandbox operation raises with an explanation instead of pretending.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar, NoReturn

from karotte.errors import RuntimeUnavailableError
from karotte.host.runtimes.base import (
    Availability,
    ExecResult,
    OutputCallback,
    Runtime,
    Sandbox,
    SandboxSpec,
    register_runtime,
)

LOCAL_WARNING_TEXT = (
    "--runtime local runs the student's tool calls in this process, on this machine, with NO "
    "isolation. Use it only to develop tasks with a trusted model or the fake model."
)


class LocalRuntime(Runtime):
    name: ClassVar[str] = "local"
    sandbox_kind: ClassVar[str] = "none"

    def availability(self) -> Availability:
        return Availability(ok=True, reason="no isolation: " + LOCAL_WARNING_TEXT)

    def _no_sandboxes(self, what: str) -> NoReturn:
        raise RuntimeUnavailableError(
            f"runtime 'local' has no {what}: the harness runs in-process "
            "(`karotte run --runtime local`); pick docker, podman or docker:gvisor for a sandbox"
        )

    def build(
        self,
        context: Path,
        containerfile: Path,
        tag: str,
        build_args: dict[str, str],
        on_output: OutputCallback | None = None,
    ) -> str:
        self._no_sandboxes("images")

    def image_exists(self, tag: str) -> bool:
        self._no_sandboxes("images")

    def import_rootfs(self, tarball: Path, tag: str) -> str:
        self._no_sandboxes("images")

    def start(self, spec: SandboxSpec) -> Sandbox:
        self._no_sandboxes("sandboxes")

    def exec(
        self,
        sandbox: Sandbox,
        argv: list[str],
        user: str | None = None,
        timeout_s: float | None = None,
    ) -> ExecResult:
        self._no_sandboxes("sandboxes")

    def stream_output(
        self, sandbox: Sandbox, on_stderr: OutputCallback | None = None
    ) -> Iterator[bytes]:
        self._no_sandboxes("sandboxes")

    def wait(self, sandbox: Sandbox, timeout_s: float | None = None) -> int:
        self._no_sandboxes("sandboxes")

    def stop(self, sandbox: Sandbox, timeout_s: float = 10) -> None:
        self._no_sandboxes("sandboxes")

    def remove(self, sandbox: Sandbox) -> None:
        self._no_sandboxes("sandboxes")

    def list_sandboxes(self, labels: dict[str, str]) -> list[Sandbox]:
        return []  # nothing can leak from a run without sandboxes


register_runtime("local")(LocalRuntime)
