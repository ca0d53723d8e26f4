"""The ``qemu`` runtime for real (TCG here): a bare boot to the init's marker, a sandbox's
round trip (stream, exit code, /out back, no links), ``example-task`` end to end with the fake
model, and a hung guest killed by the watchdog (an ``infra`` error with the transcript so far).

The environment's image is built once per session (same tag as tests/runtimes/test_e2e.py, so
docker's layer cache serves the second build); each slow test boots its own VM once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from karotte.host.runtimes import get_runtime
from karotte.host.runtimes.base import LABEL_RUN_ID, Mount, SandboxSpec
from karotte.host.runtimes.qemu import QemuRuntime, boot_to_marker, kvm_probe, qmp
from karotte.host.vm.kernel import prepare_kernel

from .unix_echo import serve_unix_echo

# TCG: an example-task run takes ~100 s, and the first test also builds the image
pytestmark = [
    pytest.mark.slow,
    pytest.mark.requires_qemu,
    pytest.mark.requires_docker,
    pytest.mark.timeout(1200),
]

KAROTTE = str(Path(sys.executable).parent / "karotte")
E2E_TAG = "karotte-test/e2e-default:latest"
BASE_TAG = "karotte/base:bookworm"


@pytest.fixture(scope="session")
def qemu() -> QemuRuntime:
    runtime = get_runtime("qemu")
    availability = runtime.availability()
    if not availability.ok:
        pytest.skip(f"qemu: {availability.reason} (fix: {availability.fix})")
    assert isinstance(runtime, QemuRuntime)
    return runtime


@pytest.fixture(scope="session")
def env_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("vm-e2e") / "e2e-env"
    proc = subprocess.run(
        [KAROTTE, "create-env", str(target)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    return target


@pytest.fixture(scope="session")
def image(env_dir: Path) -> str:
    proc = subprocess.run(
        [KAROTTE, "build", "--runtime", "docker", "--tag", E2E_TAG, str(env_dir)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return E2E_TAG


@pytest.fixture
def label() -> Iterator[str]:
    value = f"vm-{uuid.uuid4().hex[:10]}"
    yield value
    runtime = get_runtime("qemu")
    for sandbox in runtime.list_sandboxes({LABEL_RUN_ID: value}):
        runtime.remove(sandbox)


def test_guest_kernel_boots_to_the_marker(qemu: QemuRuntime) -> None:
    kernel = prepare_kernel()
    probe = boot_to_marker(kernel, "tcg", timeout_s=60)
    assert probe.ok, probe.detail
    assert probe.seconds < 30
    kvm = kvm_probe(kernel)  # here: KVM-PVM refuses; elsewhere it may boot. Either way, said.
    assert kvm.ok or kvm.detail
    assert qemu.accel(kernel) == ("kvm" if kvm.ok else "tcg")
    if not kvm.ok:
        assert "TCG" in qemu.availability().reason and "slower" in qemu.availability().reason


def test_sandbox_round_trip(qemu: QemuRuntime, tmp_path: Path, label: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("from the host\n")
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "data.txt").write_text("read only\n")
    script = (
        "echo hello; echo to-stderr >&2; cat /out/config.json; cat /ro/data.txt;"
        "echo x > /ro/data.txt 2>/dev/null && echo RO-WRITABLE;"
        "cat /sys/fs/cgroup/karotte/memory.max; echo $KAROTTE_CGROUP_ROOT $FROM_SPEC;"
        "echo result > /out/result.txt; mkdir -p /out/art; echo a > /out/art/a.txt;"
        "ln -s /etc/shadow /out/shadow-link; exit 7"
    )
    spec = SandboxSpec(
        image=BASE_TAG,
        name=f"karotte-{label}",
        command=["sh", "-c", script],
        labels={LABEL_RUN_ID: label},
        env={"FROM_SPEC": "yes"},
        mounts=[
            Mount(source=out, target="/out"),
            Mount(source=ro, target="/ro", read_only=True),
        ],
        memory_bytes=1 << 30,
        disk_bytes=1 << 30,
    )
    sandbox = qemu.start(spec)
    assert [s.id for s in qemu.list_sandboxes({LABEL_RUN_ID: label})] == [sandbox.id]
    stderr: list[str] = []
    lines = [line.decode().strip() for line in qemu.stream_output(sandbox, stderr.append)]
    assert qemu.wait(sandbox, timeout_s=60) == 7
    assert lines[:4] == ["hello", "from the host", "read only", str(1 << 30)]
    assert "RO-WRITABLE" not in lines
    assert "/run/karotte/cgroup yes" in lines
    assert "to-stderr" in stderr
    assert (out / "result.txt").read_text() == "result\n"
    assert (out / "art" / "a.txt").read_text() == "a\n"
    assert not (out / "shadow-link").exists() and not (out / "shadow-link").is_symlink()
    assert (ro / "data.txt").read_text() == "read only\n"
    qemu.remove(sandbox)
    assert qemu.list_sandboxes({LABEL_RUN_ID: label}) == []
    qemu.remove(sandbox)  # idempotent


GUEST_PROBE = """
import socket, sys
def ask(payload):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect("/run/karotte/relay/proxy.sock")
    s.sendall(payload)
    s.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            return data
        data += chunk
