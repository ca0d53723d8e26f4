"""Pieces of the guest's confinement that need no VM: which capabilities a sandbox keeps (by
number, as the guest drops the rest from its bounding set) and how exec's ``user`` is read.
The whole of it runs in a real guest in the conformance suite (``-k qemu``)."""

from __future__ import annotations

import pytest

from karotte.errors import KarotteError
from karotte.host.vm.guest_init import Confinement, resolve_user
from karotte.host.vm.machine import capability_numbers


def test_capability_names_become_kernel_numbers() -> None:
    assert capability_numbers(["KILL", "cap_chown", "SYS_ADMIN"]) == [0, 5, 21]
    assert capability_numbers([]) == []
    with pytest.raises(KarotteError, match="unknown capability 'FLY'"):
        capability_numbers(["FLY"])


def test_everything_not_kept_is_dropped() -> None:
    drop = Confinement([0, 5]).drop
    assert 0 not in drop and 5 not in drop
    assert {1, 2, 21, 40} <= set(drop)  # DAC_OVERRIDE, DAC_READ_SEARCH, SYS_ADMIN, CHECKPOINT…


def test_exec_user_forms() -> None:
    assert resolve_user(None) == (0, 0)
    assert resolve_user("root") == (0, 0)
    assert resolve_user("1000:1000") == (1000, 1000)
    assert resolve_user("0:5") == (0, 5)
    with pytest.raises(KeyError):
        resolve_user("no-such-user-here")
