"""A window's usage of one group of attempts (API.md "Usage"), as the store sums it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class UsageTotals:
    """One group's sums over a window: ``user`` or ``pool`` None when the grouping leaves it out
    (or, for ``user``, for jobs submitted without auth)."""

    user: str | None
    pool: str | None
    gpu_seconds: float
    cpu_seconds: float
    attempts: int
    jobs: int
