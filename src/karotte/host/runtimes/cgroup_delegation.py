"""The writable student cgroup the launcher hands to the harness (see CONTRACTS.md).

Per run, as host root: ``/sys/fs/cgroup/<ctrl>/karotte/<run-name>/`` for each v1 controller in
(memory, pids, cpu, freezer), the sandbox started with ``--cgroup-parent=/karotte/<run-name>`` so
its own cgroup sits below, and ``…/<run-name>/student/`` bind-mounted read-write at
``/run/karotte/cgroup/<ctrl>``. The sandbox's memory and pids limits are also written on the
run directory, so a process the harness moves into ``student`` (outside the container's own
cgroup) is still bound by them. On a cgroup v2 host it is one directory and
``/run/karotte/cgroup/unified``. When none of this is possible the launcher omits
``KAROTTE_CGROUP_ROOT`` and says why.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from karotte.host.runtimes.base import Mount

CGROUP_MOUNT = Path("/sys/fs/cgroup")
SANDBOX_CGROUP_ROOT = "/run/karotte/cgroup"
V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")
V2_CONTROLLERS = ("memory", "pids", "cpu")
KAROTTE_SUBDIR = "karotte"


class CgroupDelegation(BaseModel):
    """What was created for one run (and must be removed after it)."""

    model_config = ConfigDict(extra="forbid")

    version: str  # "v1" | "v2"
    run_dirs: list[Path]
    mounts: list[Mount]
    cgroup_parent: str


def host_cgroup_version(root: Path = CGROUP_MOUNT) -> str | None:
    if (root / "cgroup.controllers").exists():
        return "v2"
    if (root / "memory" / "tasks").exists():
        return "v1"
    return None


def _write(path: Path, value: str) -> None:
    with contextlib.suppress(OSError):
        path.write_text(value)


def _mkdir(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return True


def delegate(
    run_name: str,
    memory_bytes: int | None,
    pids_limit: int | None,
    root: Path = CGROUP_MOUNT,
) -> tuple[CgroupDelegation | None, str]:
    """Create the run's cgroup dirs. Returns ``(delegation or None, why)``."""
    if os.geteuid() != 0:
        return None, "the launcher is not root, so it cannot create cgroups"
    version = host_cgroup_version(root)
    if version == "v1":
        return _delegate_v1(run_name, memory_bytes, pids_limit, root)
    if version == "v2":
        return _delegate_v2(run_name, memory_bytes, pids_limit, root)
    return None, f"no cgroup filesystem at {root}"


def _delegate_v1(
    run_name: str, memory_bytes: int | None, pids_limit: int | None, root: Path
) -> tuple[CgroupDelegation | None, str]:
    missing = [c for c in V1_CONTROLLERS if not (root / c / "tasks").exists()]
    if missing:
        return None, f"cgroup v1 controllers not mounted: {', '.join(missing)}"
    run_dirs: list[Path] = []
    mounts: list[Mount] = []
    for controller in V1_CONTROLLERS:
        run_dir = root / controller / KAROTTE_SUBDIR / run_name
        if not _mkdir(run_dir / "student"):
            remove_dirs([*run_dirs, run_dir])
            return None, f"cannot create {run_dir}/student"
        run_dirs.append(run_dir)
        mounts.append(
            Mount(source=run_dir / "student", target=f"{SANDBOX_CGROUP_ROOT}/{controller}")
        )
    memory_dir = root / "memory" / KAROTTE_SUBDIR / run_name
    if memory_bytes is not None:
        _write(memory_dir / "memory.limit_in_bytes", str(memory_bytes))
        _write(memory_dir / "memory.memsw.limit_in_bytes", str(memory_bytes))
    if pids_limit is not None:
        _write(root / "pids" / KAROTTE_SUBDIR / run_name / "pids.max", str(pids_limit))
    delegation = CgroupDelegation(
        version="v1", run_dirs=run_dirs, mounts=mounts, cgroup_parent=f"/karotte/{run_name}"
    )
    return delegation, "cgroup v1: memory, pids, cpu, freezer"


def _delegate_v2(
    run_name: str, memory_bytes: int | None, pids_limit: int | None, root: Path
) -> tuple[CgroupDelegation | None, str]:
    # Untested on our cgroup-v1 machines; follows the kernel's delegation rules.
    parent = root / KAROTTE_SUBDIR
    run_dir = parent / run_name
    if not _mkdir(run_dir / "student"):
        return None, f"cannot create {run_dir}/student"
    enable = " ".join(f"+{c}" for c in V2_CONTROLLERS)
    for directory in (root, parent, run_dir):
        _write(directory / "cgroup.subtree_control", enable)
    if memory_bytes is not None:
        _write(run_dir / "memory.max", str(memory_bytes))
        _write(run_dir / "memory.swap.max", "0")
    if pids_limit is not None:
        _write(run_dir / "pids.max", str(pids_limit))
    mount = Mount(source=run_dir / "student", target=f"{SANDBOX_CGROUP_ROOT}/unified")
    delegation = CgroupDelegation(
        version="v2", run_dirs=[run_dir], mounts=[mount], cgroup_parent=f"/karotte/{run_name}"
    )
    return delegation, "cgroup v2"


def _rmdir_tree(path: Path) -> bool:
    """Remove a cgroup dir and its (empty) sub-cgroups, deepest first. cgroup dirs hold only
    kernel files, which rmdir ignores."""
    if not path.is_dir():
        return True
    ok = True
    for child in sorted((p for p in path.iterdir() if p.is_dir()), reverse=True):
        ok = _rmdir_tree(child) and ok
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return ok


def remove_dirs(run_dirs: list[Path], attempts: int = 20) -> list[Path]:
    """Remove run dirs; retries briefly while the sandbox's processes die. Returns leftovers."""
    left = list(run_dirs)
    for attempt in range(attempts):
        left = [d for d in left if not _rmdir_tree(d)]
        if not left:
            break
        time.sleep(0.05 * (attempt + 1))
    return left


def _karotte_bases(root: Path) -> list[Path]:
    """``karotte/`` in every mounted hierarchy: the engine creates ``--cgroup-parent`` in all of
    them (cpuset, blkio, devices …), not only in the controllers the harness gets."""
    bases = [root / KAROTTE_SUBDIR]
    with contextlib.suppress(OSError):
        bases += [h / KAROTTE_SUBDIR for h in sorted(root.iterdir()) if h.is_dir()]
    return [b for b in bases if b.is_dir()]


def run_dirs_everywhere(run_name: str, root: Path = CGROUP_MOUNT) -> list[Path]:
    """Every ``karotte/<run-name>`` dir of one run, in every hierarchy."""
    return [b / run_name for b in _karotte_bases(root) if (b / run_name).is_dir()]


def leftover_run_dirs(root: Path = CGROUP_MOUNT) -> dict[str, list[Path]]:
    """Every ``karotte/<run-name>`` dir on this host, by run name."""
    found: dict[str, list[Path]] = {}
    for base in _karotte_bases(root):
        for run_dir in base.iterdir():
            if run_dir.is_dir():
                found.setdefault(run_dir.name, []).append(run_dir)
    return found
