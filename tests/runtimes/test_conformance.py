"""The conformance suite every runtime must pass (real sandboxes; skipped where a runtime is not
available, with the reason). A new runtime gets this whole file for free by registering itself."""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import pytest

from karotte.errors import RuntimeUnavailableError
from karotte.host.runtimes import Mount, Runtime, SandboxSpec, get_runtime, runtime_names
from karotte.host.runtimes.base import LABEL_RUN_ID
from karotte.host.runtimes.cgroup_delegation import (
    delegate,
    host_cgroup_version,
    remove_dirs,
    run_dirs_everywhere,
)
from karotte.host.runtimes.docker import DockerRuntime, GVisorRuntime
from karotte.host.runtimes.oci_cli import OciCliRuntime
from karotte.host.runtimes.podman import PodmanRuntime
from karotte.host.vm.machine import VmRuntime

from .conftest import SpecFactory

pytestmark = pytest.mark.slow


def test_registry_has_the_runtimes() -> None:
    assert {"docker", "podman", "docker:gvisor", "qemu", "firecracker", "local"} <= set(
        runtime_names()
    )
    with pytest.raises(RuntimeUnavailableError, match="known runtimes"):
        get_runtime("no-such-runtime")


def test_start_exec_stream_wait_remove(runtime: Runtime, cleanup: str, spec: SpecFactory) -> None:
    sandbox = runtime.start(spec(["sh", "-c", "echo first; sleep 2; echo second"]))
    result = runtime.exec(sandbox, ["echo", "from-exec"])
    assert result.returncode == 0 and result.stdout == b"from-exec\n"
    started = time.monotonic()
    arrivals: list[tuple[float, bytes]] = []
    for line in runtime.stream_output(sandbox):
        arrivals.append((time.monotonic() - started, line))
    assert [line for _, line in arrivals] == [b"first\n", b"second\n"]
    # streamed as it happens, not collected at the end
    assert arrivals[0][0] < arrivals[1][0] - 1.0
    assert runtime.wait(sandbox, timeout_s=30) == 0
    runtime.remove(sandbox)
    assert runtime.list_sandboxes({LABEL_RUN_ID: cleanup}) == []


def test_exit_code_and_stderr_apart(runtime: Runtime, cleanup: str, spec: SpecFactory) -> None:
    sandbox = runtime.start(spec(["sh", "-c", "echo out; echo err >&2; exit 7"]))
    errors: list[str] = []
    lines = list(runtime.stream_output(sandbox, on_stderr=errors.append))
    assert lines == [b"out\n"]
    assert runtime.wait(sandbox, timeout_s=30) == 7
    assert _command_stderr(errors) == ["err"]


def _command_stderr(lines: list[str]) -> list[str]:
    """The command's stderr, without the runtime's own ``[vm] …`` diagnostics."""
    return [line for line in lines if not line.startswith("[")]


def test_labels_and_list(runtime: Runtime, cleanup: str, spec: SpecFactory) -> None:
    sandbox = runtime.start(
        spec(["sleep", "30"], labels={LABEL_RUN_ID: cleanup, "dev.karotte.extra": "x"})
    )
    found = runtime.list_sandboxes({LABEL_RUN_ID: cleanup})
    assert [s.id for s in found] == [sandbox.id]
    assert found[0].labels["dev.karotte.extra"] == "x"
    assert found[0].name == sandbox.name
    assert runtime.list_sandboxes({LABEL_RUN_ID: cleanup, "dev.karotte.extra": "y"}) == []
    assert runtime.list_sandboxes({LABEL_RUN_ID: f"{cleanup}-other"}) == []


def test_exec_as_user(runtime: Runtime, cleanup: str, spec: SpecFactory) -> None:
    sandbox = runtime.start(spec(["sleep", "30"]))
    assert runtime.exec(sandbox, ["id", "-u"], user="student").stdout == b"1000\n"
    assert runtime.exec(sandbox, ["id", "-u"], user="1000:1000").stdout == b"1000\n"
    assert runtime.exec(sandbox, ["id", "-u"]).stdout == b"0\n"


