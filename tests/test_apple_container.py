"""apple-container against a fake ``container`` executable (no Mac here): the fake records every
argv (and the environment the secret values travel in) and plays canned answers."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from karotte.errors import RuntimeUnavailableError
from karotte.host.runtimes import Mount, SandboxSpec, get_runtime, runtime_names
from karotte.host.runtimes.apple_container import (
    START_FIX,
    AppleContainerRuntime,
    copy_in,
    copy_out,
)
from karotte.host.runtimes.base import Sandbox
from karotte.host.runtimes.oci_cli import BuildError

FAKE = r"""#!{python}
import json, os, sys
argv = sys.argv[1:]
record = {"argv": argv, "secret": os.environ.get("KAROTTE_TEST_SECRET")}
if argv[:1] == ["build"] and "-f" in argv:
    record["containerfile"] = open(argv[argv.index("-f") + 1]).read()
    record["context_files"] = sorted(os.listdir(argv[-1]))
with open(os.environ["FAKE_CONTAINER_LOG"], "a") as log:
    log.write(json.dumps(record) + "\n")
rules = json.load(open(os.environ["FAKE_CONTAINER_ANSWERS"]))
for rule in rules:
    if argv[: len(rule["prefix"])] == rule["prefix"]:
        sys.stdout.write(rule.get("stdout", ""))
        sys.stderr.write(rule.get("stderr", ""))
        sys.exit(rule.get("rc", 0))
