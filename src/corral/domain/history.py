"""The cluster's history (the dashboard overview's last 24 hours): one sample a minute of the
queue's length and the GPUs allocated, kept in the store so that every replica draws the same
chart and a restart loses nothing."""

from __future__ import annotations

from dataclasses import dataclass

#: one sample per minute: a sample's time is its minute's start, the table's key, so a second
#: writer of the same minute (a new leader, a replica) writes nothing
SAMPLE_EVERY_S = 60.0
#: samples older than this are removed (the overview shows one day; a week more for a look back)
SAMPLE_RETENTION_S = 8 * 86400.0


def sample_minute(now: float) -> float:
    """The start of ``now``'s minute: the time a sample taken at ``now`` is stored under."""
    return now - now % SAMPLE_EVERY_S


@dataclass(frozen=True, slots=True)
class ClusterSample:
    """The cluster at one minute: jobs waiting (pending or blocked, gangs' ranks included) and
    running, and the GPUs of active workers, all and held by an allocation (reserved, running or
    stopping)."""

    at: float
    queued_jobs: int
    running_jobs: int
    gpus_total: int
    gpus_allocated: int
