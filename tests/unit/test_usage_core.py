"""``core.usage``: the groupings ``by`` names, the default window, and the wait percentiles."""

from __future__ import annotations

import pytest

from corral.core import usage
from corral.domain.clock import from_rfc3339
from corral.domain.usage import UsageTotals


def test_groupings():
    assert usage.grouping("user") == ("user",)
    assert usage.grouping("pool") == ("pool",)
    assert usage.grouping("user,pool") == usage.grouping("pool, user") == ("user", "pool")
    with pytest.raises(ValueError, match="by must be one of"):
        usage.grouping("worker")


def test_the_window_defaults_to_the_last_week_and_must_not_be_empty():
    assert usage.window(1000.0, None, None) == (1000.0 - 7 * 86400, 1000.0)
    assert usage.window(1000.0, 10.0, None) == (10.0, 1000.0)
    assert usage.window(1000.0, None, 500.0) == (500.0 - 7 * 86400, 500.0)
    with pytest.raises(ValueError):
        usage.window(1000.0, 20.0, 20.0)


def test_nearest_rank_percentiles():
    assert usage.percentile([], 0.5) is None
    assert usage.percentile([7.0], 0.9) == 7.0
    values = [float(value) for value in range(10, 0, -1)]  # 10 .. 1, unsorted on purpose
    assert (usage.percentile(values, 0.5), usage.percentile(values, 0.9)) == (5.0, 9.0)


def test_items_pair_each_group_with_its_own_waits():
    totals = [UsageTotals("alice", None, 1.0, 0.0, 1, 1), UsageTotals("bob", None, 2.0, 0.0, 1, 1)]
    waits = [("alice", None, 4.0), ("alice", None, 2.0), ("carol", None, 99.0)]
    first, second = usage.items(totals, waits)
    assert (first.wait_p50_s, first.wait_p90_s) == (2.0, 4.0)
    assert (second.wait_p50_s, second.wait_p90_s) == (None, None)


def test_rfc3339_with_z_an_offset_or_none():
    assert from_rfc3339("2026-11-27T12:00:00Z") == from_rfc3339("2026-11-27T13:00:00+01:00")
    assert from_rfc3339("2026-11-27T12:00:00") == from_rfc3339("2026-11-27T12:00:00.000Z")
    with pytest.raises(ValueError):
        from_rfc3339("yesterday")
