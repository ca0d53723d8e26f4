"""karotte check --image: permission model as the real student, file-system scan, leaked secrets."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from karotte.sandbox.image_check import (
    ImageLayout,
    StudentIds,
    check_environment,
    check_image,
    probe_as_student,
    scan_filesystem,
)

FIXTURE_ENV = Path(__file__).parent / "fixtures" / "envs" / "basic"


def _tree(root: Path, files: dict[str, str], mode: int = 0o644) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)


def _problems(findings: list) -> dict[str, str]:
    return {f.path: f.problem for f in findings}


def test_world_writable_entries(tmp_path: Path) -> None:
    _tree(tmp_path, {"etc/ok.conf": "x", "opt/app/open.txt": "x", "tmp/scratch": "x"})
    (tmp_path / "opt/app/open.txt").chmod(0o666)
    (tmp_path / "opt/app").chmod(0o777)
    (tmp_path / "tmp").chmod(0o1777)
    os.symlink("/etc/passwd", tmp_path / "etc/link")  # symlinks are always 0777: not a finding
    problems = _problems(scan_filesystem(ImageLayout(root=tmp_path), None))
    assert problems == {
        "/opt/app/open.txt": "world-writable file",
        "/opt/app": "world-writable directory without the sticky bit",
    }


def test_student_ownership_outside_writable_places(tmp_path: Path) -> None:
    me = StudentIds(uid=os.getuid(), gid=os.getgid(), groups=[os.getgid()])
    _tree(tmp_path, {"workdir/data/a.txt": "x", "workdir/shared/s.txt": "x", "etc/x.conf": "x"})
    # everything here belongs to the user running the test: as if it were the student's
    problems = _problems(scan_filesystem(ImageLayout(root=tmp_path), me))
    assert "/etc/x.conf" in problems and "/etc" in problems
    assert "/workdir/shared/s.txt" in problems and "/workdir/shared" in problems
    assert "/workdir/data/a.txt" not in problems and "/workdir/data" not in problems
    assert "owned by the student" in problems["/etc/x.conf"]


@pytest.mark.parametrize(
    ("rel", "text"),
    [
        ("root/.netrc", "machine example.com login me password hunter2\n"),
        ("workdir/.aws/credentials", "[default]\naws_secret_access_key = abc\n"),
        ("root/.kube/config", "apiVersion: v1\n"),
        ("root/.cache/huggingface/token", "hf_abc\n"),
        ("home/dev/.ssh/id_ed25519", "whatever\n"),
        ("opt/deploy/key", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n"),
        ("etc/pip.conf", "[global]\nindex-url = https://user:s3cret@pypi.example.com/simple\n"),
        ("root/.config/uv/uv.toml", '[[index]]\nurl = "https://tok:x@example.com/simple"\n'),
        ("root/.npmrc", "//registry.npmjs.org/:_authToken=npm_abc\n"),
        ("root/.git-credentials", "https://me:ghp_abc@github.com\n"),
    ],
)
def test_leaked_credentials_are_found(tmp_path: Path, rel: str, text: str) -> None:
    _tree(tmp_path, {rel: text, "etc/clean.conf": "nothing\n"})
    findings = scan_filesystem(ImageLayout(root=tmp_path), None)
    assert [f.path for f in findings] == ["/" + rel]
    assert findings[0].problem.startswith("leaked credentials")
    assert "remove" in findings[0].fix


def test_clean_configs_and_machine_keys_are_not_findings(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "etc/pip.conf": "[global]\nindex-url = https://pypi.org/simple\n",
            "root/.npmrc": "registry=https://registry.npmjs.org/\n",
            "etc/ssh/ssh_host_ed25519_key": "-----BEGIN OPENSSH PRIVATE KEY-----\n",
            "root/.venv/lib/python3.11/site-packages/pkg/tests/test.key": (
                "-----BEGIN RSA PRIVATE KEY-----\n"
            ),
            "home/dev/.ssh/id_ed25519.pub": "ssh-ed25519 AAAA\n",
        },
    )
    assert scan_filesystem(ImageLayout(root=tmp_path), None) == []


def test_secret_environment_variables() -> None:
    findings = check_environment(
        {
            "PATH": "/usr/bin",
            "HF_TOKEN": "hf_abcdefghijkl",
            "OPENAI_API_KEY": "sk-proj-0123456789",
            "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG",
            "GITHUB_TOKEN": "",
            "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
            "GOOGLE_APPLICATION_CREDENTIALS": "/secrets/gcp.json",
            "NPM_TOKEN_FILE": "run-secrets-npm-token",
            "GPG_KEY": "A035C8C19219BA821ECEA86B64E628F8D684696D",
        }
    )
    assert [f.path for f in findings] == ["$AWS_SECRET_ACCESS_KEY", "$HF_TOKEN", "$OPENAI_API_KEY"]
    assert "sk-proj" not in str(findings)  # values are never printed


# ---- as root, with a real throwaway student -------------------------------------------------


@pytest.fixture
def throwaway_user() -> Iterator[str]:
    name = f"kprobe{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["useradd", "--user-group", "--no-create-home", "--shell", "/bin/false", name],
        check=True,
        capture_output=True,
    )
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)
        subprocess.run(["groupdel", name], check=False, capture_output=True)


def _image_tree(student: str) -> Path:
    """A tree laid out like the default Containerfile makes it, in a traversable temp dir."""
    root = Path(tempfile.mkdtemp(prefix="karotte-image-"))
    root.chmod(0o755)
    entry = pwd.getpwnam(student)
    _tree(root, {"root_data/example/expected.txt": "23\n", "intermediate_data/x.bin": "x"})
    _tree(root, {"workdir/shared/example/numbers.txt": "1\n2\n", "workdir/data/draft.txt": "d"})
    _tree(root, {"root/.venv/lib/site.py": "secret task code\n", "tmp/.keep": ""})
    os.chmod(root / "root", 0o700)
    for top in ("root_data", "intermediate_data"):
        subprocess.run(["chmod", "-R", "go-rwx", str(root / top)], check=True)
    subprocess.run(["chmod", "-R", "u+rwX,go+rX,go-w", str(root / "workdir/shared")], check=True)
    os.chown(root / "workdir", 0, entry.pw_gid)
    os.chmod(root / "workdir", 0o1775)
    for path in [root / "workdir/data", *(root / "workdir/data").rglob("*")]:
        os.chown(path, entry.pw_uid, entry.pw_gid)
    os.chmod(root / "tmp", 0o1777)
    return root


@pytest.mark.requires_root
def test_correct_image_passes_as_the_student(throwaway_user: str) -> None:
    root = _image_tree(throwaway_user)
    try:
        layout = ImageLayout(root=root, student=throwaway_user, expected_uid=None)
        assert check_image(layout, env={}) == []
    finally:
        shutil.rmtree(root)


@pytest.mark.requires_root
def test_broken_permission_model_is_caught_as_the_student(throwaway_user: str) -> None:
    root = _image_tree(throwaway_user)
    entry = pwd.getpwnam(throwaway_user)
    try:
        # answers readable, shared data writable, the home owned by the student (so it could
        # rename shared data away), the student's data not writable by it
        os.chmod(root / "root_data", 0o755)
        os.chmod(root / "root_data/example", 0o755)
        os.chmod(root / "root_data/example/expected.txt", 0o644)
        os.chmod(root / "workdir/shared/example", 0o777)
        os.chown(root / "workdir", entry.pw_uid, entry.pw_gid)
        os.chmod(root / "workdir", 0o755)
        os.chown(root / "workdir/data", 0, 0)
        os.chmod(root / "workdir/data", 0o755)
        layout = ImageLayout(root=root, student=throwaway_user, expected_uid=None)
        findings = probe_as_student(layout, StudentIds(entry.pw_uid, entry.pw_gid, [entry.pw_gid]))
        problems = _problems(findings)
        assert problems["/root_data"].startswith("the student can list this root-only directory")
        assert problems["/root_data/example/expected.txt"] == (
            "the student can read this root-only file"
        )
        assert problems["/workdir/shared/example"] == (
            "the student can create files in shared data"
        )
        assert problems["/workdir/shared"] == (
            "the student can rename shared data away (and put its own in its place)"
        )
        assert problems["/workdir/data"] == "the student cannot write its data directory"
        assert all(not f.fix.startswith(str(root)) for f in findings)
        # nothing was left behind by the probes
        assert sorted(p.name for p in (root / "workdir/shared").iterdir()) == ["example"]
        # the CLI lists them and exits 1
        env = {k: v for k, v in os.environ.items() if not check_environment({k: v})}
        env["PYTHONPATH"] = str(FIXTURE_ENV)
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                "from karotte.cli import main; main()",
                "check",
                "--image",
                "--root",
                str(root),
                "--student",
                throwaway_user,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert proc.returncode == 1, proc.stderr
        assert "can read this root-only file" in proc.stderr
        assert "/root_data/example/expected.txt" in proc.stderr
    finally:
        shutil.rmtree(root)
