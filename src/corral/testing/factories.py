"""Shape-named factories: ``gpu_worker(gpus=8)``, ``cpu_job()``, ``gpu_job(gpus=2)``.

Ids come from counters, so a failing test names the same objects on every run.
"""

from __future__ import annotations

import itertools
from typing import Any

from corral.domain.records import Constraints, Job, JobSpec, Worker
from corral.domain.resources import Resources
from corral.domain.status import Status, WorkerStatus

_job_numbers = itertools.count(1)
_worker_numbers = itertools.count(1)


def job_spec(command: str = "true", **fields: Any) -> JobSpec:
    return JobSpec(command=command, **fields)


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
