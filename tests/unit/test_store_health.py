"""The server's view of its store's writes (``server.store_health``): failing from the first failure
it sees, recovered at the first check whose write commits, on a fake clock."""

from __future__ import annotations

import pytest

from corral.core.hearing import Hearing
from corral.domain import errors
from corral.server.store_health import StoreHealth
from corral.testing.clock import FakeClock


def full() -> None:
    raise errors.StoreWriteFailed("database or disk is full")


def test_a_store_fails_at_its_first_failure_and_recovers_at_the_first_write_that_commits():
    clock = FakeClock()
    health = StoreHealth(clock)
    started = clock.now()
    assert health.hearing(started) == Hearing(started)
    failed_at = clock.advance(5)
    health.failed(errors.StoreBusy("locked"))
    clock.advance(3)
    health.failed(errors.StoreBusy("still locked"))  # the episode began at the first one
    assert health.failing and health.hearing(started) == Hearing(started, None, failed_at)
    clock.advance(10)
    with pytest.raises(errors.StoreWriteFailed):
        health.check(full)
    assert health.failing
    recovered_at = clock.advance(2)
    health.check(lambda: None)
    assert not health.failing
    assert health.hearing(started) == Hearing(started, store_recovered_at=recovered_at)
    assert health.hearing(started).since == recovered_at


def test_a_well_store_is_not_checked():
    health = StoreHealth(FakeClock())
    writes: list[str] = []
    health.check(lambda: writes.append("write"))
    assert writes == []


def test_a_failure_noted_while_the_check_wrote_keeps_the_store_failing():
    """A check ends only the failures it saw begin before it: one noted while its write was under
    way may be newer than the write."""
    clock = FakeClock()
    health = StoreHealth(clock)
    health.failed(errors.StoreUnavailable("gone"))

    def write_while_another_request_fails() -> None:
        health.failed(errors.StoreBusy("locked again"))

    health.check(write_while_another_request_fails)
    assert health.failing and health.recovered_at is None
    health.check(lambda: None)
    assert not health.failing and health.recovered_at == clock.now()
