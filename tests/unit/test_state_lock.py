"""One worker per state directory: the second holder is refused with the first one's pid, and the
lock goes with its holder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.worker import state_lock


def test_the_second_holder_is_refused_naming_the_first(tmp_path: Path):
    first = state_lock.hold(tmp_path / "state")
    try:
        with pytest.raises(state_lock.StateDirectoryInUse) as refused:
            state_lock.hold(tmp_path / "state")
        assert refused.value.pid == os.getpid()
        assert f"worker pid {os.getpid()}" in str(refused.value)
    finally:
        os.close(first)
    os.close(state_lock.hold(tmp_path / "state"))  # released with its descriptor


def test_the_lock_is_not_inherited_by_jobs(tmp_path: Path):
    descriptor = state_lock.hold(tmp_path / "state")
    try:
        assert not os.get_inheritable(descriptor)
    finally:
        os.close(descriptor)
