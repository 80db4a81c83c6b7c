"""The Store protocol: every read and every state change corral makes, and nothing else.

The store holds no policy. Every change of a job's status is decided by a function of
``corral.core`` that the server hands in: ``change`` / ``change_gang`` lock the rows the decision
reads, call it, and apply the ``Plan`` it returns in the same transaction (a compare-and-set per
transition, with its event row); the claim asks a ``ClaimPolicy`` (the core's placement and claim
rule) which candidate fits and how it starts. A decision that refuses (a stale report) raises a
``Conflict`` subclass and nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from corral.domain.pools import BorrowingView, PoolSettings, PoolUsage, StarvationState
from corral.domain.records import Allocation, Hold, Job, JobEvent, Worker, WorkerContact
from corral.domain.resources import Resources
from corral.domain.transitions import Outcome, Plan, Submission, Transition

#: A change's time: a fixed instant, or a clock the store reads inside the transaction, once it has
#: read the state the change depends on (a claim: the worker's allocations). With store calls on
#: several threads, a time read when the request arrived can come before a release another thread
#: committed meanwhile and the claim used: the history would show the worker over capacity.
Stamp = float | Callable[[], float]


def stamp_of(now: Stamp) -> float:
    """The instant ``now`` names: itself, or its clock read now."""
    return now() if callable(now) else now


class WouldWait(Exception):
    """``Store.run_inline``: the work would have had to wait for a lock (or the backend never runs
    work inline); nothing was written, so the caller runs it again on a store thread."""


@dataclass(frozen=True)
class ClaimAsk:
    """One claim of a group (``Store.claim_group``): up to ``limit`` jobs for the worker, with the
    claim's Idempotency-Key."""

    worker_id: str
    limit: int = 1
    claim_key: str | None = None


#: a decision about one job: the job and, for a gang task, every task of its gang (locked)
JobDecision = Callable[[Job, tuple[Job, ...]], Plan[Outcome]]
#: a decision about a gang: its tasks, locked, in ``gang_index`` order
GangDecision = Callable[[tuple[Job, ...]], Plan[Outcome]]
#: a worker liveness rule (``corral.core.workers``): the worker's locked row and its contact in,
#: the record to write out, or None where nothing changes
WorkerDecision = Callable[[Worker, WorkerContact], Worker | None]
#: a preemption's decision: the locked jobs by id, the locked workers with their allocations, the
#: rendezvous ports in use on a gang preemptor's rank 0 worker
PreemptionDecision = Callable[
    [dict[str, Job], dict[str, tuple[Worker, list[Allocation]]], set[int]], Plan[Outcome]
]


class CapacityView(Protocol):
    @property
    def free(self) -> Resources: ...

    @property
    def free_gpu_indices(self) -> tuple[int, ...]: ...


CapacityT = TypeVar("CapacityT", bound=CapacityView)
T = TypeVar("T")


class ClaimPolicy(Protocol[CapacityT]):
    """What the claim needs from the scheduling core."""

    def capacity(self, worker: Worker, allocations: Sequence[Allocation]) -> CapacityT: ...

    def reserved_task(self, worker: Worker, allocations: Sequence[Allocation]) -> str | None:
        """The task reserved for this worker that its claim starts before any pending job."""
        ...

    def choose(
        self,
        worker: Worker,
        capacity: CapacityT,
        candidates: Iterable[Job],
        holds: Sequence[Hold],
        now: float,
        borrowing_view: Callable[[], BorrowingView] | None = None,
    ) -> tuple[Job, tuple[int, ...]] | None:
        """The first candidate that fits and may start (``corral.core.claim``). ``borrowing_view``
        reads the cluster's borrowing figures, in the claim's transaction, when the policy needs
        them; None: nothing is borrowed."""
        ...

    def start(
        self, job: Job, worker_id: str, gpu_indices: Sequence[int], now: float, claim_key: str | None = None
    ) -> Transition | None:
        """The claim's transition (pending, or reserved for this worker -> running), recording the
        claim's ``claim_key``; None when the job may not be started by this worker."""
        ...


@dataclass(frozen=True)
class JobReport:
    """What a job heartbeat reports besides "alive" (each None when not reported)."""

    progress: dict[str, Any] | None = None
    gpu_util_pct: float | None = None
    rss_mb: float | None = None
    #: when the job last saved a checkpoint on its worker
    checkpoint_at: float | None = None


@dataclass(frozen=True, slots=True)
class LeaseRenewed:
    """A lease ``Store.heartbeat_jobs`` renewed on a job that runs (not being stopped).

    Such a heartbeat's answer is "carry on" whatever else the row holds, so the store reads back
    only the status, not the whole row: at 2,000 hosts x 8 jobs, building a ``Job`` for each
    renewed lease was most of a batched heartbeat's cost (issue 13). A job whose answer needs more
    (being stopped, or refused) comes back as the whole ``Job``."""

    job_id: str


