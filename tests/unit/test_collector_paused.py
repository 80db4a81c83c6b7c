"""The admission pass plans with the cyclic garbage collector paused (``collector_paused``): back
on after, even when the pass fails, and left off where it was off before."""

from __future__ import annotations

import gc

import pytest

from corral.server.collector import collector_paused


def test_the_collector_is_off_during_and_on_after() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_the_collector_comes_back_after_a_failed_pass() -> None:
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("the pass failed")
    assert gc.isenabled()


def test_a_collector_off_before_stays_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
