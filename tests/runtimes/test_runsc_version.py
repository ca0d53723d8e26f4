"""A runsc build known to break coreutils' statx is usable, with a warning and its fix; newer
builds and unreadable versions add nothing. Fake ``runsc`` executables print the version lines
real builds print."""

from __future__ import annotations

from pathlib import Path

import pytest

from karotte.host.runtimes.docker import runsc_build_warning


def _fake_runsc(tmp_path: Path, first_line: str) -> str:
    path = tmp_path / "runsc"
    path.write_text(f"#!/bin/sh\necho '{first_line}'\necho 'spec: 1.0.2-dev'\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(
    "line", ["runsc version 0.0~20221219.0", "runsc version release-20220510.0"]
)
def test_old_builds_warn_with_the_fix(tmp_path: Path, line: str) -> None:
    warning = runsc_build_warning(_fake_runsc(tmp_path, line))
    assert warning is not None and warning.ok
    assert "ls -l" in warning.reason and "EINVAL" in warning.reason
    assert "bookworm-backports" in warning.fix


@pytest.mark.parametrize(
    "line", ["runsc version 0.0~20240729.0", "runsc version release-20250101.0", "garbage"]
)
def test_newer_or_unknown_builds_say_nothing(tmp_path: Path, line: str) -> None:
    assert runsc_build_warning(_fake_runsc(tmp_path, line)) is None


def test_missing_binary_says_nothing(tmp_path: Path) -> None:
    assert runsc_build_warning(str(tmp_path / "nope")) is None
