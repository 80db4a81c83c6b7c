"""The cluster's history (the dashboard overview's last 24 hours): one sample per interval
(``CORRAL_HISTORY_INTERVAL_S``, a minute by default) of the queue's length and the GPUs allocated,
kept in the store (``CORRAL_HISTORY_RETENTION_DAYS``) so that every replica draws the same chart
and a restart loses nothing."""

from __future__ import annotations

from dataclasses import dataclass

#: the default interval (``CORRAL_HISTORY_INTERVAL_S``): one sample per minute. A sample's time is
#: its interval's start, the table's key, so a second writer of the same interval (a new leader, a
#: replica with the same setting) writes nothing
SAMPLE_EVERY_S = 60.0
#: the default retention (``CORRAL_HISTORY_RETENTION_DAYS``): the overview shows one day; a week
#: more for a look back
SAMPLE_RETENTION_DAYS = 8.0
#: a chart breaks its line where samples are missing for longer than this many intervals (no
#: server sampled then: nothing is known)
GAP_INTERVALS = 3


def sample_slot(now: float, every_s: float = SAMPLE_EVERY_S) -> float:
    """The start of ``now``'s interval of ``every_s`` seconds: the time a sample taken at ``now``
    is stored under (with the default, the start of its minute)."""
    return now - now % every_s


@dataclass(frozen=True, slots=True)
class ClusterSample:
    """The cluster at one interval: jobs waiting (pending or blocked, gangs' ranks included) and
    running, and the GPUs of active workers, all and held by an allocation (reserved, running or
    stopping)."""

    at: float
    queued_jobs: int
    running_jobs: int
    gpus_total: int
    gpus_allocated: int
