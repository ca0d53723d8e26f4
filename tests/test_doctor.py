"""``karotte doctor``: every registered runtime, whether it works, its isolation strength and the
fix for what is missing; the default runtime and the boot probe; ``--json``."""

from __future__ import annotations

import json
import sys

from typer.testing import CliRunner

from karotte.cli import _register, app
from karotte.host.runtimes import get_runtime, runtime_names


def _invoke(*args: str) -> tuple[int, str]:
    _register()
    result = CliRunner().invoke(app, ["doctor", *args])
    return result.exit_code, result.stdout


def test_json_report_covers_every_runtime() -> None:
    code, out = _invoke("--json")
    report = json.loads(out)
    rows = {row["runtime"]: row for row in report["runtimes"]}
    assert set(rows) == set(runtime_names())
    for name, row in rows.items():
        assert row["works"] == get_runtime(name).availability().ok
        if not row["works"]:
            assert row["reason"] and row["fix"], name
    strength = {name: row["isolation_strength"] for name, row in rows.items()}
    assert strength["local"] == 0 and rows["local"]["isolation"] == "none"
    assert strength["docker"] == strength["podman"] == 1
    assert strength["docker:gvisor"] == 2
    assert strength["firecracker"] == strength["apple-container"] == 3
    assert rows["firecracker"]["isolation"] == "VM"
    # firecracker reports each piece it needs, with a fix for what is missing
    pieces = {piece["piece"]: piece for piece in rows["firecracker"]["pieces"]}
    assert "firecracker" in pieces and "guest kernel" in pieces
    assert all(piece["fix"] for piece in pieces.values() if not piece["ok"])
    if sys.platform != "darwin":
        assert not rows["apple-container"]["works"]
        assert "macOS 26+" in rows["apple-container"]["reason"]
    default = report["default_runtime"]
    assert default["runtime"] in rows and default["why"]
    assert default["works"] == rows[default["runtime"]]["works"]
    assert code == (0 if default["works"] else 1)
    probe = report["firecracker_boot_probe"]
    if rows["firecracker"]["works"]:
        assert probe["ok"]  # firecracker never works without a booting guest
    if not probe["ok"]:
        assert default["runtime"] != "firecracker" and probe["reason"]


def test_human_report_names_runtimes_and_fixes() -> None:
    code, out = _invoke()
    report = json.loads(_invoke("--json")[1])
    for row in report["runtimes"]:
        assert row["runtime"] in out
    assert "default runtime:" in out and "firecracker boot probe:" in out
    if any(not row["works"] for row in report["runtimes"]):
        assert "fix:" in out
    assert code in (0, 1)
