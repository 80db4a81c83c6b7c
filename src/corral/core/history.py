"""A sample of the cluster for its history (``domain.history``): what the samples loop stores
each interval, taken from what the store already counts (jobs by status, workers, allocations)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from corral.domain.history import SAMPLE_EVERY_S, ClusterSample, sample_slot
from corral.domain.records import Allocation, Worker
from corral.domain.status import Status, WorkerStatus

#: the statuses a job waits in: a gang's ranks wait as ``blocked`` (a queue's length counts both)
QUEUED = (Status.PENDING.value, Status.BLOCKED.value)


def sample(
    now: float,
    jobs_by_status: Mapping[str, int],
    workers: Iterable[Worker],
    allocations: Iterable[Allocation],
    every_s: float = SAMPLE_EVERY_S,
) -> ClusterSample:
    """The cluster at ``now``'s interval of ``every_s`` seconds: jobs queued and running, the GPUs
    of active workers and those of them an allocation holds (a draining or offline worker's GPUs
    count in neither: the chart's total is what the scheduler may place on)."""
    active = {worker.id: worker for worker in workers if worker.status == WorkerStatus.ACTIVE}
    return ClusterSample(
        at=sample_slot(now, every_s),
        queued_jobs=sum(jobs_by_status.get(status, 0) for status in QUEUED),
        running_jobs=jobs_by_status.get(Status.RUNNING.value, 0),
        gpus_total=sum(worker.resources.gpus for worker in active.values()),
        gpus_allocated=sum(
            len(allocation.gpu_indices) for allocation in allocations if allocation.worker_id in active
        ),
    )
