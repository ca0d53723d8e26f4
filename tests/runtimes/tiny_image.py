"""A tiny image made from this host's own binaries (no registry, no mmdebstrap): sh, coreutils
and their libraries, plus a ``student`` user (uid 1000). Imported once per test session."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

BINARIES = ["sh", "cat", "echo", "id", "sleep", "true", "env", "ls", "head", "printf", "kill"]
PASSWD = "root:x:0:0:root:/root:/bin/sh\nstudent:x:1000:1000:student:/home/student:/bin/sh\n"
GROUP = "root:x:0:\nstudent:x:1000:\n"


def _libraries(binary: str) -> set[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False).stdout
    libs = set(re.findall(r"(/\S+\.so[\w.\-]*)", out))
    return {lib for lib in libs if Path(lib).exists()}


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755, uid: int = 0) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    info.uid = info.gid = uid
    tar.addfile(info)


def make_rootfs_tar(path: Path) -> Path:
    files: dict[str, str] = {}  # path in image -> host path
    for name in BINARIES:
        found = shutil.which(name) or shutil.which(name, path="/bin:/usr/bin")
        if found is None:
            continue
        real = str(Path(found).resolve())
        files[f"bin/{name}"] = real
        for lib in _libraries(real):
            files[lib.lstrip("/")] = str(Path(lib).resolve())
    with tarfile.open(path, "w") as tar:
        for directory in [
            "bin",
            "etc",
            "tmp",
            "out",
            "root",
            "home",
            "lib",
            "lib64",
            "usr",
            "proc",
            "sys",
            "dev",
            "run",
        ]:
            _add_dir(tar, directory, 0o1777 if directory == "tmp" else 0o755)
        _add_dir(tar, "home/student", 0o755, uid=1000)
        added_dirs = {"bin", "etc", "lib", "lib64", "usr"}
        for target, source in sorted(files.items()):
            parent = str(Path(target).parent)
            parts = Path(parent).parts
            for i in range(1, len(parts) + 1):
                sub = "/".join(parts[:i])
                if sub not in added_dirs:
                    _add_dir(tar, sub)
                    added_dirs.add(sub)
            _add_bytes(tar, target, Path(source).read_bytes(), 0o755)
        _add_bytes(tar, "etc/passwd", PASSWD.encode())
        _add_bytes(tar, "etc/group", GROUP.encode())
    return path