print(ask(b"one").decode(), ask(b"two").decode())
for host, port in [("10.0.2.2", int(sys.argv[1])), ("10.0.2.100", 9), ("192.0.2.1", 80)]:
    try:
        socket.create_connection((host, port), timeout=3).close()
        print("REACHED", host)
    except OSError:
        print("unreachable", host)
"""


def test_relay_sockets_are_forwarded_and_nothing_else_is_reachable(
    qemu: QemuRuntime, tmp_path: Path, label: str
) -> None:
    """The launcher's relays (model proxy, backend) are unix sockets in a mounted directory: in a
    VM they are forwarded through QEMU's restricted user network, which reaches nothing else."""
    import socket

    relay = tmp_path / "relay"
    relay.mkdir(mode=0o700)
    server = serve_unix_echo(relay / "proxy.sock", b"host-saw-")
    host_service = socket.create_server(("0.0.0.0", 0))  # a host port the guest must not reach
    port = host_service.getsockname()[1]
    spec = SandboxSpec(
        image=BASE_TAG,
        name=f"karotte-{label}",
        command=["python3", "-c", GUEST_PROBE, str(port)],
        labels={LABEL_RUN_ID: label},
        mounts=[Mount(source=relay, target="/run/karotte/relay")],
        memory_bytes=1 << 30,
        disk_bytes=1 << 30,
    )
    sandbox = qemu.start(spec)
    stderr: list[str] = []
    lines = [line.decode().strip() for line in qemu.stream_output(sandbox, stderr.append)]
    code = qemu.wait(sandbox, timeout_s=60)
    qemu.remove(sandbox)
    server.close()
    host_service.close()
    assert code == 0, stderr
    assert lines == [
        "host-saw-one host-saw-two",
        "unreachable 10.0.2.2",
        "unreachable 10.0.2.100",
        "unreachable 192.0.2.1",
    ], stderr
    assert (relay / "proxy.sock").exists()  # the host's socket is not taken back as /out


