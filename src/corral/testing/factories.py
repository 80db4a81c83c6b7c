"""Shape-named factories: ``gpu_worker(gpus=8)``, ``cpu_job()``, ``gpu_job(gpus=2)``,
``gang(size=3, gpus=1)``, ``allocation_on(worker, gpus=2)``, ``admission_snapshot(workers, gangs)``.

Ids come from counters, so a failing test names the same objects on every run.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from corral.core.snapshot import Gang, Snapshot
from corral.domain.records import Allocation, Constraints, Job, JobSpec, TopologyRequest, Worker
from corral.domain.resources import Resources
from corral.domain.status import Status, WorkerStatus

_job_numbers = itertools.count(1)
_worker_numbers = itertools.count(1)
_gang_numbers = itertools.count(1)


def cpu_job(cpus: int = 1, memory_mb: int = 0, **fields: Any) -> Job:
    return _job(Resources(cpus=cpus, memory_mb=memory_mb), **fields)


def gpu_job(gpus: int = 1, vram_mb: int = 0, cpus: int = 0, memory_mb: int = 0, **fields: Any) -> Job:
    return _job(Resources(gpus=gpus, vram_mb=vram_mb, cpus=cpus, memory_mb=memory_mb), **fields)


def _job(
    resources: Resources,
    job_id: str | None = None,
    status: Status = Status.PENDING,
    submitted_at: float = 0.0,
    constraints: Constraints | None = None,
    priority: int = 0,
    preemption_class: int = 5,
    queue_front: bool = False,
    **job_fields: Any,
) -> Job:
    spec = JobSpec(
        command="true",
        resources=resources,
        constraints=constraints or Constraints(),
        priority=priority,
        preemption_class=preemption_class,
    )
    return Job(
        id=job_id or f"j-{next(_job_numbers):04d}",
        spec=spec,
        status=status,
        submitted_at=submitted_at,
        queue_front=queue_front,
        **job_fields,
    )


def gpu_worker(
    gpus: int = 8,
    vram_mb: int = 81920,
    memory_mb: int = 1_024_000,
    cpus: int = 96,
    worker_id: str | None = None,
    gpu_model: str | None = "H100",
    labels: dict[str, str] | None = None,
    status: WorkerStatus = WorkerStatus.ACTIVE,
) -> Worker:
    return Worker(
        id=worker_id or f"w-{next(_worker_numbers):04d}",
        address="127.0.0.1",
        resources=Resources(gpus, vram_mb, memory_mb, cpus),
        gpu_model=gpu_model,
        labels=labels or {},
        status=status.value,
        registered_at=0.0,
        last_heartbeat_at=0.0,
    )


def cpu_worker(cpus: int = 16, memory_mb: int = 65536, **fields: Any) -> Worker:
    return gpu_worker(gpus=0, vram_mb=0, cpus=cpus, memory_mb=memory_mb, gpu_model=None, **fields)


def gpu_workers(count: int, gpus: int = 8, **fields: Any) -> list[Worker]:
    return [gpu_worker(gpus=gpus, **fields) for _ in range(count)]


def gang(
    size: int = 2,
    gpus: int = 0,
    vram_mb: int = 0,
    cpus: int = 0,
    memory_mb: int = 0,
    *,
    gang_id: str | None = None,
    status: Status = Status.BLOCKED,
    statuses: Sequence[Status] | None = None,
    workers: Sequence[Worker] | None = None,
    submitted_at: float = 0.0,
    priority: int = 0,
    preemption_class: int = 5,
    constraints: Constraints | None = None,
    walltime_s: float | None = None,
    reserved_at: float | None = None,
    started_at: float | None = None,
    topology: TopologyRequest | None = None,
) -> Gang:
    """A gang of ``size`` tasks, each asking for the given resources, all ``status`` (or one status
    per task with ``statuses``). With ``workers``, task i sits on ``workers[i]`` with GPU indices
    ``0..gpus-1`` (for reserved or running gangs; ``allocations_of`` turns them into allocations)."""
    gang_id = gang_id or f"g-{next(_gang_numbers):04d}"
    spec = JobSpec(
        command="true",
        gang_size=size,
        resources=Resources(gpus=gpus, vram_mb=vram_mb, cpus=cpus, memory_mb=memory_mb),
        constraints=constraints or Constraints(),
        priority=priority,
        preemption_class=preemption_class,
        walltime_s=walltime_s,
        topology=topology,
    )
    task_statuses = list(statuses) if statuses is not None else [status] * size
    tasks = []
    for index, task_status in enumerate(task_statuses):
        worker = workers[index] if workers is not None and task_status.holds_resources else None
        tasks.append(
            Job(
                id=f"j-{next(_job_numbers):04d}",
                spec=spec,
                status=task_status,
                submitted_at=submitted_at,
                gang_id=gang_id,
                gang_index=index,
                worker_id=worker.id if worker else None,
                gpu_indices=tuple(range(gpus)) if worker else (),
                reserved_at=reserved_at if task_status == Status.RESERVED else None,
                started_at=started_at if task_status in (Status.RUNNING, Status.PREEMPTING) else None,
            )
        )
    return Gang(gang_id, tuple(tasks))


def allocation_on(
    worker: Worker,
    gpus: int = 0,
    cpus: int = 0,
    memory_mb: int = 0,
    *,
    job_id: str | None = None,
    status: Status = Status.RUNNING,
    indices: Iterable[int] | None = None,
) -> Allocation:
    """What a (single) job holds on ``worker``: GPU indices ``0..gpus-1`` unless given."""
    return Allocation(
        job_id=job_id or f"j-{next(_job_numbers):04d}",
        worker_id=worker.id,
        resources=Resources(gpus=gpus, cpus=cpus, memory_mb=memory_mb),
        gpu_indices=tuple(range(gpus) if indices is None else indices),
        status=status,
    )


def allocations_of(gang: Gang) -> list[Allocation]:
    """The allocations of a gang's tasks that hold resources (reserved, running, preempting)."""
    return [
        Allocation(task.id, task.worker_id, task.spec.resources, task.gpu_indices, task.status)
        for task in gang.tasks
        if task.status.holds_resources and task.worker_id is not None
    ]


def admission_snapshot(
    workers: Iterable[Worker],
    gangs: Iterable[Gang] = (),
    allocations: Iterable[Allocation] = (),
    *,
    now: float = 1_000.0,
    expected_ends: Mapping[str, float] | None = None,
    pending: Iterable[Job] = (),
) -> Snapshot:
    """A snapshot for the admission cycle; the gangs' own allocations are added to ``allocations``."""
    gangs = tuple(gangs)
    held = [allocation for each in gangs for allocation in allocations_of(each)]
    return Snapshot(
        now=now,
        workers=tuple(workers),
        allocations=(*allocations, *held),
        gangs=gangs,
        pending=tuple(pending),
        expected_ends=dict(expected_ends or {}),
    )
