"""The Store protocol: every read and every state change corral makes, and nothing else.

Every state change is one transaction that compare-and-sets on status (and on worker and attempt for
worker reports) and appends a ``job_events`` row in the same transaction. A change whose
precondition no longer holds raises a ``Conflict`` subclass and writes nothing.

The store holds no policy: the claim asks a ``ClaimPolicy`` (the core's placement functions, passed in
by the server) which candidate fits, so the store stays free of scheduling decisions and the core
free of SQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from corral.domain.records import Allocation, Hold, Job, JobEvent, JobSpec, Reason, Worker
from corral.domain.resources import Resources


class CapacityView(Protocol):
    @property
    def free(self) -> Resources: ...

    @property
    def free_gpu_indices(self) -> tuple[int, ...]: ...


CapacityT = TypeVar("CapacityT", bound=CapacityView)


class ClaimPolicy(Protocol[CapacityT]):
    """What the claim needs from the scheduling core."""

    def capacity(self, worker: Worker, allocations: Sequence[Allocation]) -> CapacityT: ...

    def choose(
        self,
        worker: Worker,
        capacity: CapacityT,
        candidates: Sequence[Job],
        holds: Sequence[Hold],
        now: float,
    ) -> tuple[Job, tuple[int, ...]] | None: ...


@dataclass(frozen=True)
class Submitted:
    """One submitted item: a single job, or a gang (its tasks in ``gang_index`` order)."""

    job: Job | None = None
    gang_id: str | None = None
    tasks: tuple[Job, ...] = ()


@dataclass(frozen=True)
class SubmitResult:
    items: tuple[Submitted, ...]
    replayed: bool = False


@dataclass(frozen=True)
class JobFilter:
    status: tuple[str, ...] = ()
    gang_id: str | None = None
    pool: str | None = None
    worker_id: str | None = None


@dataclass(frozen=True)
class WorkerRegistration:
    id: str
    address: str
    resources: Resources
    gpu_model: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerView:
    """A worker with what it currently holds (``used`` and the ids of jobs holding resources)."""

    worker: Worker
    used: Resources
    running: tuple[str, ...]


@dataclass(frozen=True)
class ReapReport:
    """What one reaper pass changed, for metrics and logs."""

    requeued: tuple[Job, ...] = ()
    failed: tuple[Job, ...] = ()
    force_drained: tuple[Job, ...] = ()
    offline_workers: tuple[str, ...] = ()
    drains: tuple[Drain, ...] = ()
    completions: tuple[DrainCompletion, ...] = ()


@dataclass(frozen=True)
class AdmissionInputs:
    """What the admission cycle reads: active capacity, every allocation, and the gangs that have a
    blocked or reserved task (each with all of its tasks, in ``gang_index`` order)."""

    workers: tuple[Worker, ...]
    allocations: tuple[Any, ...]
    gangs: tuple[tuple[str, tuple[Job, ...]], ...]
    #: job id -> expected end (start, or now when not started, plus declared walltime), for the
    #: allocations that declared one
    expected_ends: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Drain:
    """A drain that started: the gang, its new shared epoch, the trigger, and every task it moved."""

    gang_id: str
    epoch: int
    trigger: Job
    transitioned: tuple[Job, ...]


@dataclass(frozen=True)
class DrainCompletion:
    gang_id: str
    outcome: str  # "blocked" or "failed"
    epoch: int
    drain_seconds: float | None
    tasks: tuple[Job, ...]


class Store(Protocol):
    dialect: str

    def migrate(self) -> None: ...
    def close(self) -> None: ...
    def ping(self, timeout_s: float) -> None: ...

    def submit(
        self,
        specs: Sequence[JobSpec],
        now: float,
        idempotency_key: str | None = None,
        fingerprint: str = "",
    ) -> SubmitResult: ...
    def get_job(self, job_id: str) -> Job | None: ...
    def list_jobs(self, filters: JobFilter, limit: int, after: tuple[float, str] | None) -> list[Job]: ...
    def gang_tasks(self, gang_id: str) -> list[Job]: ...
    def job_events(self, job_id: str) -> list[JobEvent]: ...
    def count_jobs_by_status(self) -> dict[str, int]: ...

    def claim(self, worker_id: str, now: float, policy: ClaimPolicy[Any]) -> Job | None: ...
    def heartbeat_job(
        self, job_id: str, worker_id: str, attempt: int, now: float, progress: dict[str, Any] | None
    ) -> Job: ...
    def complete(self, job_id: str, worker_id: str, attempt: int, now: float) -> Job: ...
    def fail(
        self,
        job_id: str,
        worker_id: str,
        attempt: int,
        now: float,
        exit_code: int | None,
        error: str | None,
        output_tail: str | None,
        release: bool = False,
    ) -> Job: ...
    def ack_preempted(self, job_id: str, worker_id: str, attempt: int, epoch: int, now: float) -> Job: ...
    def cancel(self, job_id: str, now: float) -> list[Job]: ...

    def register_worker(self, registration: WorkerRegistration, now: float) -> Worker: ...
    def worker_heartbeat(
        self,
        worker_id: str,
        now: float,
        gpu_stats: list[dict[str, Any]] | None,
        unhealthy_gpus: Sequence[int] | None = None,
    ) -> Worker: ...
    def watchdog_trip(
        self, job_id: str, worker_id: str, attempt: int, now: float, kind: str, detail: str, max_retries: int
    ) -> Job: ...
    def flag_dead_workers(self, now: float, after_s: float) -> list[tuple[Worker, int]]: ...

    # gangs (seeds 001 and 000)
    def admission_inputs(self, now: float) -> AdmissionInputs: ...
    def reserve_gang(
        self,
        gang_id: str,
        placements: Sequence[tuple[str, str, tuple[int, ...]]],
        now: float,
        policy: ClaimPolicy[Any],
    ) -> list[Job] | None: ...
    def rollback_gang(self, gang_id: str, now: float, reservation_timeout_s: float) -> Drain | list[Job]: ...
    def complete_drains(self, now: float) -> list[DrainCompletion]: ...
    def complete_drain(self, gang_id: str, now: float) -> DrainCompletion | None: ...
    def save_checkpoint(
        self, job_id: str, worker_id: str, attempt: int, epoch: int | None, data: bytes, now: float
    ) -> Job: ...
    def get_checkpoint(self, job_id: str) -> bytes | None: ...
    def replace_holds(self, holds: Sequence[Hold]) -> None: ...
    def list_holds(self) -> list[Hold]: ...
    def set_waiting_reason(self, gang_id: str, reason: Reason) -> None: ...
    def try_lead(self, loop: str) -> bool: ...
    def drain_worker(self, worker_id: str) -> Worker: ...
    def get_worker(self, worker_id: str) -> WorkerView | None: ...
    def workers(self) -> list[Worker]: ...
    def list_workers(self) -> list[WorkerView]: ...
    def workers_by_id(self, worker_ids: Sequence[str]) -> dict[str, Worker]: ...
    def allocations(self) -> list[Allocation]: ...

    def reap(
        self, now: float, heartbeat_timeout_s: float, preempt_timeout_s: float, worker_offline_s: float
    ) -> ReapReport: ...
