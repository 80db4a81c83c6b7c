"""Usage accounting (API.md "Usage"): what a window's attempts used, per user, pool or both.

The store keeps one row per attempt that held resources (``attempt_usage``, written with the
transition that ended the hold) and sums them per group over a window, each attempt clipped to it
(``store.usage``); this module says what the groupings are, what the default window is, and turns
the sums and the waits into the answer's items (the wait percentiles).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from corral.domain.usage import UsageTotals

#: the default window: the last seven days
DEFAULT_WINDOW_S = 7 * 86400.0
#: usage rows are kept this long by default (``CORRAL_USAGE_RETENTION_DAYS``)
DEFAULT_RETENTION_DAYS = 400.0
#: a ``by`` value -> the dimensions it groups by, in the answer's order
GROUPINGS: dict[str, tuple[str, ...]] = {
    "user": ("user",),
    "pool": ("pool",),
    "user,pool": ("user", "pool"),
    "pool,user": ("user", "pool"),
}


@dataclass(frozen=True, slots=True)
class UsageItem:
    totals: UsageTotals
    wait_p50_s: float | None
    wait_p90_s: float | None


def grouping(by: str) -> tuple[str, ...]:
    """The dimensions of ``by`` (``user``, ``pool``, ``user,pool``); ValueError for another."""
    try:
        return GROUPINGS[by.replace(" ", "")]
    except KeyError:
        raise ValueError(f"by must be one of user, pool, user,pool (got {by!r})") from None


def window(now: float, since: float | None, until: float | None) -> tuple[float, float]:
    """The window asked for: ``until`` defaults to now, ``since`` to a week before ``until``;
    ValueError when it is empty or backwards."""
    end = now if until is None else until
    start = end - DEFAULT_WINDOW_S if since is None else since
    if start >= end:
        raise ValueError("since must be before until")
    return start, end


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """The nearest-rank percentile of ``values`` (None when there are none): the smallest value
    with at least ``fraction`` of them at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def items(
    totals: Iterable[UsageTotals], waits: Iterable[tuple[str | None, str | None, float]]
) -> list[UsageItem]:
    """Each group's totals with the p50 and p90 of its waits (``waits``: the group's key, as in
    the totals, and one first attempt's wait, in seconds)."""
    by_group: dict[tuple[str | None, str | None], list[float]] = {}
    for user, pool, wait_s in waits:
        by_group.setdefault((user, pool), []).append(wait_s)
    answered = []
    for group in totals:
        group_waits = by_group.get((group.user, group.pool), [])
        answered.append(UsageItem(group, percentile(group_waits, 0.5), percentile(group_waits, 0.9)))
    return answered
