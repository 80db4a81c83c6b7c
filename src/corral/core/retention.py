"""Retention (``CORRAL_RETENTION_DAYS``): what is old enough to remove, and how much per pass.

Finished jobs (their events, checkpoints and logs with them) and idempotency keys older than the
cutoff are removed by the retention loop in batches of ``BATCH`` (one short transaction each), at
most ``MAX_BATCHES`` per pass, so a backlog drains over a few passes without a long lock.
"""

from __future__ import annotations

SECONDS_PER_DAY = 86400.0
BATCH = 500
MAX_BATCHES = 20


def cutoff(now: float, retention_days: float) -> float:
    """Anything finished (or a key created) before this is removed."""
    return now - retention_days * SECONDS_PER_DAY


def another_batch(removed_jobs: int, removed_keys: int, batches_done: int) -> bool:
    """Whether the pass goes on: the last batch was full and the pass is under its batch cap."""
    return (removed_jobs >= BATCH or removed_keys >= BATCH) and batches_done < MAX_BATCHES
