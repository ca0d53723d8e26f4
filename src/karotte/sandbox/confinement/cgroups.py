"""The student's cgroup: cgroup v1 (one directory per controller) or v2 (one directory).

Where it comes from, first match wins:

1. ``KAROTTE_CGROUP_ROOT`` (set by the launcher, see CONTRACTS.md): ``<root>/unified`` (v2) or
   ``<root>/<controller>`` (v1) are the student's own cgroup, prepared and removed by the launcher.
2. A pure cgroup v2 host/sandbox whose own cgroup is writable (delegated): the harness moves its
   own processes into a ``karotte-harness`` leaf and creates ``karotte-student-<name>`` beside it.
3. cgroup v1 controllers that are writable (root on a v1 host): ``karotte-student-<name>`` below
   the harness's own cgroup of each controller, so every limit above still applies.

Otherwise there is no cgroup and limits fall back to rlimits and the watchdog (see ``limits``).

A controller can exist and accept a limit without enforcing it: gVisor (2024 builds) emulates a
cgroup v1 ``memory`` controller whose ``memory.limit_in_bytes`` is stored but never enforced
(``karotte check confinement`` measured a 256 MiB hog surviving a 64 MiB limit), while its
``pids.max`` is enforced. :func:`unenforced_controllers` names such controllers; their limits are
left to the watchdog.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Literal

CGROUP_MOUNT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids", "freezer", "cpu")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,100}$")


# /proc/version of every gVisor kernel (its fixed, fake Linux 4.4.0 build line)
GVISOR_PROC_VERSION = "Linux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016"


def running_under_gvisor() -> bool:
    if os.environ.get("KAROTTE_SANDBOX") == "gvisor":
        return True
    try:
        return Path("/proc/version").read_text().startswith(GVISOR_PROC_VERSION)
    except OSError:
        return False


def unenforced_controllers() -> dict[str, str]:
    """Controllers here that take a limit without enforcing it, each with the reason."""
    if running_under_gvisor():
        return {"memory": "gVisor's memory cgroup stores limits without enforcing them"}
    return {}


class CgroupError(OSError):
    """A cgroup could not be created or configured."""


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: Path) -> str:
    with open(path, encoding="ascii") as handle:
        return handle.read()


def _read_pids(path: Path) -> list[int]:
    try:
        return [int(line) for line in _read(path).split()]
    except OSError:
        return []


class StudentCgroup(ABC):
    """One cgroup holding every student process."""

    version: Literal["v1", "v2"]
    created: bool  # we made it (and remove it); False when the launcher owns it

    @abstractmethod
    def controllers(self) -> set[str]: ...

    @abstractmethod
    def describe(self) -> str: ...

    @abstractmethod
    def set_memory(self, limit_bytes: int) -> list[str]:
        """Limit memory (RAM + page cache + tmpfs + SysV shm) and forbid swap; return knobs set."""

    @abstractmethod
    def set_pids(self, limit: int) -> list[str]: ...

    @abstractmethod
    def set_cpu(self, cores: float) -> list[str]: ...

    @abstractmethod
    def add_pid(self, pid: int) -> None:
        """Move ``pid`` (0 = the calling process) into the cgroup in every controller."""

    @abstractmethod
    def pids(self) -> list[int]: ...

    @abstractmethod
    def kill_all(self) -> None:
        """Freeze, SIGKILL every member, thaw: nothing can fork out of the way meanwhile."""

    @abstractmethod
    def oom_kills(self) -> int: ...

    @abstractmethod
    def _dirs(self) -> list[Path]: ...

    @abstractmethod
    def reset_limits(self) -> None:
        """Lift the limits we set (for a launcher-owned cgroup that outlives us)."""

    def remove(self, timeout_s: float = 5.0) -> None:
        """Kill the members and remove the directories we created."""
        deadline = time.monotonic() + timeout_s
        while self.pids() and time.monotonic() < deadline:
            self.kill_all()
            time.sleep(0.02)
        if not self.created:
            with contextlib.suppress(OSError):
                self.reset_limits()
            return
        for path in reversed(self._dirs()):
            while True:
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)


class CgroupV1(StudentCgroup):
    version: Literal["v1", "v2"] = "v1"

    def __init__(self, dirs: dict[str, Path], created: bool) -> None:
        self.dirs = dirs
        self.created = created

    def controllers(self) -> set[str]:
        return set(self.dirs)

    def describe(self) -> str:
        return ", ".join(f"{name}:{path}" for name, path in sorted(self.dirs.items()))

    def _dirs(self) -> list[Path]:
        return list(self.dirs.values())

    def set_memory(self, limit_bytes: int) -> list[str]:
        path = self.dirs.get("memory")
        if path is None:
            return []
        knobs = []
        with contextlib.suppress(OSError):
            _write(path / "memory.swappiness", "0")
            knobs.append("memory.swappiness=0")
        # memsw must stay >= the memory limit: lower memsw last, raise it first
        memsw = path / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            try:
                _write(path / "memory.limit_in_bytes", str(limit_bytes))
                _write(memsw, str(limit_bytes))
            except OSError:
                _write(memsw, str(limit_bytes))
                _write(path / "memory.limit_in_bytes", str(limit_bytes))
            knobs += ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]
        else:
            _write(path / "memory.limit_in_bytes", str(limit_bytes))
            knobs.append("memory.limit_in_bytes")
        return knobs

    def reset_limits(self) -> None:
        memory = self.dirs.get("memory")
        if memory is not None:
            memsw = memory / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                _write(memsw, "-1")  # raise memsw first: it must stay >= the memory limit
            _write(memory / "memory.limit_in_bytes", "-1")
        if "pids" in self.dirs:
            _write(self.dirs["pids"] / "pids.max", "max")
        if "cpu" in self.dirs:
            _write(self.dirs["cpu"] / "cpu.cfs_quota_us", "-1")

    def set_pids(self, limit: int) -> list[str]:
        path = self.dirs.get("pids")
        if path is None:
            return []
        _write(path / "pids.max", str(limit))
        return ["pids.max"]

    def set_cpu(self, cores: float) -> list[str]:
        path = self.dirs.get("cpu")
        if path is None:
            return []
        _write(path / "cpu.cfs_period_us", "100000")
        _write(path / "cpu.cfs_quota_us", str(max(1000, int(cores * 100000))))
        return ["cpu.cfs_quota_us"]

    def add_pid(self, pid: int) -> None:
        for path in self.dirs.values():
            _write(path / "cgroup.procs", str(pid or os.getpid()))

    def pids(self) -> list[int]:
        found: set[int] = set()
        for path in self.dirs.values():
            found.update(_read_pids(path / "cgroup.procs"))
        return sorted(found)

    def kill_all(self) -> None:
        freezer = self.dirs.get("freezer")
        frozen = False
        if freezer is not None:
            try:
                _write(freezer / "freezer.state", "FROZEN")
                frozen = True
                deadline = time.monotonic() + 1.0
                while _read(freezer / "freezer.state").strip() != "FROZEN":
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.002)
            except OSError:
                frozen = False
        try:
            for _ in range(3):
                members = self.pids()
                if not members:
                    break
                for pid in members:
                    with contextlib.suppress(OSError):
                        os.kill(pid, 9)
        finally:
            if frozen and freezer is not None:
                _write(freezer / "freezer.state", "THAWED")

    def oom_kills(self) -> int:
        path = self.dirs.get("memory")
        if path is None:
            return 0
        try:
            for line in _read(path / "memory.oom_control").splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        except OSError:
            pass
        return 0

    def memory_failcnt(self) -> int:
        path = self.dirs.get("memory")
        try:
            return int(_read(path / "memory.failcnt")) if path else 0
        except OSError:
            return 0


class CgroupV2(StudentCgroup):
    version: Literal["v1", "v2"] = "v2"

    def __init__(self, path: Path, created: bool) -> None:
        self.path = path
        self.created = created

    def controllers(self) -> set[str]:
        try:
            names = set(_read(self.path / "cgroup.controllers").split())
        except OSError:
            names = set()
        if (self.path / "cgroup.freeze").exists():
            names.add("freezer")
        return names

    def describe(self) -> str:
        return str(self.path)

    def _dirs(self) -> list[Path]:
        return [self.path]

    def set_memory(self, limit_bytes: int) -> list[str]:
        _write(self.path / "memory.max", str(limit_bytes))
        knobs = ["memory.max"]
        if (self.path / "memory.swap.max").exists():
            _write(self.path / "memory.swap.max", "0")
            knobs.append("memory.swap.max=0")
        return knobs

    def reset_limits(self) -> None:
        for knob, value in (("memory.max", "max"), ("memory.swap.max", "max"), ("pids.max", "max")):
            if (self.path / knob).exists():
                _write(self.path / knob, value)
        if (self.path / "cpu.max").exists():
            _write(self.path / "cpu.max", "max 100000")

    def set_pids(self, limit: int) -> list[str]:
        _write(self.path / "pids.max", str(limit))
        return ["pids.max"]

    def set_cpu(self, cores: float) -> list[str]:
        _write(self.path / "cpu.max", f"{max(1000, int(cores * 100000))} 100000")
        return ["cpu.max"]

    def add_pid(self, pid: int) -> None:
        _write(self.path / "cgroup.procs", str(pid or os.getpid()))

    def pids(self) -> list[int]:
        return _read_pids(self.path / "cgroup.procs")

    def kill_all(self) -> None:
        kill_file = self.path / "cgroup.kill"
        if kill_file.exists():
            _write(kill_file, "1")
            return
        freeze = self.path / "cgroup.freeze"
        frozen = False
        with contextlib.suppress(OSError):
            _write(freeze, "1")
            frozen = True
        try:
            for pid in self.pids():
                with contextlib.suppress(OSError):
                    os.kill(pid, 9)
        finally:
            if frozen:
                _write(freeze, "0")

    def oom_kills(self) -> int:
        try:
            for line in _read(self.path / "memory.events").splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        except OSError:
            pass
        return 0


def _own_cgroup_paths() -> dict[str, str]:
    """Controller (or "" for v2) → the path of this process's cgroup, from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    return paths


