"""The store's ports: what corral reads and changes, one small protocol per concern.

A caller types against the port it uses (the claim route against ``Claims``, the reaper against
``Jobs`` and ``Workers``), so that what each part of the server may ask of the store is written
where it is used. The store object the server holds (``Store``) is the database, with every port
as an attribute. What each value means is ``store.base``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from corral.domain.history import ClusterSample
from corral.domain.pools import PoolSettings, PoolUsage, StarvationState
from corral.domain.records import Allocation, Hold, Job, JobEvent, Worker, WorkerContact
from corral.domain.status import Status
from corral.domain.transitions import Outcome, Plan, Submission
from corral.domain.usage import UsageTotals
from corral.store.base import (
    AdmissionInputs,
    ClaimAsk,
    ClaimPolicy,
    ClusterCounts,
    GangDecision,
    JobDecision,
    JobFilter,
    JobReport,
    LeaseRenewed,
    LogAppended,
    LogSlice,
    PreemptionDecision,
    Purged,
    Stamp,
    SubmitResult,
    WorkerBeat,
    WorkerDecision,
    WorkerRegistration,
    WorkerView,
)

T = TypeVar("T")


class Backend(Protocol):
    """The database itself: its schema, its connections, the loops' leadership."""

    dialect: str

    def migrate(self) -> None: ...
    def close(self) -> None: ...
    def run_inline(self, work: Callable[[], T]) -> T:
        """``work()`` on the calling thread when the store can take it without waiting, else
        ``WouldWait`` with nothing written (see ``SqliteStore.run_inline``)."""
        ...

    def ping(self, timeout_s: float, write: bool = False) -> None:
        """``StoreUnavailable`` unless the store answers and a writer could take it within
        ``timeout_s``; ``write``: and a write that changes nothing commits."""
        ...

    def try_lead(self, loop: str) -> bool: ...


class Jobs(Protocol):
    """Jobs and their transitions: every change of a job's status is a core decision applied here."""

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
        key_owner: str = "",
    ) -> SubmitResult: ...
    def get_job(self, job_id: str) -> Job | None: ...
    def list_jobs(self, filters: JobFilter, limit: int, after: tuple[float, str] | None) -> list[Job]: ...
    def array_tasks(self, array_id: str, limit: int) -> list[Job]: ...
    def array_counts(self, array_id: str) -> dict[str, int]: ...
    def task_statuses(self, ids: Sequence[str]) -> dict[str, tuple[Status, ...]]:
        """Each id naming a job, a gang or an array: its tasks' statuses (an unknown id left out)."""
        ...

    def awaiting_dependencies(self, limit: int) -> list[Job]: ...
    def gang_tasks(self, gang_id: str) -> list[Job]: ...
    def job_events(self, job_id: str) -> list[JobEvent]: ...
    def count_jobs_by_status(self) -> dict[str, int]: ...
    def cluster_counts(self) -> ClusterCounts: ...
    def count_jobs_by_pool(self) -> dict[str, dict[str, tuple[int, int]]]: ...
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

    # the reaper's reads (each candidate is decided again, under lock, by the core)
    def expired_leases(self, cutoff: float) -> list[str]: ...
    def stuck_stops(self, cutoff: float) -> list[tuple[str, int]]: ...
    def gangs_to_complete(self) -> list[str]: ...


class Claims(Protocol):
    """The claim: a worker's next jobs, chosen by the core's ``ClaimPolicy`` on locked rows."""

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


class Gangs(Protocol):
    """Gangs and reservations (seeds 001 and 000): the admission cycle's reads and its effects."""

    def admission_inputs(self) -> AdmissionInputs: ...
    def pending_in_pools(self, paths: Sequence[str], limit: int = ...) -> tuple[Job, ...]: ...
    def preemptors_ahead(self, job: Job, limit: int = ...) -> int | None: ...
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


class Pools(Protocol):
    """The fair-share tree's settings (what they mean is ``corral.domain.pools``'s) and usage."""

    def pools(self) -> dict[str, PoolSettings]: ...
    def put_pool(self, path: str, settings: PoolSettings, now: float) -> PoolSettings: ...
    def delete_pool(self, path: str) -> None: ...
    def pool_usage(self) -> dict[str, PoolUsage]: ...
    def pool_starvation(self) -> dict[str, StarvationState]: ...
    def put_pool_starvation(self, states: Mapping[str, StarvationState]) -> None: ...


