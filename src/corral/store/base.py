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

from corral.domain.pools import BorrowingView
from corral.domain.records import Allocation, Hold, Job, Worker, WorkerContact
from corral.domain.resources import Resources
from corral.domain.transitions import Outcome, Plan, Transition

#: A change's time: a fixed instant, or a clock the store reads inside the transaction, once it has
#: read the state the change depends on (a claim: the worker's allocations). With store calls on
#: several threads, a time read when the request arrived can come before a release another thread
#: committed meanwhile and the claim used: the history would show the worker over capacity.
Stamp = float | Callable[[], float]


def stamp_of(now: Stamp) -> float:
    """The instant ``now`` names: itself, or its clock read now."""
    return now() if callable(now) else now


class WouldWait(Exception):
    """``Backend.run_inline``: the work would have had to wait for a lock (or the backend never runs
    work inline); nothing was written, so the caller runs it again on a store thread."""


@dataclass(frozen=True)
class ClaimAsk:
    """One claim of a group (``Claims.claim_group``): up to ``limit`` jobs for the worker, with the
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
        pool_held: Callable[[], Mapping[str, Resources]] | None = None,
    ) -> tuple[Job, tuple[int, ...]] | None:
        """The first candidate that fits and may start (``corral.core.claim``). ``borrowing_view``
        reads the cluster's borrowing figures, in the claim's transaction, when the policy needs
        them; None: nothing is borrowed. ``pool_held`` reads what each pool's jobs hold, likewise
        (pool limits); None: no limit is enforced."""
        ...

    def start(
        self,
        job: Job,
        worker_id: str,
        gpu_indices: Sequence[int],
        now: float,
        claim_key: str | None = None,
        reservation_epoch: int | None = None,
    ) -> Transition | None:
        """The claim's transition (pending, or reserved for this worker -> running), recording the
        claim's ``claim_key``; None when the job may not be started by this worker, or is reserved
        under another epoch than ``reservation_epoch`` (the one the claim chose)."""
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
    """A lease ``Jobs.heartbeat_jobs`` renewed on a job that runs (not being stopped).

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
    #: the leases of its jobs renewed with it (``Workers.worker_heartbeat``'s ``jobs``), each
    #: answered as ``Jobs.heartbeat_jobs`` answers it
    renewed: tuple[Job | LeaseRenewed | None, ...] = ()


@dataclass(frozen=True)
class Submitted:
    """One submitted item: a single job, a gang (its tasks in ``gang_index`` order), or an array
    (its tasks in index order)."""

    job: Job | None = None
    gang_id: str | None = None
    tasks: tuple[Job, ...] = ()
    array_id: str | None = None


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
    #: the submitter (the job's ``user``)
    user: str | None = None
    #: newest first (``GET /jobs?order=newest``): by submission time then id, both descending, and
    #: the cursor's ``after`` means "older than"
    newest: bool = False
    array_id: str | None = None


@dataclass(frozen=True)
class WorkerRegistration:
    id: str
    address: str
    resources: Resources
    gpu_model: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    enforcement: dict[str, str] = field(default_factory=dict)


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