def _v1_base(controller: str, own: dict[str, str]) -> Path | None:
    mount = CGROUP_MOUNT / controller
    if not (mount / "cgroup.procs").exists() or (mount / "cgroup.controllers").exists():
        return None
    relative = own.get(controller, "/").lstrip("/")
    base = mount / relative
    # inside a container the mount shows the container's own cgroup as its root
    return base if base.is_dir() else mount


def from_env(root: str) -> StudentCgroup:
    """The launcher-provided student cgroup under ``KAROTTE_CGROUP_ROOT``."""
    base = Path(root)
    if (base / "unified" / "cgroup.procs").exists():
        return CgroupV2(base / "unified", created=False)
    dirs = {name: base / name for name in V1_CONTROLLERS if (base / name / "cgroup.procs").exists()}
    if not dirs:
        raise CgroupError(f"KAROTTE_CGROUP_ROOT={root} holds no usable cgroup directory")
    return CgroupV1(dirs, created=False)


def _create_v2(name: str) -> CgroupV2 | None:
    if not (CGROUP_MOUNT / "cgroup.controllers").exists():
        return None
    own = CGROUP_MOUNT / _own_cgroup_paths().get("", "/").lstrip("/")
    if not os.access(own, os.W_OK):
        return None
    # "no internal processes": the harness moves into a leaf before its parent delegates
    harness = own / "karotte-harness"
    harness.mkdir(exist_ok=True)
    for pid in _read_pids(own / "cgroup.procs"):
        with contextlib.suppress(OSError):
            _write(harness / "cgroup.procs", str(pid))
    available = set(_read(own / "cgroup.controllers").split())
    wanted = [c for c in ("memory", "pids", "cpu") if c in available]
    if wanted:
        _write(own / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
    student = own / f"karotte-student-{name}"
    student.mkdir(exist_ok=True)
    return CgroupV2(student, created=True)


def _create_v1(name: str) -> CgroupV1 | None:
    own = _own_cgroup_paths()
    dirs: dict[str, Path] = {}
    try:
        for controller in V1_CONTROLLERS:
            base = _v1_base(controller, own)
            if base is None or not os.access(base, os.W_OK):
                continue
            path = base / f"karotte-student-{name}"
            with contextlib.suppress(FileExistsError):
                path.mkdir()
            dirs[controller] = path
    except OSError:
        for path in dirs.values():
            with contextlib.suppress(OSError):
                path.rmdir()
        return None
    if "memory" not in dirs and "pids" not in dirs:
        for path in dirs.values():
            with contextlib.suppress(OSError):
                path.rmdir()
        return None
    return CgroupV1(dirs, created=True)


def open_student_cgroup(name: str) -> tuple[StudentCgroup | None, str]:
    """The student's cgroup and how it was obtained, or ``(None, why not)``."""
    if not _NAME.match(name):
        raise ValueError(f"bad cgroup name {name!r}")
    root = os.environ.get("KAROTTE_CGROUP_ROOT")
    if root:
        try:
            return from_env(root), f"launcher-provided ({root})"
        except OSError as exc:
            return None, f"KAROTTE_CGROUP_ROOT unusable: {exc}"
    try:
        v2 = _create_v2(name)
        if v2 is not None:
            return v2, "created under the harness's delegated cgroup v2"
    except OSError as exc:
        v2_error = f"cgroup v2 not writable: {exc}"
    else:
        v2_error = "no writable cgroup v2"
    try:
        v1 = _create_v1(name)
    except OSError as exc:
        return None, f"{v2_error}; cgroup v1 not writable: {exc}"
    if v1 is not None:
        return v1, "created in the cgroup v1 hierarchy"
    return None, f"{v2_error}; no writable cgroup v1 memory/pids controller"