def test_env_vars_visible_and_not_in_argv(
    runtime: Runtime, cleanup: str, spec: SpecFactory
) -> None:
    sandbox = runtime.start(
        spec(
            ["sh", "-c", "echo $KAROTTE_SANDBOX $SECRETISH"],
            env={"KAROTTE_SANDBOX": runtime.sandbox_kind, "SECRETISH": "s3cr3t value"},
        )
    )
    assert b"".join(runtime.stream_output(sandbox)) == (
        f"{runtime.sandbox_kind} s3cr3t value\n".encode()
    )
    if isinstance(runtime, OciCliRuntime):
        argv, env = runtime.run_command(spec(["true"], env={"SECRETISH": "s3cr3t value"}))
        assert not any("s3cr3t" in arg for arg in argv)
        assert env == {"SECRETISH": "s3cr3t value"}
    elif isinstance(runtime, VmRuntime):  # the values travel in the io drive, not on a command line
        assert all(b"s3cr3t" not in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in _pids())


def test_out_mount_round_trip(
    runtime: Runtime, cleanup: str, tmp_out: Path, spec: SpecFactory
) -> None:
    (tmp_out / "in.txt").write_text("from host\n")
    ro = tmp_out.parent / "ro"
    ro.mkdir()
    sandbox = runtime.start(
        spec(
            ["sh", "-c", "cat /out/in.txt > /out/back.txt; echo x > /ro/f; echo rc=$?"],
            mounts=[
                Mount(source=tmp_out, target="/out"),
                Mount(source=ro, target="/ro", read_only=True),
            ],
        )
    )
    output = b"".join(runtime.stream_output(sandbox))
    assert runtime.wait(sandbox, timeout_s=30) == 0
    assert (tmp_out / "back.txt").read_text() == "from host\n"
    assert output.endswith(b"rc=2\n")  # the read-only mount refused the write
    assert not (ro / "f").exists()


def _host_memory_limit(runtime: OciCliRuntime, sandbox_id: str) -> int:
    """The memory limit the host kernel applies to the sandbox's processes (cgroup v1 or v2)."""
    pid = runtime._run("inspect", "--format", "{{.State.Pid}}", sandbox_id).stdout.decode()
    for line in Path(f"/proc/{int(pid)}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return int(Path(f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes").read_text())
        if controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            return int(Path(f"/sys/fs/cgroup{path}/memory.max").read_text())
    raise AssertionError("no memory cgroup found for the sandbox")


def _pids() -> list[str]:
    return [p.name for p in Path("/proc").iterdir() if p.name.isdigit()]


@pytest.mark.requires_root
def test_memory_and_pids_limits_set(runtime: Runtime, cleanup: str, spec: SpecFactory) -> None:
    limit = 96 * 1024 * 1024
    sandbox = runtime.start(spec(["sleep", "30"], memory_bytes=limit, pids_limit=64))
    if isinstance(runtime, VmRuntime):  # the guest kernel enforces them, on the run's cgroup
        read = ["cat", "/sys/fs/cgroup/karotte/memory.max", "/sys/fs/cgroup/karotte/pids.max"]
        assert runtime.exec(sandbox, read).stdout.split() == [str(limit).encode(), b"64"]
        return
    assert isinstance(runtime, OciCliRuntime)
    assert _host_memory_limit(runtime, sandbox.id) == limit


def test_stop_then_remove_is_idempotent(runtime: Runtime, cleanup: str, spec: SpecFactory) -> None:
    sandbox = runtime.start(spec(["sleep", "300"], init=True))
    started = time.monotonic()
    runtime.stop(sandbox, timeout_s=2)
    assert time.monotonic() - started < 30
    runtime.wait(sandbox, timeout_s=5)  # stopped: no TimeoutError
    runtime.remove(sandbox)
    runtime.remove(sandbox)  # already gone: fine
    runtime.stop(sandbox)  # also fine
    assert runtime.list_sandboxes({LABEL_RUN_ID: cleanup}) == []


