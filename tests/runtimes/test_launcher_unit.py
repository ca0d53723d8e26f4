"""Fast checks of the launcher's decisions (no engine needed): mounts, run naming for -n,
proxy URLs, credentials passed in, who owns a sandbox."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from karotte.config import EvaluationRunConfig
from karotte.errors import ConfigError
from karotte.host import reaper
from karotte.host.launcher import Launcher, LaunchOptions, model_credentials_env, parse_mount
from karotte.host.runtimes.base import LABEL_LAUNCHER_HOST, LABEL_LAUNCHER_PID


def test_parse_mount(tmp_path: Path) -> None:
    mount = parse_mount(f"{tmp_path}:/data:ro")
    assert (mount.source, mount.target, mount.read_only) == (tmp_path, "/data", True)
    assert not parse_mount(f"{tmp_path}:/data").read_only
    with pytest.raises(ConfigError, match="does not exist"):
        parse_mount(f"{tmp_path}/nope:/data")
    with pytest.raises(ConfigError, match="absolute"):
        parse_mount(f"{tmp_path}:relative")


def _launcher(tmp_path: Path, **options: object) -> Launcher:
    config = EvaluationRunConfig(
        task_id="t", run_id="abc", transcript_file=tmp_path / "out" / "run.json"
    )
    return Launcher(config, LaunchOptions.model_validate({"runtime": "docker", **options}))


def test_parallel_slots_are_named_and_numbered(tmp_path: Path) -> None:
    slots = _launcher(tmp_path, parallel=3).make_slots()
    assert [s.run_id for s in slots] == ["abc-1", "abc-2", "abc-3"]
    assert [s.host_transcript.name for s in slots] == ["run_1.json", "run_2.json", "run_3.json"]
    assert [str(s.config.transcript_file) for s in slots] == [
        "/out/run_1.json",
        "/out/run_2.json",
        "/out/run_3.json",
    ]
    assert all(s.config.student_user == "student" for s in slots)
    assert len({s.sandbox_name for s in slots}) == 3
    single = _launcher(tmp_path).make_slots()
    assert [(s.run_id, s.host_transcript.name) for s in single] == [("abc", "run.json")]


def test_out_dir_option_wins(tmp_path: Path) -> None:
    launcher = _launcher(tmp_path, out_dir=tmp_path / "elsewhere")
    assert launcher.out_dir == (tmp_path / "elsewhere").resolve()


@pytest.mark.parametrize(
    ("model", "base"),
    [
        ("anthropic/claude-sonnet-4-5", "http://127.0.0.1:18080"),
        ("openai/gpt-5", "http://127.0.0.1:18080/v1"),
    ],
)
def test_proxy_urls(tmp_path: Path, model: str, base: str) -> None:
    launcher = _launcher(tmp_path, proxy="http://127.0.0.1:9999")
    launcher.base_config = launcher.base_config.model_copy(update={"model": model})
    (slot,) = launcher.make_slots()
    assert slot.config.model_api_base == base
    assert slot.config.proxy_url == "http://127.0.0.1:9999"
    env = launcher.proxy_env()
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:18080"
    assert env["OPENAI_BASE_URL"] == env["OPENAI_API_BASE"] == "http://127.0.0.1:18080/v1"
    assert _launcher(tmp_path).proxy_env() == {}


def test_https_proxy_is_refused() -> None:
    from karotte.host.runtimes.proxy_relay import HostProxyRelay

    with pytest.raises(ConfigError, match="plain HTTP"):
        HostProxyRelay("https://proxy.example:443")


def test_model_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", "k1")
    monkeypatch.setenv("OPENAI_API_KEY", "k2")
    config = EvaluationRunConfig(task_id="t", model="openai/gpt-5", model_api_key="$MY_KEY")
    assert model_credentials_env(config) == {"MY_KEY": "k1", "OPENAI_API_KEY": "k2"}
    fake = config.model_copy(update={"use_fake_model": True})
    assert model_credentials_env(fake) == {}
    monkeypatch.delenv("MY_KEY")
    with pytest.raises(ConfigError, match="MY_KEY"):
        model_credentials_env(config)


def test_launcher_liveness() -> None:
    mine = reaper.launcher_labels("r")
    assert mine[LABEL_LAUNCHER_PID] == str(os.getpid())
    assert reaper.launcher_alive(mine)
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert not reaper.launcher_alive({**mine, LABEL_LAUNCHER_PID: str(dead.pid)})
    # a recycled pid (same number, other start time) is not the launcher
    assert not reaper.launcher_alive({**mine, reaper.LABEL_LAUNCHER_START: "1"})
    # another host's launcher cannot be checked from here: assumed alive
    assert reaper.launcher_alive(
        {**mine, LABEL_LAUNCHER_PID: "999999999", LABEL_LAUNCHER_HOST: "another-host"}
    )