@dataclass(frozen=True)
class WorkerBeat:
    """A worker heartbeat as the store recorded it: the worker now, when the server heard from it
    before this one, and the jobs the store holds running on it that its ``running`` list left out
    (empty when it sent no list), for the core to judge."""

    worker: Worker
    previous_contact: float | None
    #: the GPUs it had reported unhealthy before this heartbeat
    previous_unhealthy: tuple[int, ...] = ()
    unlisted: tuple[Job, ...] = ()


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
class ClusterCounts:
    """What the cluster gauges of ``/metrics`` show, counted by the store (no record per row)."""

    workers_by_status: dict[str, int]
    #: the GPUs of active workers
    active_gpus: int
    #: the GPUs held on active workers, by the status of the job holding them
    held_gpus_by_status: dict[str, int]


@dataclass(frozen=True)
class AdmissionInputs:
    """What the admission cycle reads: active capacity, every allocation, and the gangs that have a
    blocked or reserved task (each with all of its tasks, in ``gang_index`` order).

    Its jobs and workers carry no heartbeat readings: a job's ``last_heartbeat_at``, ``progress``,
    ``gpu_util_pct`` and ``rss_mb``, a worker's ``last_heartbeat_at`` and ``gpu_stats`` are None or
    empty (``rows.JOB_HEARTBEAT_READINGS``; no admission, preemption or fair-share rule reads them,
    and every change the cycle decides is applied to rows read again under their locks). So a row
    only renewed by heartbeats reads the same from pass to pass, and the store hands back the same
    record objects for unchanged rows (``rows.KeptConversions``). Everything else is as stored,
    ``last_checkpoint_at`` (a victim's cost) included."""

    workers: tuple[Worker, ...]
    allocations: tuple[Any, ...]
    gangs: tuple[tuple[str, tuple[Job, ...]], ...]
    #: every job holding resources (reserved, running, preempting), whole rows: the preemption
    #: planner's victims and the reservations it may roll back
    holding: tuple[Job, ...] = ()
    #: pending single jobs that may preempt (class at least the lowest running class), queue order
    pending: tuple[Job, ...] = ()


@dataclass(frozen=True, slots=True)
class Purged:
    """What one retention batch removed: jobs (with their events and checkpoints), and keys."""

    jobs: int = 0
    keys: int = 0


@dataclass(frozen=True)
class LogAppended:
    """What an append to an attempt's log did: ``size`` is where the stored stream ends now (the
    offset the next chunk starts at), ``accepted`` the bytes of this chunk newly stored (0 for a
    retry of a stored chunk), ``dropped`` how many of the attempt's first bytes are gone (trimmed to
    the cap), ``trimmed`` how many of them this append dropped."""

    job_id: str
    attempt: int
    size: int
    accepted: int
    dropped: int
    trimmed: int = 0


@dataclass(frozen=True)
class LogSlice:
    """Stored bytes of one attempt's log from ``start`` (an offset of its stream) to ``size``.

    ``start`` is the asked offset, or ``dropped`` when the bytes asked for were trimmed away; the
    job is returned as it was read, for a follow to know whether the attempt is still running."""

    job: Job
    attempt: int
    start: int
    size: int
    dropped: int
    data: bytes