sys.exit(0)
"""


class Fake:
    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bin = root / "bin"
        self.bin.mkdir()
        exe = self.bin / "container"
        exe.write_text(FAKE.replace("{python}", sys.executable))
        exe.chmod(0o755)
        self.log = root / "calls.jsonl"
        self.answers = root / "answers.json"
        self.answer([])
        monkeypatch.setenv("PATH", f"{self.bin}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("FAKE_CONTAINER_LOG", str(self.log))
        monkeypatch.setenv("FAKE_CONTAINER_ANSWERS", str(self.answers))
        monkeypatch.setenv("XDG_CACHE_HOME", str(root / "cache"))

    def answer(self, rules: list[dict[str, Any]]) -> None:
        self.answers.write_text(json.dumps(rules))

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def argvs(self) -> list[list[str]]:
        return [call["argv"] for call in self.calls()]


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fake:
    return Fake(tmp_path, monkeypatch)


GOOD = [
    {"prefix": ["--version"], "stdout": "container CLI version 0.6.0 (build: release)\n"},
    {"prefix": ["system", "status"], "stdout": "apiserver is running\n"},
]


def runtime() -> AppleContainerRuntime:
    return AppleContainerRuntime(check_platform=False)


def test_registered_and_honest_on_linux() -> None:
    assert "apple-container" in runtime_names()
    started = time.monotonic()
    availability = get_runtime("apple-container").availability()
    assert time.monotonic() - started < 0.5
    if sys.platform != "darwin":
        assert not availability.ok
        assert "macOS 26+ on Apple silicon" in availability.reason
        assert "docker" in availability.fix


def test_availability_version_and_services(fake: Fake) -> None:
    fake.answer([{"prefix": ["--version"], "stdout": "container CLI version 0.4.1\n"}])
    result = runtime().availability()
    assert not result.ok and "0.4.1 is too old" in result.reason
    fake.answer(
        [
            GOOD[0],
            {"prefix": ["system", "status"], "stderr": "apiserver is not running\n", "rc": 1},
        ]
    )
    result = runtime().availability()
    assert not result.ok and "not running" in result.reason
    assert result.fix == START_FIX and "container system start" in result.fix
    fake.answer(GOOD)
    assert runtime().availability().ok
    assert fake.argvs()[-2:] == [["--version"], ["system", "status"]]


def test_not_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    result = runtime().availability()
    assert not result.ok and "not installed" in result.reason and "releases" in result.fix


def test_build_arguments(fake: Fake, tmp_path: Path) -> None:
    context = tmp_path / "ctx"
    context.mkdir()
    containerfile = context / "Containerfile"
    containerfile.write_text("FROM scratch\n")
    fake.answer([{"prefix": ["image", "inspect"], "stdout": '[{"digest": "sha256:abc"}]'}])
    lines: list[str] = []
    image = runtime().build(context, containerfile, "t:1", {"B": "2", "A": "1"}, lines.append)
    assert image == "sha256:abc"
    assert fake.argvs()[0] == [
        "build", "--progress", "plain", "-f", str(containerfile), "-t", "t:1",
        "--build-arg", "A=1", "--build-arg", "B=2", str(context),
    ]  # fmt: skip


def test_symlinked_build_context_is_refused(fake: Fake, tmp_path: Path) -> None:
    real = tmp_path / "private" / "ctx"
    real.mkdir(parents=True)
    (real / "Containerfile").write_text("FROM scratch\n")
    link = tmp_path / "tmp"
    link.symlink_to(tmp_path / "private")
    with pytest.raises(BuildError, match="symlinked path") as info:
        runtime().build(link / "ctx", link / "ctx" / "Containerfile", "t:1", {})
    assert str(real) in str(info.value)
    assert fake.calls() == []  # refused before the CLI ran


def test_import_rootfs_builds_from_scratch(fake: Fake, tmp_path: Path) -> None:
    tarball = tmp_path / "rootfs.tar"
    tarball.write_bytes(b"tar")
    fake.answer([{"prefix": ["image", "inspect"], "stdout": '[{"id": "img-1"}]'}])
    assert runtime().import_rootfs(tarball, "karotte/base:x") == "img-1"
    build = fake.calls()[0]
    assert build["argv"][:2] == ["build", "--progress"] and build["argv"][-2] == "karotte/base:x"
    assert build["containerfile"] == "FROM scratch\nADD rootfs.tar /\n"
    assert build["context_files"] == ["Containerfile", "rootfs.tar"]


def _spec(tmp_path: Path) -> tuple[SandboxSpec, Path, Path]:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "task.txt").write_text("read me")
    (inputs / "hostlink").symlink_to("/etc/passwd")
    out = tmp_path / "out"
    out.mkdir()
    spec = SandboxSpec(
        image="karotte-env/x:latest",
        name="kt-apple-1",
        command=["/root/.venv/bin/karotte", "run", "--events", "jsonl"],
        labels={"dev.karotte.run-id": "r1"},
        env={"KAROTTE_TEST_SECRET": "s3cret-value", "KAROTTE_SANDBOX": "apple-container"},
        mounts=[
            Mount(source=inputs, target="/inputs", read_only=True),
            Mount(source=out, target="/out"),
        ],
        memory_bytes=256 << 20,
        cpus=1.6,
        cap_add=["SETUID"],
        devices=["/dev/fuse"],
        init=True,
        tmpfs={"/tmp": 1 << 20},
        cgroup_parent="/karotte/x",
        workdir="/root",
    )
    return spec, inputs, out


def test_start_arguments_env_and_staged_mounts(fake: Fake, tmp_path: Path) -> None:
    spec, inputs, _ = _spec(tmp_path)
    fake.answer([{"prefix": ["run"], "stdout": "kt-apple-1\n"}])
    engine = runtime()
    sandbox = engine.start(spec)
    assert sandbox.id == "kt-apple-1"
    call = fake.calls()[0]
    argv = call["argv"]
    stage = engine._state_dir(spec.name) / "mounts"
    assert argv == [
        "run", "--detach", "--name", "kt-apple-1", "--no-dns",
        "--label", "dev.karotte.run-id=r1",
        "--env", "KAROTTE_SANDBOX", "--env", "KAROTTE_TEST_SECRET",
        "--mount", f"type=bind,source={stage / '0'},target=/inputs,readonly",
        "--mount", f"type=bind,source={stage / '1'},target=/out",
        "--memory", "256M", "--cpus", "2", "--tmpfs", "/tmp", "--workdir", "/root",
        "karotte-env/x:latest", "/root/.venv/bin/karotte", "run", "--events", "jsonl",
    ]  # fmt: skip
    assert "s3cret-value" not in " ".join(argv) and call["secret"] == "s3cret-value"
    assert not any(a.startswith(("--cap", "--device", "--privileged", "--init")) for a in argv)
    # read-only inputs were copied in: the VM sees the copy, never the host's links
    assert (stage / "0" / "task.txt").read_text() == "read me"
    assert not (stage / "0" / "hostlink").exists() and not (stage / "0" / "hostlink").is_symlink()
    assert (inputs / "hostlink").is_symlink()


def test_wait_copies_writable_mounts_back_without_links(fake: Fake, tmp_path: Path) -> None:
    spec, _, out = _spec(tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_text("untouched")
    (out / "victim").symlink_to(outside)  # a link on the host side of /out
    fake.answer([{"prefix": ["run"], "stdout": "kt-apple-1\n"}])
    engine = runtime()
    sandbox = engine.start(spec)
    stage = engine._state_dir(spec.name) / "mounts" / "1"
    # what the guest wrote into /out
    (stage / "transcript.json").write_text('{"ok": true}')
    (stage / "sub").mkdir()
    (stage / "sub" / "nested.txt").write_text("nested")
    (stage / "escape").symlink_to("/etc/shadow")
    (stage / "victim").write_text("overwrite through the link")
    fake.answer(
        [
            {"prefix": ["inspect"], "stdout": '[{"status": "stopped", "exitCode": 3}]'},
            {"prefix": ["delete"], "stderr": "container kt-apple-1 not found\n", "rc": 1},
        ]
    )
    assert engine.wait(sandbox, timeout_s=5) == 3
    assert (out / "transcript.json").read_text() == '{"ok": true}'
    assert (out / "sub" / "nested.txt").read_text() == "nested"
    assert not (out / "escape").exists() and not (out / "escape").is_symlink()
    assert outside.read_text() == "untouched" and (out / "victim").is_symlink()
    engine.remove(sandbox)  # "not found" is fine: remove is idempotent
    assert ["delete", "--force", "kt-apple-1"] in fake.argvs()
    assert not engine._state_dir(spec.name).exists()


def test_wait_times_out_while_running(fake: Fake) -> None:
    fake.answer([{"prefix": ["inspect"], "stdout": '[{"status": "running"}]'}])
    sandbox = Sandbox(id="kt-x", name="kt-x", runtime="apple-container")
    with pytest.raises(TimeoutError):
        runtime().wait(sandbox, timeout_s=0.5)
    assert all(argv == ["inspect", "kt-x"] for argv in fake.argvs())


def test_list_sandboxes_filters_labels(fake: Fake) -> None:
    listing = [
        {"status": "running", "configuration": {"id": "a", "labels": {"dev.karotte.run-id": "r1"}}},
        {"status": "stopped", "configuration": {"id": "b", "labels": {"dev.karotte.run-id": "r2"}}},
        {"status": "stopped", "configuration": {"id": "c", "labels": {}}},
    ]
    fake.answer([{"prefix": ["list"], "stdout": json.dumps(listing)}])
    engine = runtime()
    assert [s.id for s in engine.list_sandboxes({"dev.karotte.run-id": "r1"})] == ["a"]
    assert [s.id for s in engine.list_sandboxes({"dev.karotte.run-id": ""})] == ["a", "b"]
    assert fake.argvs()[0] == ["list", "--all", "--format", "json"]


def test_failed_start_leaves_no_staging(fake: Fake, tmp_path: Path) -> None:
    spec, _, _ = _spec(tmp_path)
    fake.answer([{"prefix": ["run"], "stderr": "image not found\n", "rc": 1}])
    engine = runtime()
    with pytest.raises(RuntimeUnavailableError, match="image not found"):
        engine.start(spec)
    assert not engine._state_dir(spec.name).exists()
    assert fake.argvs()[0][0] == "run"


def test_copy_helpers_refuse_links_and_specials(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "dirlink").symlink_to(tmp_path)
    os.mkfifo(src / "fifo")
    (src / "ok.txt").write_text("ok")
    stage = tmp_path / "stage"
    copy_in(src, stage)
    assert sorted(p.name for p in stage.iterdir()) == ["ok.txt"]
    (stage / "fifo2").unlink(missing_ok=True)
    os.mkfifo(stage / "fifo2")
    dest = tmp_path / "dest"
    dest.mkdir()
    refused = copy_out(stage, dest)
    assert any("fifo2" in item for item in refused)
    assert sorted(p.name for p in dest.iterdir()) == ["ok.txt"]


def test_copy_back_leaves_files_the_guest_did_not_touch(fake: Fake, tmp_path: Path) -> None:
    """Parallel runs share the out dir: a stale copy must not overwrite another run's file."""
    spec, _, out = _spec(tmp_path)
    (out / "other_run.json").write_text("old")
    fake.answer([{"prefix": ["run"], "stdout": "kt-apple-1\n"}])
    engine = runtime()
    sandbox = engine.start(spec)
    stage = engine._state_dir(spec.name) / "mounts" / "1"
    assert (stage / "other_run.json").read_text() == "old"
    (out / "other_run.json").write_text("newer, written by the other run meanwhile")
    (stage / "mine.json").write_text("this run's transcript")
    fake.answer([{"prefix": ["inspect"], "stdout": '[{"status": "stopped", "exitCode": 0}]'}])
    assert engine.wait(sandbox, timeout_s=5) == 0
    assert (out / "other_run.json").read_text() == "newer, written by the other run meanwhile"
    assert (out / "mine.json").read_text() == "this run's transcript"
