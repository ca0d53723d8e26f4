"""ProtectedStore: root-only, symlink-proof key/value store."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from student_helpers import as_student

from karotte.sandbox.confinement.demote import Identity
from karotte.sandbox.confinement.store import ProtectedStore, StoreError


def test_values_round_trip_and_files_are_private(tmp_path: Path) -> None:
    store = ProtectedStore(tmp_path / "store")
    store["expected"] = {"answer": 42, "list": [1, "a"]}
    assert store["expected"] == {"answer": 42, "list": [1, "a"]}
    assert "expected" in store and "other" not in store
    assert store.get("other", 7) == 7
    assert store.keys() == ["expected"]
    assert stat.S_IMODE((tmp_path / "store").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "store" / "expected.json").stat().st_mode) == 0o600
    # a second instance on the same directory sees the value (hooks and judges share it)
    assert ProtectedStore(tmp_path / "store")["expected"]["answer"] == 42
    del store["expected"]
    with pytest.raises(KeyError):
        store["expected"]


@pytest.mark.parametrize("key", ["../x", "a/b", "", ".hidden", "x" * 200, "a b"])
def test_bad_keys_are_refused(tmp_path: Path, key: str) -> None:
    with pytest.raises(StoreError, match="invalid store key"):
        ProtectedStore(tmp_path / "s").set(key, 1)


def test_non_json_values_are_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="JSON"):
        ProtectedStore(tmp_path / "s").set("k", object())


def test_a_symlinked_store_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "store").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(StoreError, match="symlink"):
        ProtectedStore(tmp_path / "store")


def test_a_symlinked_value_is_not_followed(tmp_path: Path) -> None:
    store = ProtectedStore(tmp_path / "store")
    (tmp_path / "secret").write_text('"secret"')
    (tmp_path / "store" / "k.json").symlink_to(tmp_path / "secret")
    with pytest.raises(StoreError):
        store.get("k")


@pytest.mark.requires_root
def test_the_student_cannot_read_or_plant_values(student: Identity, tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    store = ProtectedStore(tmp_path / "store")
    store["expected"] = "the answer"
    result = as_student(student, f"cat {tmp_path}/store/expected.json; ls {tmp_path}/store")
    assert "the answer" not in result.stdout
    assert result.returncode != 0
    planted = as_student(student, f"echo '\"fake\"' > {tmp_path}/store/expected.json")
    assert planted.returncode != 0
    assert store["expected"] == "the answer"


@pytest.mark.requires_root
def test_a_store_dir_owned_by_the_student_is_refused(student: Identity, tmp_path: Path) -> None:
    planted = tmp_path / "store"
    planted.mkdir()
    os.chown(planted, student.uid, student.gid)
    with pytest.raises(StoreError, match="owned by uid"):
        ProtectedStore(planted)
