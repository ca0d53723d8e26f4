"""sanitize: student-writable search paths are stripped, with one re-exec; trusted binaries only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from karotte.sandbox.confinement.demote import Identity
from karotte.sandbox.confinement.sanitize import (
    UntrustedBinaryError,
    is_trusted_path,
    resolve_system_binary,
    sanitized_environment,
)


def test_trusted_system_dirs() -> None:
    assert is_trusted_path("/usr/bin")
    assert not is_trusted_path("/tmp")
    assert not is_trusted_path("relative/bin")
    assert not is_trusted_path("")


@pytest.mark.requires_root
def test_student_writable_entries_are_stripped(student: Identity, tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    owned = tmp_path / "student-bin"
    owned.mkdir()
    os.chown(owned, student.uid, student.gid)
    world = tmp_path / "world"
    world.mkdir()
    os.chmod(world, 0o777)
    inner = world / "inner"  # root-owned, but inside a world-writable dir
    inner.mkdir()
    link = tmp_path / "link-to-usr-bin"
    link.symlink_to("/usr/bin")
    os.chown(link, student.uid, student.gid, follow_symlinks=False)
    lib = owned / "evil.so"
    lib.write_text("")
    env = {
        "PATH": f"{owned}::relative:{world}:{inner}:{link}:/usr/bin:/bin:/usr/bin",
        "LD_LIBRARY_PATH": f"{owned}",
        "LD_PRELOAD": f"{lib}",
        "LD_AUDIT": f"{lib}",
        "PYTHONPATH": "/usr/lib",
        "PYTHONHOME": "/usr",
        "PYTHONSTARTUP": "/etc/passwd",
        "HOME": "/root",
    }
    clean = sanitized_environment(env)
    assert clean["PATH"] == "/usr/bin:/bin"
    for name in ("LD_LIBRARY_PATH", "LD_PRELOAD", "LD_AUDIT", "PYTHONPATH", "PYTHONHOME"):
        assert name not in clean
    assert "PYTHONSTARTUP" not in clean
    assert clean["HOME"] == "/root" and clean["PYTHONSAFEPATH"] == "1"


def test_reexec_happens_once_and_cleans_the_environment(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    evil = tmp_path / "evil"
    evil.mkdir()
    os.chmod(evil, 0o777)
    (evil / "sitecustomize.py").write_text("import os\nos.environ['PWNED'] = '1'\n")
    code = (
        "import os, sys\n"
        f"open({str(starts)!r}, 'a').write('x')\n"
        "from karotte.sandbox.confinement.sanitize import sanitize_and_reexec\n"
        "sanitize_and_reexec()\n"
        "print(os.environ['PATH']); print(os.environ.get('PYTHONPATH')); "
        "print('sitecustomize' in sys.modules and os.environ.get('PWNED'))\n"
    )
    env = {
        "PATH": f"{evil}:/usr/bin:/bin",
        "PYTHONPATH": f"{evil}:{Path(__file__).parents[2] / 'src'}",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[0] == "/usr/bin:/bin"
    assert lines[1] == "None"
    assert lines[2] in ("False", "None")  # the re-exec'd process did not import sitecustomize
    assert starts.read_text() == "xx"  # exactly one re-exec


def test_no_reexec_when_clean() -> None:
    env = sanitized_environment({"PATH": "/usr/bin:/bin"})
    code = (
        "from karotte.sandbox.confinement.sanitize import sanitize_and_reexec\n"
        "print(sanitize_and_reexec())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_resolve_system_binary() -> None:
    path = resolve_system_binary("sh")
    assert path in ("/usr/bin/sh", "/bin/sh")
    with pytest.raises(UntrustedBinaryError):
        resolve_system_binary("definitely-not-a-binary-karotte")
    with pytest.raises(UntrustedBinaryError):
        resolve_system_binary("../bin/sh")


@pytest.mark.requires_root
def test_a_binary_in_a_student_dir_is_never_resolved(student: Identity, tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    owned = tmp_path / "bin"
    owned.mkdir()
    fake = owned / "python3"
    fake.write_text("#!/bin/sh\necho fake\n")
    fake.chmod(0o755)
    os.chown(owned, student.uid, student.gid)
    with pytest.raises(UntrustedBinaryError):
        resolve_system_binary("python3", search=(str(owned),))
    assert resolve_system_binary("python3", search=(str(owned), "/usr/bin")) == "/usr/bin/python3"