class Logs(Protocol):
    """Each attempt's output (``store.logs``)."""

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


class Workers(Protocol):
    """Workers: registration, heartbeats, drains, and the liveness rules' candidates and writes."""

    def register_worker(self, registration: WorkerRegistration, now: float) -> Worker: ...
    def worker_heartbeat(
        self,
        worker_id: str,
        now: float,
        gpu_stats: list[dict[str, Any]] | None,
        unhealthy_gpus: Sequence[int] | None = None,
        running: Sequence[str] | None = None,
        jobs: Sequence[tuple[str, int, JobReport]] = (),
    ) -> WorkerBeat:
        """The worker's heartbeat, and with it the leases ``jobs`` it carries (SQLite: in its
        transaction; PostgreSQL: right after it commits, never under the worker's row lock, which
        a preemption takes after its victims' rows), renewed only if the heartbeat is taken and
        answered in ``WorkerBeat.renewed``. ``jobs`` must name each job once, and only jobs that ``running``
        lists when it is given: a job it leaves out is judged (``WorkerBeat.unlisted``) before its
        lease may be renewed (``Jobs.heartbeat_jobs``, after)."""
        ...

    def dead_candidates(self, cutoff: float) -> list[str]: ...
    def offline_candidates(self, cutoff: float) -> list[str]: ...
    def change_worker(
        self, worker_id: str, decide: WorkerDecision
    ) -> tuple[Worker, WorkerContact] | None: ...
    def drain_worker(self, worker_id: str) -> Worker: ...
    def undrain_worker(self, worker_id: str) -> Worker: ...
    def remove_worker(self, worker_id: str, refused: Callable[[Worker, int], str | None]) -> None: ...
    def get_worker(self, worker_id: str) -> WorkerView | None: ...
    def workers(self) -> list[Worker]: ...
    def list_workers(self) -> list[WorkerView]: ...
    def workers_by_id(self, worker_ids: Sequence[str]) -> dict[str, Worker]: ...
    def allocations(self) -> list[Allocation]: ...


class Retention(Protocol):
    """Finished work removed past its retention (``store.retention``), and the store's size."""

    def purge_finished(self, cutoff: float, batch: int) -> Purged: ...
    def oldest_job_submitted_at(self) -> float | None: ...
    def size_bytes(self) -> int: ...


class Usage(Protocol):
    """Usage accounting (``store.usage``): a window's attempts summed per group, and the rows
    past their retention removed."""

    def usage_totals(
        self, since: float, until: float, by: tuple[str, ...], now: float, user: str | None = None
    ) -> list[UsageTotals]: ...
    def usage_waits(
        self, since: float, until: float, by: tuple[str, ...], now: float, user: str | None = None
    ) -> list[tuple[str | None, str | None, float]]: ...
    def purge_usage(self, cutoff: float, batch: int) -> int: ...


class History(Protocol):
    """The cluster's history (``store.history``, ``domain.history``): a sample a minute, written
    once per minute whoever writes it, read for a window, removed past its retention."""

    def record_sample(self, sample: ClusterSample) -> bool: ...
    def samples(self, since: float, until: float) -> list[ClusterSample]: ...
    def gpus_by_worker_status(self) -> dict[str, tuple[int, int]]: ...
    def purge_samples(self, cutoff: float, batch: int) -> int: ...


class Store(Backend, Protocol):
    """What the server holds: the database, with every port as an attribute (``store.jobs.change``,
    ``store.claims.claim_many``). Type a caller against the ports it uses, not this, unless it
    uses several."""

    @property
    def jobs(self) -> Jobs: ...
    @property
    def claims(self) -> Claims: ...
    @property
    def gangs(self) -> Gangs: ...
    @property
    def workers(self) -> Workers: ...
    @property
    def pools(self) -> Pools: ...
    @property
    def logs(self) -> Logs: ...
    @property
    def retention(self) -> Retention: ...
    @property
    def usage(self) -> Usage: ...
    @property
    def history(self) -> History: ...