class Store(Protocol):
    dialect: str

    def migrate(self) -> None: ...
    def close(self) -> None: ...
    def run_inline(self, work: Callable[[], T]) -> T:
        """``work()`` on the calling thread when the store can take it without waiting, else
        ``WouldWait`` with nothing written (see ``SqliteStore.run_inline``)."""
        ...

    def ping(self, timeout_s: float) -> None: ...

    # applying the core's decisions
    def change(self, job_id: str, decide: JobDecision[Outcome]) -> Outcome: ...
    def change_many(self, changes: Sequence[tuple[str, JobDecision[Any]]]) -> list[Any]:
        """``change`` for each, applied together: each one's outcome or the exception that refused
        it (rolled back alone); raises, with nothing written, when the group as a whole fails."""
        ...

    def change_gang(self, gang_id: str, decide: GangDecision[Outcome]) -> Outcome: ...

    def submit(
        self,
        submissions: Sequence[Submission],
        now: float,
        idempotency_key: str | None = None,
        fingerprint: str = "",
    ) -> SubmitResult: ...
    def get_job(self, job_id: str) -> Job | None: ...
    def list_jobs(self, filters: JobFilter, limit: int, after: tuple[float, str] | None) -> list[Job]: ...
    def gang_tasks(self, gang_id: str) -> list[Job]: ...
    def job_events(self, job_id: str) -> list[JobEvent]: ...
    def count_jobs_by_status(self) -> dict[str, int]: ...
    def cluster_counts(self) -> ClusterCounts: ...
    def count_jobs_by_pool(self) -> dict[str, dict[str, tuple[int, int]]]: ...

    # the job protocol
    def claim(
        self, worker_id: str, now: Stamp, policy: ClaimPolicy[Any], claim_key: str | None = None
    ) -> Job | None: ...
    def claim_many(
        self, worker_id: str, now: Stamp, policy: ClaimPolicy[Any], limit: int, claim_key: str | None = None
    ) -> list[Job]:
        """Up to ``limit`` claims for the worker in one transaction, in the order single claims
        would make them one after another (reserved tasks, then pending jobs in queue order).
        With ``claim_key``: the runs an earlier claim with that key started on the worker and
        that still run there, if any (their leases renewed), instead of new claims."""
        ...

    def claim_group(self, asks: Sequence[ClaimAsk], now: Stamp, policy: ClaimPolicy[Any]) -> list[list[Job]]:
        """``claim_many`` for each ask, in one transaction: each ask's jobs in the order of ``asks``,
        each claim seeing the ones before it. Raises, with nothing written, when any claim fails."""
        ...

    def heartbeat_job(
        self, job_id: str, worker_id: str, attempt: int, now: float, report: JobReport
    ) -> Job: ...
    def heartbeat_jobs(
        self, worker_id: str, now: float, beats: Sequence[tuple[str, int, JobReport]]
    ) -> list[Job | LeaseRenewed | None]: ...
    def save_checkpoint(
        self, job_id: str, data: bytes, now: float, decide: JobDecision[Outcome]
    ) -> Outcome: ...
    def get_checkpoint(self, job_id: str) -> bytes | None: ...

    # logs (store/logs.py)
    def append_log(
        self,
        job_id: str,
        offset: int,
        data: bytes,
        now: float,
        max_bytes: int,
        check: Callable[[Job], None],
    ) -> LogAppended: ...
    def read_log(self, job_id: str, attempt: int | None, offset: int, limit: int) -> LogSlice: ...
    def log_sizes(self, job_id: str) -> dict[int, tuple[int, int]]: ...
    def purge_logs(self, finished_before: float) -> int: ...

    # workers
    def register_worker(self, registration: WorkerRegistration, now: float) -> Worker: ...
    def worker_heartbeat(
        self,
        worker_id: str,
        now: float,
        gpu_stats: list[dict[str, Any]] | None,
        unhealthy_gpus: Sequence[int] | None = None,
        running: Sequence[str] | None = None,
    ) -> WorkerBeat: ...
    def dead_candidates(self, cutoff: float) -> list[str]: ...
    def change_worker(
        self, worker_id: str, decide: WorkerDecision
    ) -> tuple[Worker, WorkerContact] | None: ...
    def drain_worker(self, worker_id: str) -> Worker: ...
    # retention (``store.retention``)
    def purge_finished(self, cutoff: float, batch: int) -> Purged: ...
    def oldest_job_submitted_at(self) -> float | None: ...
    def size_bytes(self) -> int: ...
    def undrain_worker(self, worker_id: str) -> Worker: ...
    def get_worker(self, worker_id: str) -> WorkerView | None: ...
    def workers(self) -> list[Worker]: ...
    def list_workers(self) -> list[WorkerView]: ...
    def workers_by_id(self, worker_ids: Sequence[str]) -> dict[str, Worker]: ...
    def allocations(self) -> list[Allocation]: ...

    # the reaper's reads (each candidate is decided again, under lock, by the core)
    def expired_leases(self, cutoff: float) -> list[str]: ...
    def stuck_stops(self, cutoff: float) -> list[tuple[str, int]]: ...
    def gangs_to_complete(self) -> list[str]: ...
    def offline_candidates(self, cutoff: float) -> list[str]: ...

    # gangs (seeds 001 and 000)
    def admission_inputs(self) -> AdmissionInputs: ...
    def pending_in_pools(self, paths: Sequence[str], limit: int = ...) -> tuple[Job, ...]: ...
    def reserve_gang(
        self,
        gang_id: str,
        placements: Sequence[tuple[str, str, tuple[int, ...]]],
        policy: ClaimPolicy[Any],
        decide: Callable[[tuple[Job, ...], set[int]], Plan[tuple[Job, ...] | None]],
    ) -> tuple[Job, ...] | None: ...
    def preempt(
        self,
        job_ids: Sequence[str],
        gang_ids: Sequence[str],
        worker_ids: Sequence[str],
        port_worker: str | None,
        decide: PreemptionDecision[Outcome],
    ) -> Outcome: ...
    def replace_holds(self, holds: Sequence[Hold]) -> None: ...
    def list_holds(self) -> list[Hold]: ...
    def try_lead(self, loop: str) -> bool: ...

    # pools (the fair-share tree's settings; what they mean is ``corral.domain.pools``'s)
    def pools(self) -> dict[str, PoolSettings]: ...
    def put_pool(self, path: str, settings: PoolSettings, now: float) -> PoolSettings: ...
    def delete_pool(self, path: str) -> None: ...
    def pool_usage(self) -> dict[str, PoolUsage]: ...
    def pool_starvation(self) -> dict[str, StarvationState]: ...
    def put_pool_starvation(self, states: Mapping[str, StarvationState]) -> None: ...
