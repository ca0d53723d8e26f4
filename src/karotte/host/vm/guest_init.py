"""Stage 2 of the karotte guest: PID 1 in the VM's root, run by the image's own python3.

Standard library only (it runs with whatever python3 the image has, 3.9+). It reads
``/run/karotte/in/vm.json`` (written by :mod:`karotte.host.vm.drives`), then:

1. mounts cgroup v2 and makes ``/sys/fs/cgroup/karotte/{harness,student}`` with the sandbox's
   memory and pids limits on ``karotte`` (the student's cgroup is handed to the harness as
   ``KAROTTE_CGROUP_ROOT``), the bounded tmpfs mounts, and copies the host's mounts in (read-only
   ones are then remounted read-only); if the host forwards unix sockets (the launcher's relays,
   :mod:`karotte.host.vm.socket_forward`), brings up the one network interface and listens at
   each socket's path;
2. starts the command (the harness) in ``karotte/harness`` with, as in a container, only the
   sandbox's capabilities (the rest dropped from the bounding set) and no new privileges, and
   forwards its stdout and stderr line by line as frames on the channel (``karotte.events``
   virtio-serial port, or the serial line named by ``karotte.channel=``), with a heartbeat every
   second;
3. obeys ``TERM``/``KILL`` lines on the control port (``karotte.ctl``) by signalling the command,
   and runs the host's commands from the exec port (``karotte.exec``: a JSON request line in, a
   JSON reply line out; see :mod:`karotte.host.vm.exec_channel`), confined the same way;
4. reaps every orphan (it is PID 1);
5. when the command exits: kills what is left, writes the read-write mounts (``/out``) as a tar of
   regular files onto the out drive, sends the exit code and powers off (reboot with
   ``-no-reboot`` on the VMM side ends the VM).

Frame format (one per line): ``\\x1ek<kind> <payload>\\n`` with kind ``O`` (stdout line), ``E``
(stderr line), ``L`` (init log), ``H`` (heartbeat), ``X`` (exit code).
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from typing import IO, Any

BUSYBOX = "/run/karotte/busybox"
IN_DIR = "/run/karotte/in"
CGROUP = "/sys/fs/cgroup"
STUDENT_CGROUP_ROOT = "/run/karotte/cgroup"
FRAME = b"\x1ek"
RB_AUTOBOOT = 0x01234567
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
EXEC_OUTPUT_MAX = 16 << 20  # per stream; more is cut (the host asked for a command's output)
LIBC = ctypes.CDLL(None, use_errno=True)


class Channel:
    """Frames to the host; one lock so lines of different streams never interleave."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_NOCTTY)
        self._lock = threading.Lock()

    def send(self, kind: str, payload: bytes = b"") -> None:
        data = FRAME + kind.encode() + b" " + payload.replace(b"\n", b" ") + b"\n"
        with self._lock:
            view = memoryview(data)
            while view:
                try:
                    written = os.write(self._fd, view)
                except InterruptedError:
                    continue
                view = view[written:]


def _cmdline_arg(name: str) -> str | None:
    with open("/proc/cmdline") as handle:
        for word in handle.read().split():
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
    return None


def find_port(name: str) -> str | None:
    base = "/sys/class/virtio-ports"
    if os.path.isdir(base):
        for port in sorted(os.listdir(base)):
            try:
                with open(os.path.join(base, port, "name")) as handle:
                    if handle.read().strip() == name:
                        return "/dev/" + port
            except OSError:
                continue
    return None


def run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def mount(fstype: str, source: str, target: str, options: str = "") -> None:
    os.makedirs(target, exist_ok=True)
    argv = [BUSYBOX, "mount", "-t", fstype]
    if options:
        argv += ["-o", options]
    run([*argv, source, target])