def _karotte_run(env_dir: Path, out: Path, *args: str, **kw: object) -> subprocess.Popen[str]:
    env = {**os.environ, **kw.pop("env", {})}  # type: ignore[dict-item]
    return subprocess.Popen(
        [KAROTTE, "run", "--task", "example-task", "--fake-model", "--out", str(out), "--no-ui",
         "--runtime", "qemu", *args],
        cwd=env_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def test_example_task_passes_in_qemu(env_dir: Path, image: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    started = time.monotonic()
    proc = _karotte_run(env_dir, out, "--image", image)
    _stdout, stderr = proc.communicate(timeout=900)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, stderr[-4000:]
    transcript = json.loads((out / "transcript.json").read_text())
    completed = transcript["events"][-1]
    assert transcript["status"] == "passed", completed
    assert completed["scores"] == [1.0, 1.0]
    assert transcript["events"][0]["sandbox"] == "qemu"
    assert transcript["events"][0]["config"]["student_user"] == "student"
    limits = next(e for e in transcript["events"] if e["type"] == "limits_applied")["limits"]
    print(f"\nexample-task under qemu: {elapsed:.1f} s; limits: {json.dumps(limits)[:600]}")
    assert get_runtime("qemu").list_sandboxes({LABEL_RUN_ID: transcript["run_id"]}) == []


def test_model_calls_go_through_the_proxy_in_qemu(
    env_dir: Path, image: str, tmp_path: Path
) -> None:
    """`--proxy` in a VM: the launcher's relay socket is forwarded into the guest (QEMU's
    restricted user network), and the harness's model calls reach a local provider stub. The
    student, in a bash tool call, cannot use that network: neither the forward address nor the
    host's gateway answers it."""
    from stubs.helpers import model_id
    from stubs.provider_stub import ProviderStub, StubReply, StubToolCall

    from karotte.host.vm.socket_forward import FIRST_PORT, FORWARD_ADDRESS

    probe = (
        f"for t in {FORWARD_ADDRESS}/{FIRST_PORT} 10.0.2.2/22 10.0.2.2/80; do "
        '(timeout 5 bash -c "echo > /dev/tcp/$t" 2>/dev/null && echo "reached $t") '
        '|| echo "blocked $t"; done'
    )
    call = StubToolCall("call_net", "bash", json.dumps({"command": probe}))
    out = tmp_path / "out"
    with ProviderStub([StubReply(text="Checking the network.", tool_calls=[call])]) as stub:
        stub.default = StubReply(text="The sum is 52.\n\nSUM: 52")
        proc = subprocess.run(
            [KAROTTE, "run", "--task", "example-task", "--model", model_id("anthropic"),
             "--model-api-key", "sk-test", "--out", str(out), "--no-ui", "--runtime", "qemu",
             "--image", image, "--proxy", stub.url],
            cwd=env_dir, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        paths = [r.path for r in stub.requests]
    transcript = json.loads((out / "transcript.json").read_text())
    assert transcript["status"] != "error", proc.stderr[-4000:]
    assert paths and all(p.startswith("/v1/messages") for p in paths), paths
    assert transcript["events"][-1]["scores"][0] == 1.0  # step 1 answered through the proxy
    assert transcript["events"][0]["sandbox"] == "qemu"
    result = next(
        e
        for e in transcript["events"]
        if e["type"] == "tool_call_completed" and "blocked" in str(e)
    )
    assert "reached" not in str(result), result
    assert str(result).count("blocked") == 3, result


def test_hung_guest_is_killed_by_the_watchdog(env_dir: Path, image: str, tmp_path: Path) -> None:
    """The harness emits one event, then the whole guest freezes (its vCPUs are stopped through
    QMP, as a guest kernel that locks up): the watchdog kills the VM, and the launcher writes an
    infra transcript with the event that came through and the watchdog's reason."""
    fake = tmp_path / "fake-karotte"
    fake.write_text(
        "#!/bin/sh\n"
        'echo \'{"type": "step_started", "step_index": 0, "instructions": "hi"}\'\n'
        "echo 'about to hang' >&2\n"
        "sleep 600\n"
    )
    fake.chmod(0o755)
    out = tmp_path / "out"
    proc = _karotte_run(
        env_dir,
        out,
        "--image",
        image,
        "--mount",
        f"{fake}:/root/.venv/bin/karotte:ro",
        env={"KAROTTE_VM_WATCHDOG_S": "6"},
    )
    runtime = get_runtime("qemu")
    assert isinstance(runtime, QemuRuntime)
    deadline = time.monotonic() + 300
    frozen = False
    while time.monotonic() < deadline and not frozen:
        time.sleep(0.5)
        for sandbox in runtime.list_sandboxes({}):
            directory = runtime.sandbox_dir(sandbox.name)
            log = directory / "channel.log"
            if str(out.name) and log.exists() and b"about to hang" in log.read_bytes():
                qmp(directory / "qmp.sock", "stop")
                frozen = True
        assert proc.poll() is None, proc.communicate()[1][-3000:]
    assert frozen, "the fake harness never started"
    _stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr[-3000:]
    transcript = json.loads((out / "transcript.json").read_text())
    assert transcript["status"] == "error" and transcript["error_kind"] == "infra"
    types = [e["type"] for e in transcript["events"]]
    assert types == ["step_started", "error", "task_completed"]
    message = transcript["events"][1]["message"]
    assert "watchdog" in message and "about to hang" in message


def test_stop_asks_the_guest_first(qemu: QemuRuntime, tmp_path: Path, label: str) -> None:
    """``stop`` sends TERM over the control port: the command's own handler runs (a harness
    writes its transcript there), its output and /out still come back."""
    out = tmp_path / "out"
    out.mkdir()
    script = (
        "trap 'echo got-term; echo stopped > /out/stopped.txt; exit 5' TERM;"
        "echo up; while true; do sleep 0.2; done"
    )
    spec = SandboxSpec(
        image=BASE_TAG,
        name=f"karotte-{label}",
        command=["sh", "-c", script],
        labels={LABEL_RUN_ID: label},
        mounts=[Mount(source=out, target="/out")],
        memory_bytes=1 << 30,
        disk_bytes=1 << 30,
    )
    sandbox = qemu.start(spec)
    log = qemu.sandbox_dir(sandbox.name) / "channel.log"
    deadline = time.monotonic() + 120
    while b"kO up" not in (log.read_bytes() if log.exists() else b""):
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.2)
    qemu.stop(sandbox, timeout_s=60)
    assert qemu.wait(sandbox, timeout_s=5) == 5
    lines = [line.decode().strip() for line in qemu.stream_output(sandbox)]
    assert lines == ["up", "got-term"]
    assert (out / "stopped.txt").read_text() == "stopped\n"
    qemu.remove(sandbox)