def test_capabilities_dropped_except_added(
    runtime: Runtime, cleanup: str, spec: SpecFactory
) -> None:
    sandbox = runtime.start(spec(["cat", "/proc/self/status"], cap_add=["CHOWN", "KILL"]))
    status = b"".join(runtime.stream_output(sandbox)).decode()
    eff = next(line for line in status.splitlines() if line.startswith("CapEff:"))
    assert int(eff.split()[1], 16) == (1 << 0) | (1 << 5)  # CHOWN, KILL and nothing else
    nnp = next((line for line in status.splitlines() if line.startswith("NoNewPrivs:")), None)
    if nnp is not None:  # gVisor does not report it
        assert nnp.split()[1] == "1"


def test_coreutils_see_file_metadata(runtime: Runtime, cleanup: str, spec: SpecFactory) -> None:
    """`ls -l` as the student works (gVisor 2022-12 failed every statx of coreutils: EINVAL)."""
    sandbox = runtime.start(spec(["sleep", "60"]))
    result = runtime.exec(sandbox, ["ls", "-ld", "/etc"], user="1000:1000")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(b"d")


def test_network_none_has_only_loopback(runtime: Runtime, cleanup: str, spec: SpecFactory) -> None:
    sandbox = runtime.start(spec(["cat", "/proc/net/dev"]))
    text = b"".join(runtime.stream_output(sandbox)).decode()
    interfaces = {line.split(":")[0].strip() for line in text.splitlines()[2:] if ":" in line}
    assert interfaces <= {"lo"}


def test_tmpfs_bounded(runtime: Runtime, cleanup: str, spec: SpecFactory) -> None:
    sandbox = runtime.start(
        spec(
            ["sh", "-c", "head -c 3000000 /dev/zero > /tmp/big; echo rc=$?"],
            tmpfs={"/tmp": 1024 * 1024},
        )
    )
    assert b"".join(runtime.stream_output(sandbox)).endswith(b"rc=1\n")


def test_exec_timeout(runtime: Runtime, cleanup: str, spec: SpecFactory) -> None:
    sandbox = runtime.start(spec(["sleep", "60"]))
    with pytest.raises(TimeoutError):
        runtime.exec(sandbox, ["sleep", "30"], timeout_s=1)


def test_wait_timeout(runtime: Runtime, cleanup: str, spec: SpecFactory) -> None:
    sandbox = runtime.start(spec(["sleep", "60"]))
    with pytest.raises(TimeoutError):
        runtime.wait(sandbox, timeout_s=1)


def test_start_failure_leaves_nothing(runtime: Runtime, cleanup: str, spec: SpecFactory) -> None:
    if isinstance(runtime, VmRuntime):
        # the guest's init, not the host, finds the command missing: exit 127, said on stderr
        sandbox = runtime.start(spec(["/no/such/binary"]))
        errors: list[str] = []
        assert list(runtime.stream_output(sandbox, on_stderr=errors.append)) == []
        assert runtime.wait(sandbox, timeout_s=60) == 127
        assert any("/no/such/binary" in line for line in _command_stderr(errors)), errors
        runtime.remove(sandbox)
    else:
        with pytest.raises(RuntimeUnavailableError):
            runtime.start(spec(["/no/such/binary"]))
    assert runtime.list_sandboxes({LABEL_RUN_ID: cleanup}) == []


