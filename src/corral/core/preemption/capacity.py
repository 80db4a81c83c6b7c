"""A worker's free capacity during a plan, and the arithmetic the search makes on it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from corral.core.placement import Capacity, free_capacity
from corral.core.preemption.memo import PlannerMemo
from corral.domain.records import Allocation, Job, Worker
from corral.domain.resources import Resources

__all__ = ["Free", "allocation_of", "capacity_at_start", "plus", "tasks_fitting"]


@dataclass(slots=True)
class Free:
    """A worker's free capacity during the plan (reservations of earlier preemptions taken out)."""

    worker: Worker
    capacity: Capacity


def capacity_at_start(
    worker: Worker, jobs: list[Job], extra: Sequence[Allocation], memo: PlannerMemo | None
) -> Capacity:
    """``free_capacity`` of ``worker`` after ``jobs`` and this cycle's ``extra`` reservations, from
    ``memo`` where the same jobs were counted before (a worker with a reservation of this cycle is
    counted)."""
    if memo is None or extra:
        return free_capacity(worker, [*map(allocation_of, jobs), *extra])
    found = memo.capacity.get(worker, jobs)
    if found is None:
        found = free_capacity(worker, [allocation_of(job) for job in jobs])
        memo.capacity.put(worker, jobs, found)
    return found


def allocation_of(job: Job) -> Allocation:
    return Allocation(job.id, job.worker_id or "", job.spec.resources, job.gpu_indices, job.status)


def plus(free: Resources, resources: Resources, subtract: bool = False) -> Resources:
    """``free`` with ``resources`` added (or taken out), its VRAM per GPU kept."""
    sign = -1 if subtract else 1
    return Resources(
        free.gpus + sign * resources.gpus,
        free.vram_mb,
        free.memory_mb + sign * resources.memory_mb,
        free.cpus + sign * resources.cpus,
    )


def tasks_fitting(free: Resources, request: Resources) -> int:
    """Tasks of ``request`` that ``free`` holds (a request for nothing: one)."""
    pairs = ((free.gpus, request.gpus), (free.cpus, request.cpus), (free.memory_mb, request.memory_mb))
    counts = [max(0, have) // want for have, want in pairs if want > 0]
    return min(counts) if counts else 1
