"""A sample of the cluster for its history (``domain.history``): what the samples loop stores
each interval, taken from what the store already counts (jobs by status, workers, allocations)."""

from __future__ import annotations

from collections.abc import Mapping

from corral.domain.history import SAMPLE_EVERY_S, ClusterSample, sample_slot
from corral.domain.status import Status, WorkerStatus

#: the statuses a job waits in: a gang's ranks wait as ``blocked`` (a queue's length counts both)
QUEUED = (Status.PENDING.value, Status.BLOCKED.value)


def sample(
    now: float,
    jobs_by_status: Mapping[str, int],
    gpus_by_worker_status: Mapping[str, tuple[int, int]],
    every_s: float = SAMPLE_EVERY_S,
) -> ClusterSample:
    """The cluster at ``now``'s interval of ``every_s`` seconds: jobs queued and running, the GPUs
    of active workers and those of them an allocation holds (``gpus_by_worker_status``: worker
    status -> (GPUs, GPUs held), the store's two sums). A draining or offline worker's GPUs count
    in neither: the chart's total is what the scheduler may place on.

    Counts, not rows: a fleet's workers and allocations (80,000 at 10,000 hosts) converted to
    records once a minute held the leader's interpreter for a third of a second, and every
    heartbeat on that replica waited behind it (``bench/fleet.py --timeline``)."""
    total, allocated = gpus_by_worker_status.get(WorkerStatus.ACTIVE.value, (0, 0))
    return ClusterSample(
        at=sample_slot(now, every_s),
        queued_jobs=sum(jobs_by_status.get(status, 0) for status in QUEUED),
        running_jobs=jobs_by_status.get(Status.RUNNING.value, 0),
        gpus_total=total,
        gpus_allocated=allocated,
    )
