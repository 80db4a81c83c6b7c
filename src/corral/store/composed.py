"""The store object the server holds: the core it inherits (``SqlStore``: decisions applied, jobs,
checkpoints) with the concerns that are composed rather than inherited: the claim (``SqlClaims``),
gangs and reservations (``SqlGangs``), workers (``SqlWorkers``), pools (``SqlPools``), logs (``SqlLogs``) and
retention (``SqlRetention``), each built over the backend's ``Database`` and its ``Dialect`` (and
the claim and the gangs over the core's ``Applier``). The methods below only hand each call to its part
(``store.ports`` names the ports a caller types against); a backend overrides one where its SQL
differs (PostgreSQL's worker heartbeat in one statement).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from corral.domain.pools import PoolSettings, PoolUsage, StarvationState
from corral.domain.queue_order import PREEMPTOR_CANDIDATES
from corral.domain.records import Hold, Job, Worker, WorkerContact
from corral.domain.transitions import Outcome, Plan
from corral.store.base import (
    AdmissionInputs,
    ClaimAsk,
    ClaimPolicy,
    ClusterCounts,
    LogAppended,
    LogSlice,
    PreemptionDecision,
    Purged,
    Stamp,
    WorkerBeat,
    WorkerDecision,
    WorkerRegistration,
    WorkerView,
)
from corral.store.claims import SqlClaims
from corral.store.gangs import SqlGangs
from corral.store.logs import SqlLogs
from corral.store.operations import SqlWorkers
from corral.store.pools import SqlPools
from corral.store.retention import SqlRetention
from corral.store.sql import SqlStore


class ComposedStore(SqlStore):
    """``SqlStore`` with its composed parts; a backend calls ``_compose`` once its connections
    are set up."""

    _claims: SqlClaims
    _gangs: SqlGangs
    _workers: SqlWorkers
    _pools: SqlPools
    _logs: SqlLogs
    _retention: SqlRetention

    def _compose(self) -> None:
        self._claims = SqlClaims(self, self.sql_dialect, self)
        self._gangs = SqlGangs(self, self.sql_dialect, self)
        self._workers = SqlWorkers(self, self.sql_dialect)
        self._pools = SqlPools(self, self.sql_dialect)
        self._logs = SqlLogs(self, self.sql_dialect)
        self._retention = SqlRetention(self, self.sql_dialect)

    # --- SqlClaims (claims.py) ---

    def claim(
        self, worker_id: str, now: Stamp, policy: ClaimPolicy[Any], claim_key: str | None = None
    ) -> Job | None:
        return self._claims.claim(worker_id, now, policy, claim_key)

    def claim_many(
        self, worker_id: str, now: Stamp, policy: ClaimPolicy[Any], limit: int, claim_key: str | None = None
    ) -> list[Job]:
        return self._claims.claim_many(worker_id, now, policy, limit, claim_key)

    def claim_group(self, asks: Sequence[ClaimAsk], now: Stamp, policy: ClaimPolicy[Any]) -> list[list[Job]]:
        return self._claims.claim_group(asks, now, policy)

    def claiming_worker_sql(self) -> str:
        return self._claims.claiming_worker_sql()

    def claim_candidates_sql(self) -> str:
        return self._claims.claim_candidates_sql()

    # --- SqlGangs (gangs.py) ---

    def admission_inputs(self) -> AdmissionInputs:
        return self._gangs.admission_inputs()

    def pending_in_pools(self, paths: Sequence[str], limit: int = PREEMPTOR_CANDIDATES) -> tuple[Job, ...]:
        return self._gangs.pending_in_pools(paths, limit)

    def reserve_gang(
        self,
        gang_id: str,
        placements: Sequence[tuple[str, str, tuple[int, ...]]],
        policy: ClaimPolicy[Any],
        decide: Callable[[tuple[Job, ...], set[int]], Plan[tuple[Job, ...] | None]],
    ) -> tuple[Job, ...] | None:
        return self._gangs.reserve_gang(gang_id, placements, policy, decide)

    def preempt(
        self,
        job_ids: Sequence[str],
        gang_ids: Sequence[str],
        worker_ids: Sequence[str],
        port_worker: str | None,
        decide: PreemptionDecision[Outcome],
    ) -> Outcome:
        return self._gangs.preempt(job_ids, gang_ids, worker_ids, port_worker, decide)

    def replace_holds(self, holds: Sequence[Hold]) -> None:
        return self._gangs.replace_holds(holds)

    def list_holds(self) -> list[Hold]:
        return self._gangs.list_holds()

    # --- SqlWorkers (operations.py) ---

    def register_worker(self, registration: WorkerRegistration, now: float) -> Worker:
        return self._workers.register_worker(registration, now)

    def worker_heartbeat(
        self,
        worker_id: str,
        now: float,
        gpu_stats: list[dict[str, Any]] | None,
        unhealthy_gpus: Sequence[int] | None = None,
        running: Sequence[str] | None = None,
    ) -> WorkerBeat:
        return self._workers.worker_heartbeat(worker_id, now, gpu_stats, unhealthy_gpus, running)

    def drain_worker(self, worker_id: str) -> Worker:
        return self._workers.drain_worker(worker_id)

    def undrain_worker(self, worker_id: str) -> Worker:
        return self._workers.undrain_worker(worker_id)

    def get_worker(self, worker_id: str) -> WorkerView | None:
        return self._workers.get_worker(worker_id)

    def workers(self) -> list[Worker]:
        return self._workers.workers()

    def list_workers(self) -> list[WorkerView]:
        return self._workers.list_workers()

    def cluster_counts(self) -> ClusterCounts:
        return self._workers.cluster_counts()

    def workers_by_id(self, worker_ids: Sequence[str]) -> dict[str, Worker]:
        return self._workers.workers_by_id(worker_ids)

    def dead_candidates(self, cutoff: float) -> list[str]:
        return self._workers.dead_candidates(cutoff)

    def offline_candidates(self, cutoff: float) -> list[str]:
        return self._workers.offline_candidates(cutoff)

    def change_worker(self, worker_id: str, decide: WorkerDecision) -> tuple[Worker, WorkerContact] | None:
        return self._workers.change_worker(worker_id, decide)

    def expired_leases(self, cutoff: float) -> list[str]:
        return self._workers.expired_leases(cutoff)

    def stuck_stops(self, cutoff: float) -> list[tuple[str, int]]:
        return self._workers.stuck_stops(cutoff)

    def gangs_to_complete(self) -> list[str]:
        return self._workers.gangs_to_complete()

    # --- SqlPools (pools.py) ---

    def pools(self) -> dict[str, PoolSettings]:
        return self._pools.pools()

    def put_pool(self, path: str, settings: PoolSettings, now: float) -> PoolSettings:
        return self._pools.put_pool(path, settings, now)

    def delete_pool(self, path: str) -> None:
        return self._pools.delete_pool(path)

    def pool_starvation(self) -> dict[str, StarvationState]:
        return self._pools.pool_starvation()

    def put_pool_starvation(self, states: Mapping[str, StarvationState]) -> None:
        return self._pools.put_pool_starvation(states)

    def pool_usage(self) -> dict[str, PoolUsage]:
        return self._pools.pool_usage()

    # --- SqlLogs (logs.py) ---

    def append_log(
        self,
        job_id: str,
        offset: int,
        data: bytes,
        now: float,
        max_bytes: int,
        check: Callable[[Job], None],
    ) -> LogAppended:
        return self._logs.append_log(job_id, offset, data, now, max_bytes, check)

    def read_log(self, job_id: str, attempt: int | None, offset: int, limit: int) -> LogSlice:
        return self._logs.read_log(job_id, attempt, offset, limit)

    def log_sizes(self, job_id: str) -> dict[int, tuple[int, int]]:
        return self._logs.log_sizes(job_id)

    def purge_logs(self, finished_before: float) -> int:
        return self._logs.purge_logs(finished_before)

    # --- SqlRetention (retention.py) ---

    def purge_finished(self, cutoff: float, batch: int) -> Purged:
        return self._retention.purge_finished(cutoff, batch)

    def oldest_job_submitted_at(self) -> float | None:
        return self._retention.oldest_job_submitted_at()