def write(path: str, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def setup_cgroups(memory: int | None, pids: int | None, log: Channel) -> dict[str, str]:
    """cgroup v2: ``karotte`` bounds harness and student together; the student's own cgroup is
    bind-mounted at ``/run/karotte/cgroup/unified`` for the harness (KAROTTE_CGROUP_ROOT)."""
    try:
        mount("cgroup2", "cgroup2", CGROUP, "nsdelegate")
        write(f"{CGROUP}/cgroup.subtree_control", "+memory +pids +cpu")
        base = f"{CGROUP}/karotte"
        os.makedirs(f"{base}/harness", exist_ok=True)
        os.makedirs(f"{base}/student", exist_ok=True)
        write(f"{base}/cgroup.subtree_control", "+memory +pids +cpu")
        if memory:
            write(f"{base}/memory.max", str(memory))
            write(f"{base}/memory.swap.max", "0")
        if pids:
            write(f"{base}/pids.max", str(pids))
        target = f"{STUDENT_CGROUP_ROOT}/unified"
        os.makedirs(target, exist_ok=True)
        run([BUSYBOX, "mount", "--bind", f"{base}/student", target])
    except (OSError, subprocess.CalledProcessError) as exc:
        log.send("L", f"no student cgroup: {exc}".encode())
        return {}
    return {"KAROTTE_CGROUP_ROOT": STUDENT_CGROUP_ROOT}


def copy_mounts(mounts: list[dict[str, Any]]) -> None:
    for entry in mounts:
        source = os.path.join(IN_DIR, entry["source"])
        target = entry["target"]
        if os.path.isdir(source):
            os.makedirs(target, exist_ok=True)
            run([BUSYBOX, "cp", "-a", source + "/.", target + "/"])
        else:
            os.makedirs(os.path.dirname(target) or "/", exist_ok=True)
            run([BUSYBOX, "cp", "-a", source, target])
        if entry.get("read_only"):
            run([BUSYBOX, "mount", "--bind", target, target])
            run([BUSYBOX, "mount", "-o", "remount,ro,bind", target, target])


def _copy(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def _join(client: socket.socket, address: str, port: int) -> None:
    try:
        upstream = socket.create_connection((address, port), timeout=30)
    except OSError:
        client.close()
        return
    upstream.settimeout(None)
    back = threading.Thread(target=_copy, args=(upstream, client), daemon=True)
    back.start()
    _copy(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _accept(listener: socket.socket, address: str, port: int) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_join, args=(client, address, port), daemon=True).start()


def start_socket_forwards(config: dict[str, Any], log: Channel) -> None:
    """The host's relay sockets (karotte.host.vm.socket_forward): bring up the one interface,
    which reaches only the forward address, and listen at each socket's path (root only)."""
    forwards: list[dict[str, Any]] = config.get("socket_forwards") or []
    if not forwards:
        return
    links = sorted(n for n in os.listdir("/sys/class/net") if n != "lo")
    if not links:
        log.send("L", b"socket forwards asked for, but the guest has no network interface")
        return
    run([BUSYBOX, "ip", "addr", "add", config["guest_address"], "dev", links[0]])
    run([BUSYBOX, "ip", "link", "set", links[0], "up"])
    for forward in forwards:
        path = forward["path"]
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(64)
        args = (listener, forward["address"], int(forward["port"]))
        threading.Thread(target=_accept, args=args, daemon=True).start()


class Confinement:
    """What every process the VM runs for the host gets, as in a container: the cgroup
    ``karotte/harness``, a bounding set of only the sandbox's capabilities (so root holds just
    those after exec), no new privileges, and its own session."""

    def __init__(self, keep: list[int]) -> None:
        try:
            with open("/proc/sys/kernel/cap_last_cap") as handle:
                last = int(handle.read())
        except (OSError, ValueError):
            last = 63
        self.drop = [n for n in range(last + 1) if n not in keep]

    def enter(self, uid: int = 0, gid: int = 0) -> None:
        """Run in the child between fork and exec."""
        with contextlib.suppress(OSError):
            write(f"{CGROUP}/karotte/harness/cgroup.procs", "0")
        for cap in self.drop:
            LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
        LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if uid or gid:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)

    def spawn(
        self, argv: list[str], env: dict[str, str], cwd: str, uid: int = 0, gid: int = 0
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` confined, in its own session, stdin empty, stdout/stderr piped."""
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            preexec_fn=lambda: self.enter(uid, gid),
            start_new_session=True,
        )


def resolve_user(user: str | None) -> tuple[int, int]:
    """``None`` (root), a name, ``uid`` or ``uid:gid`` — as ``docker exec --user`` takes it."""
    if not user:
        return 0, 0
    name, _, group = user.partition(":")
    if name.isdigit():
        uid = int(name)
        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            gid = uid
    else:
        entry = pwd.getpwnam(name)
        uid, gid = entry.pw_uid, entry.pw_gid
    if group:
        gid = int(group)
    return uid, gid


def run_exec(
    request: dict[str, Any], env: dict[str, str], confinement: Confinement
) -> dict[str, Any]:
    reply: dict[str, Any] = {"id": request.get("id"), "timed_out": False}
    try:
        uid, gid = resolve_user(request.get("user"))
    except (KeyError, ValueError) as exc:
        return {**reply, "code": 126, "stdout": "", "stderr": _b64(f"unknown user: {exc}\n")}
    try:
        proc = confinement.spawn(request["argv"], env, "/", uid, gid)
    except OSError as exc:
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        return {**reply, "code": code, "stdout": "", "stderr": _b64(f"{exc}\n")}
    try:
        out, err = proc.communicate(timeout=request.get("timeout_s"))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        reply["timed_out"] = True
    reply.update(
        code=proc.returncode,
        stdout=base64.b64encode(out[:EXEC_OUTPUT_MAX]).decode(),
        stderr=base64.b64encode(err[:EXEC_OUTPUT_MAX]).decode(),
    )
    return reply


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def exec_server(path: str, env: dict[str, str], confinement: Confinement) -> None:
    """Commands from the host (``karotte.exec`` port), one at a time: a JSON line in, a JSON line
    out. Reads return nothing while no host end is connected, hence the short sleeps."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return
    buffer = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            buffer = b""  # a host end that left takes its half-sent request with it
            time.sleep(0.05)
            continue
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            try:
                request = json.loads(line)
            except ValueError:
                continue
            data = json.dumps(run_exec(request, env, confinement)).encode() + b"\n"
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(fd, view) :]
                except OSError:
                    break  # the host end is gone: it no longer waits for this answer


def pump(stream: IO[bytes], kind: str, channel: Channel) -> None:
    for line in iter(stream.readline, b""):
        channel.send(kind, line.rstrip(b"\n"))


def heartbeat(channel: Channel, interval: float) -> None:
    # real-time priority for this thread only: a fork bomb or a busy student must not starve
    # the heartbeat (the host's watchdog would take a slow guest for a hung one)
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(50))
    while True:
        channel.send("H", str(time.time()).encode())
        time.sleep(interval)


def control(path: str, proc: subprocess.Popen[bytes]) -> None:
    try:
        handle = open(path, "rb", buffering=0)  # noqa: SIM115 (lives as long as the VM)
    except OSError:
        return
    while True:
        line = handle.readline()
        if not line:
            time.sleep(0.2)
            continue
        command = line.strip()
        if command == b"TERM":
            proc.send_signal(signal.SIGTERM)
        elif command == b"KILL":
            proc.send_signal(signal.SIGKILL)


def write_out(mounts: list[dict[str, Any]], device: str) -> None:
    """The read-write mounts as one tar of regular files (``<index>/<path>``) on the out drive."""
    with (
        open(device, "wb") as raw,
        tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for index, entry in enumerate(mounts):
            if entry.get("read_only"):
                continue
            top = entry["target"]
            if os.path.isfile(top) and not os.path.islink(top):
                tar.add(top, arcname=str(index), recursive=False)
                continue
            for root, dirs, files in os.walk(top):
                dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
                for name in files:
                    path = os.path.join(root, name)
                    if os.path.islink(path) or not os.path.isfile(path):
                        continue
                    rel = os.path.relpath(path, top)
                    tar.add(path, arcname=f"{index}/{rel}", recursive=False)
        tar.close()
        raw.flush()
        os.fsync(raw.fileno())


def power_off() -> None:
    os.sync()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.reboot(RB_AUTOBOOT)
    time.sleep(1000)


def main() -> int:
    channel_path = find_port("karotte.events") or _cmdline_arg("karotte.channel") or "/dev/ttyS0"
    channel = Channel(channel_path)
    code = 255
    try:
        code = supervise(channel)
    except BaseException as exc:  # PID 1 must never die: report and power off
        channel.send("L", f"guest init failed: {type(exc).__name__}: {exc}".encode())
    channel.send("X", str(code).encode())
    power_off()
    return code


def supervise(channel: Channel) -> int:
    with open(os.path.join(IN_DIR, "vm.json")) as handle:
        config = json.load(handle)
    threading.Thread(
        target=heartbeat, args=(channel, float(config.get("heartbeat_s", 1.0))), daemon=True
    ).start()
    os.environ.clear()
    os.environ["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    run([BUSYBOX, "hostname", config.get("hostname", "karotte")])
    run([BUSYBOX, "ip", "link", "set", "lo", "up"])
    mount("tmpfs", "tmpfs", "/dev/shm", "mode=1777,size=" + str(config.get("shm_bytes", 64 << 20)))
    for target, size in config.get("tmpfs", {}).items():
        mount("tmpfs", "tmpfs", target, f"mode=1777,size={size}")
    mount("devpts", "devpts", "/dev/pts", "mode=0620,ptmxmode=0666")
    env = dict(config["env"])
    env.setdefault("PATH", os.environ["PATH"])
    env.setdefault("HOME", "/root")
    env.update(setup_cgroups(config.get("memory_bytes"), config.get("pids_limit"), channel))
    mounts: list[dict[str, Any]] = config.get("mounts", [])
    copy_mounts(mounts)
    start_socket_forwards(config, channel)
    confinement = Confinement(config.get("cap_keep") or [])
    exec_port = find_port("karotte.exec")
    if exec_port:
        threading.Thread(
            target=exec_server, args=(exec_port, env, confinement), daemon=True
        ).start()
    channel.send("L", b"guest ready")
    try:
        proc = confinement.spawn(config["command"], env, config.get("workdir") or "/")
    except OSError as exc:
        channel.send("E", f"cannot run {config['command'][0]}: {exc}".encode())
        return 127 if isinstance(exc, FileNotFoundError) else 126
    assert proc.stdout is not None and proc.stderr is not None
    pumps = [
        threading.Thread(target=pump, args=(proc.stdout, "O", channel), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, "E", channel), daemon=True),
    ]
    for thread in pumps:
        thread.start()
    ctl = find_port("karotte.ctl")
    if ctl:
        threading.Thread(target=control, args=(ctl, proc), daemon=True).start()
    code = None
    while code is None:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == proc.pid:
            code = os.waitstatus_to_exitcode(status)
            code = 128 - code if code < 0 else code
    for thread in pumps:
        thread.join(timeout=5)
    # nothing of the run survives it (the init itself is immune to kill -1)
    os.kill(-1, signal.SIGKILL)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            break
    with open("/run/karotte/out-device") as handle:
        device = handle.read().strip()
    if device:
        try:
            write_out(mounts, device)
        except OSError as exc:
            channel.send("L", f"writing /out back failed: {exc}".encode())
            return code if code else 1
    return code if code is not None else 255


if __name__ == "__main__":
    sys.exit(main())