def _broken(runtime: Runtime) -> Runtime:
    """The same runtime pointed at an engine that is not running."""
    if isinstance(runtime, PodmanRuntime):
        return PodmanRuntime(global_args=["--url", "unix:///nonexistent/podman.sock"])
    if isinstance(runtime, GVisorRuntime):
        return GVisorRuntime(env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    if isinstance(runtime, DockerRuntime):
        return DockerRuntime(env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    if isinstance(runtime, VmRuntime):  # images come from docker: a stopped docker stops it too
        broken = type(runtime)()
        broken.engine = DockerRuntime(env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
        return broken
    raise AssertionError(f"no broken variant for {runtime.name}")


def test_stopped_engine_is_unavailable_with_fix(
    runtime: Runtime, cleanup: str, spec: SpecFactory
) -> None:
    broken = _broken(runtime)
    availability = broken.availability()
    assert not availability.ok
    assert availability.fix
    with pytest.raises(RuntimeUnavailableError, match="fix:"):
        broken.ensure_available()
    with pytest.raises(RuntimeUnavailableError, match="fix:"):
        broken.start(spec(["true"]))


def test_missing_binary_is_unavailable_with_install_fix(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    if isinstance(runtime, OciCliRuntime):
        missing: Runtime = type(runtime)(env={"PATH": "/nonexistent"})
    else:
        monkeypatch.setenv("PATH", "/nonexistent")
        missing = type(runtime)()
    availability = missing.availability()
    assert not availability.ok
    assert "not installed" in availability.reason
    assert "apt-get install" in availability.fix


@pytest.mark.requires_root
def test_writable_student_cgroup(runtime: Runtime, cleanup: str, spec: SpecFactory) -> None:
    """The launcher's cgroup delegation: the sandbox's root can move a process into the
    student cgroup, and the run's memory limit sits above both."""
    if isinstance(runtime, VmRuntime):
        pytest.skip(f"{runtime.name}: the guest's cgroups are its own (tests/vm/test_qemu.py)")
    assert isinstance(runtime, OciCliRuntime)
    if not runtime.supports_writable_cgroup:
        pytest.skip(f"{runtime.name} runs its processes in its own kernel: no host cgroups")
    if host_cgroup_version() != "v1":
        pytest.skip("this test checks the cgroup v1 layout")
    name = f"kt-cg-{uuid.uuid4().hex[:8]}"
    delegation, why = delegate(name, memory_bytes=128 * 1024 * 1024, pids_limit=100)
    assert delegation is not None, why
    try:
        sandbox = runtime.start(
            spec(
                [
                    "sh",
                    "-c",
                    "sleep 30 & echo $! > /run/karotte/cgroup/memory/cgroup.procs && echo moved; "
                    "cat /proc/$!/cgroup; wait",
                ],
                mounts=delegation.mounts,
                cgroup_parent=delegation.cgroup_parent,
                cap_add=["DAC_OVERRIDE"],
            )
        )
        lines: list[bytes] = []
        reader = threading.Thread(
            target=lambda: lines.extend(runtime.stream_output(sandbox)), daemon=True
        )
        reader.start()
        student = Path(f"/sys/fs/cgroup/memory/karotte/{name}/student/cgroup.procs")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not student.read_text().strip():
            time.sleep(0.1)
        assert student.read_text().strip(), f"nothing moved into the student cgroup: {lines}"
        limit = Path(f"/sys/fs/cgroup/memory/karotte/{name}/memory.limit_in_bytes")
        assert int(limit.read_text()) == 128 * 1024 * 1024
        runtime.remove(sandbox)
    finally:
        for sandbox in runtime.list_sandboxes({LABEL_RUN_ID: cleanup}):
            runtime.remove(sandbox)
        assert remove_dirs(run_dirs_everywhere(name)) == []
    assert not list(Path("/sys/fs/cgroup").glob(f"*/karotte/{name}"))


def test_local_runtime_is_honest() -> None:
    local = get_runtime("local")
    assert local.availability().ok
    assert "NO isolation" in local.availability().reason
    with pytest.raises(RuntimeUnavailableError, match="in-process"):
        local.start(SandboxSpec(image="x", name="x", command=["true"]))
    assert local.list_sandboxes({}) == []


def test_default_runtime_selection_says_why() -> None:
    from karotte.host.runtimes import select_default_runtime

    name, why = select_default_runtime()
    if os.uname().sysname == "Linux":
        from karotte.host.boot_probe import firecracker_boot_probe

        probe = firecracker_boot_probe()  # the cached boot probe decides, not /dev/kvm
        assert name == ("firecracker" if probe.ok else "docker")
        assert "boot probe" in why or "Firecracker" in why or "guest kernel" in why


def test_docker_cli_env_overrides_only_this_instance() -> None:
    runtime = DockerRuntime(env={"DOCKER_HOST": "unix:///x.sock"})
    assert runtime.cli_env()["DOCKER_HOST"] == "unix:///x.sock"
    assert DockerRuntime().cli_env().get("DOCKER_HOST") == os.environ.get("DOCKER_HOST")
    assert "DOCKER_HOST" in runtime.start_engine_fix()


def test_probe_is_fast() -> None:
    for name in ("docker", "podman", "docker:gvisor"):
        started = time.monotonic()
        get_runtime(name).availability()
        assert time.monotonic() - started < 5, name
