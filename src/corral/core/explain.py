"""Why is this job not running? A plain answer, computed from values (no I/O).

Each answer is a list of ``Reason`` values with stable codes: the first is the most useful one.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.core.placement import Placement, free_capacity, place
from corral.domain.records import Allocation, Job, Reason, Worker
from corral.domain.status import Status, WorkerStatus


def explain_pending(job: Job, workers: Sequence[Worker], allocations: Sequence[Allocation]) -> list[Reason]:
    """Reasons a pending job has not started, best first.

    1. No active worker at all.
    2. No active worker could run it even if empty (too big, constraints): it will wait forever.
    3. Some worker has room now: it starts at that worker's next claim.
    4. Otherwise it waits for capacity held by other jobs.
    """
    active = sorted(
        (worker for worker in workers if worker.status == WorkerStatus.ACTIVE), key=lambda w: w.id
    )
    if not active:
        return [Reason("no_workers", "no active worker is registered: start one with `corral worker`")]
    request, constraints = job.spec.resources, job.spec.constraints
    by_worker: dict[str, list[Allocation]] = {}
    for allocation in allocations:
        by_worker.setdefault(allocation.worker_id, []).append(allocation)
    could_ever: list[Worker] = []
    refusals: list[Reason] = []
    for worker in active:
        empty = free_capacity(worker, [])
        decision = place(request, constraints, worker, empty)
        if isinstance(decision, Placement):
            could_ever.append(worker)
        else:
            refusals.append(decision)
    if not could_ever:
        largest_gpus = max(worker.resources.gpus for worker in active)
        summary = Reason(
            "unschedulable",
            f"no active worker can ever run this job (it needs {request.gpus} GPU(s), "
            f"{request.memory_mb} MB, {request.cpus} CPU(s); the largest worker has {largest_gpus} GPU(s))",
        )
        return [summary, *refusals[:3]]
    for worker in could_ever:
        capacity = free_capacity(worker, by_worker.get(worker.id, []))
        if isinstance(place(request, constraints, worker, capacity), Placement):
            return [
                Reason("fits_now", f"worker {worker.id} has room: the job starts at its next claim"),
                *([job.reason] if job.reason else []),
            ]
    return [
        Reason(
            "waiting_for_capacity",
            f"{len(could_ever)} worker(s) can run this job but their capacity is held by other jobs",
        ),
        *([job.reason] if job.reason else []),
    ]


def explain(job: Job, workers: Sequence[Worker], allocations: Sequence[Allocation]) -> list[Reason]:
    """Why ``job`` is where it is: live reasons for a pending job, else its last recorded reason."""
    if job.status == Status.PENDING:
        return explain_pending(job, workers, allocations)
    return [job.reason] if job.reason else []
