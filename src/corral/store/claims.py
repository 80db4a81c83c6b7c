"""The claim: work for a worker, in one transaction (the reserved tasks first, then pending jobs in
queue order, each one's capacity taken before the next is chosen), written once for both backends:
the ``Claims`` port, composed over the store's ``Database``, ``Dialect`` and ``Applier``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from corral.domain import errors
from corral.domain.pools import BorrowingView
from corral.domain.queue_order import QUEUE_ORDER as QUEUE_CRITERIA
from corral.domain.records import Allocation, Hold, Job, Worker
from corral.domain.resources import Resources
from corral.domain.status import Status, WorkerStatus
from corral.domain.transitions import Transition
from corral.store.base import ClaimAsk, ClaimPolicy, Stamp, stamp_of
from corral.store.dialect import Applier, Database, Dialect, worker_allocations
from corral.store.rows import (
    CLAIM_FIRST_PAGE,
    CLAIM_MAX_PAGE,
    HOLDING_SQL,
    JOB_SELECT,
    QUEUE_ORDER,
    RUNNABLE_SQL,
    WORKER_SELECT,
    Transaction,
    job_from_row,
    worker_from_row,
)


def _queue_key(job: Job) -> tuple[float | str, ...]:
    """A job's place in the queue, from the declaration the claim's ``ORDER BY`` comes from."""
    return tuple(-float(key.value(job)) if key.descending else key.value(job) for key in QUEUE_CRITERIA)


class SqlClaims:
    """``claim``, ``claim_many`` and ``claim_group``. A dialect may read the first candidates
    together with the worker's allocations (``Dialect.first_page_sql``: PostgreSQL saves a round
    trip)."""

    def __init__(self, db: Database, dialect: Dialect, applier: Applier) -> None:
        self.db = db
        self.dialect = dialect
        self.applier = applier

    def claim(
        self, worker_id: str, now: Stamp, policy: ClaimPolicy[Any], claim_key: str | None = None
    ) -> Job | None:
        """Claim work for ``worker_id`` in one transaction: its reserved task first, else the best fit
        (``claim_many`` with a limit of one)."""
        claimed = self.claim_many(worker_id, now, policy, 1, claim_key)
        return claimed[0] if claimed else None

    def claim_many(
        self, worker_id: str, now: Stamp, policy: ClaimPolicy[Any], limit: int, claim_key: str | None = None
    ) -> list[Job]:
        """Claim up to ``limit`` jobs for ``worker_id`` in one transaction: the jobs single claims
        would start one after another, each one's capacity taken before the next is chosen.

        0. A retried claim (``claim_key`` already on runs started on this worker, still running):
           those runs again, leases renewed, and nothing new. The first claim was applied and its
           answer lost (a server killed between commit and reply, a dropped connection): without
           this the worker would never run them and they would be lost with their lease.
        1. The worker, locked, and its allocations; a clock for ``now`` is read then, so the claims
           are stamped after every release they counted on.
        2. Tasks reserved for the worker, as ``policy.reserved_task`` names them (their capacity is
           already counted in the allocations).
        3. Pending jobs in queue order, pre-filtered in SQL by the worker's free capacity and checked
           by ``policy`` (constraints, GPU indices); on PostgreSQL locked ``SKIP LOCKED`` so replicas
           never hand out the same job.
        """
        with self.db.transaction() as tx:
            return self._claim_in(tx, worker_id, now, policy, limit, claim_key)

    def claim_group(self, asks: Sequence[ClaimAsk], now: Stamp, policy: ClaimPolicy[Any]) -> list[list[Job]]:
        """``claim_many`` for each ask, all in one transaction (the server's group commit of the
        claims that arrive in one turn of its event loop): each ask's jobs, in the order of
        ``asks``. The workers are locked in id order, the order every other writer of several
        worker rows takes them in. Each claim sees the ones before it (never the same job twice).
        Any failure raises with nothing of the group written: the caller applies the asks one by
        one, each for its own answer."""
        claimed: dict[int, list[Job]] = {}
        with self.db.transaction() as tx:
            for index in sorted(range(len(asks)), key=lambda index: asks[index].worker_id):
                ask = asks[index]
                claimed[index] = self._claim_in(tx, ask.worker_id, now, policy, ask.limit, ask.claim_key)
        return [claimed[index] for index in range(len(asks))]

    def _claim_in(
        self,
        tx: Transaction,
        worker_id: str,
        now: Stamp,
        policy: ClaimPolicy[Any],
        limit: int,
        claim_key: str | None,
    ) -> list[Job]:
        """``claim_many``'s work inside the transaction ``tx``."""
        # The worker, locked; whether any capacity is held on it (holds exist only while a gang
        # waits, so the common claim skips reading them); whether this claim is a retry.
        # Where the dialect reads the first candidates with the allocations, that read goes in the
        # same round trip as the worker's lock (it needs nothing from the worker's row; PostgreSQL
        # runs it once the lock is taken, so it sees every allocation committed before): a
        # round trip fewer per claim. Its rows are unused when the claim is a retry, the worker
        # drains or is not found; they stay locked until this short transaction ends, so a claim
        # beside it passes over them (SKIP LOCKED) as it does beside any claim.
        first_page_read = self._first_page_read(worker_id, limit)
        if first_page_read is None:
            rows, page_rows = tx.execute(self.claiming_worker_sql(), (claim_key, worker_id)), None
        else:
            rows, page_rows = tx.execute_each(
                [(self.claiming_worker_sql(), (claim_key, worker_id)), first_page_read]
            )
        if not rows:
            raise errors.NotFound(f"worker {worker_id} not found")
        worker, held, retried = worker_from_row(rows[0][:-2]), bool(rows[0][-2]), bool(rows[0][-1])
        if retried:
            return self._claimed_again(tx, worker_id, claim_key, stamp_of(now))
        if worker.status == WorkerStatus.DRAINING:
            return []
        allocations, first_page = self._allocations_and_first_page(tx, worker_id, page_rows)
        at = stamp_of(now)
        claimed = self._start_reserved(tx, worker, allocations, policy, at, limit, claim_key)
        if len(claimed) < limit:
            holds = self.holds_on(tx, worker_id) if held else []
            claimed += self._start_pending(
                tx, worker, allocations, holds, policy, at, limit - len(claimed), first_page, claim_key
            )
        return claimed

    def claiming_worker_sql(self) -> str:
        """The claim's first read: the worker's row, locked; whether capacity is held on it; whether
        a run started by a claim with this key (the first parameter) still runs on it (the
        ``jobs_claim_key`` index: one lookup, whatever the worker runs)."""
        return (
            f"SELECT {WORKER_SELECT}, EXISTS (SELECT 1 FROM holds WHERE holds.worker_id = workers.id),"
            " EXISTS (SELECT 1 FROM jobs WHERE jobs.claim_key = ? AND jobs.worker_id = workers.id"
            "  AND jobs.status = 'running')"
            f" FROM workers WHERE id = ?{self.dialect.lock_clause_plain}"
        )

    def _claimed_again(self, tx: Transaction, worker_id: str, claim_key: str | None, at: float) -> list[Job]:
        """The runs a claim with ``claim_key`` started on the worker, leases renewed from ``at``
        (the first answer was lost: the worker has not been heartbeating them); gang tasks first,
        then in the order they were submitted."""
        rows = tx.execute(
            "UPDATE jobs SET last_heartbeat_at = ? WHERE worker_id = ? AND claim_key = ?"
            f" AND status = 'running' RETURNING {JOB_SELECT}",
            (at, worker_id, claim_key),
        )
        jobs = map(job_from_row, rows)
        return sorted(jobs, key=lambda job: (job.gang_id is None, job.submitted_at, job.id))

    def _first_page_read(self, worker_id: str, limit: int) -> tuple[str, Sequence[Any]] | None:
        """The statement reading the worker's allocations and the first page of candidates
        together (``Dialect.first_page_sql``), or None where the dialect has none."""
        if self.dialect.first_page_sql is None:
            return None
        return self.dialect.first_page_sql, (worker_id, worker_id, max(CLAIM_FIRST_PAGE, limit))

    def _allocations_and_first_page(
        self, tx: Transaction, worker_id: str, rows: list[tuple[Any, ...]] | None
    ) -> tuple[list[Allocation], list[Job] | None]:
        """The worker's allocations, read once its row is locked; and, where the dialect reads them
        in the same round trip (``Dialect.first_page_sql``: ``rows``, that read's rows), the first
        page of pending candidates in queue order, filtered by a free capacity that is never less
        than the policy's. None: the candidates are read after, filtered by the policy's free
        capacity."""
        if rows is None:
            return worker_allocations(tx, worker_id), None
        held = [job_from_row(row[1:]) for row in rows if not row[0]]
        allocations = [
            Allocation(
                job.id, worker_id, job.spec.resources, job.gpu_indices, job.status, job.reservation_epoch
            )
            for job in held
        ]
        # a UNION keeps no order: the candidates are put back in queue order (the same declaration)
        candidates = sorted((job_from_row(row[1:]) for row in rows if row[0]), key=_queue_key)
        return allocations, candidates

    def _start_reserved(
        self,
        tx: Transaction,
        worker: Worker,
        allocations: list[Allocation],
        policy: ClaimPolicy[Any],
        at: float,
        limit: int,
        claim_key: str | None = None,
    ) -> list[Job]:
        """Start the tasks reserved for the worker, at most ``limit``. Each task tried is marked
        running in ``allocations`` (started, or not ours to start now), so the policy names the
        next one."""
        started_jobs: list[Job] = []
        while len(started_jobs) < limit:
            reserved = policy.reserved_task(worker, allocations)
            if reserved is None:
                break
            index = next(i for i, allocation in enumerate(allocations) if allocation.job_id == reserved)
            epoch = allocations[index].reservation_epoch
            allocations[index] = replace(allocations[index], status=Status.RUNNING)
            # SKIP LOCKED: a gang operation holding the gang's rows (a cancel, a rollback, a
            # re-reservation that waits for this worker's row) is never waited for here; and a
            # task that changed since the read above is no longer ours to start: nor is one
            # reserved again under a newer epoch than the one chosen (seed 001's epoch check).
            rows = tx.execute(
                f"SELECT {JOB_SELECT} FROM jobs WHERE id = ?{self.dialect.lock_clause}", (reserved,)
            )
            task = job_from_row(rows[0]) if rows else None
            started = (
                policy.start(task, worker.id, task.gpu_indices, at, claim_key, reservation_epoch=epoch)
                if task
                else None
            )
            if started is not None:
                started_jobs.append(self.applier.apply_transition(tx, started))
        return started_jobs

    def _start_pending(
        self,
        tx: Transaction,
        worker: Worker,
        allocations: list[Allocation],
        holds: list[Hold],
        policy: ClaimPolicy[Any],
        at: float,
        limit: int,
        first_page: list[Job] | None = None,
        claim_key: str | None = None,
    ) -> list[Job]:
        """Start up to ``limit`` pending jobs in queue order, each the first that fits what the
        ones before it left free.

        Candidates are read in pages filtered by the free capacity at the read; a start shrinks the
        capacity, so the next read filters by what is left and begins again at the head of the queue
        (the rows skipped so far fit even less now, but one refused for its constraints is read
        again: a few rows, never a job missed). ``first_page`` (read with the allocations, with a
        looser filter) stands for the first read; the next read begins again at the head too.
        """
        started_jobs: list[Job] = []
        starts: list[Transition] = []

        def borrowing_view() -> BorrowingView:
            self.applier.apply_transitions(tx, starts)  # the cluster's figures count them
            starts.clear()
            return self._borrowing_view(tx)

        def pool_held() -> Mapping[str, Resources]:
            self.applier.apply_transitions(tx, starts)  # the pools' figures count them
            starts.clear()
            return self._pool_held(tx)

        capacity = policy.capacity(worker, allocations)
        offset, page = 0, max(CLAIM_FIRST_PAGE, limit)
        while len(started_jobs) < limit:
            free = capacity.free
            if free.cpus < 0 or free.memory_mb < 0 or free.gpus < 0:
                break
            loose = first_page is not None
            if first_page is not None:
                candidates, first_page = first_page, None
            else:
                self.applier.apply_transitions(tx, starts)  # the read must see them started
                starts.clear()
                rows = tx.execute(
                    self.claim_candidates_sql(),
                    (free.gpus, free.memory_mb, free.cpus, free.vram_mb, page, offset),
                )
                candidates = [job_from_row(row) for row in rows]
            read = len(candidates)
            before = len(started_jobs)
            throttled = False  # a start left out its array's other tasks: read again to count it
            while len(started_jobs) < limit:
                chosen = policy.choose(worker, capacity, candidates, holds, at, borrowing_view, pool_held)
                if chosen is None:
                    break
                job, gpu_indices = chosen
                started = policy.start(job, worker.id, gpu_indices, at, claim_key)
                if started is None:  # the candidates are pending and locked: cannot happen
                    raise errors.Conflict(f"job {job.id} cannot be started; retry")
                starts.append(started)  # written before the next read, or at the end
                started_jobs.append(started.after)
                allocations.append(
                    Allocation(job.id, worker.id, job.spec.resources, tuple(gpu_indices), Status.RUNNING)
                )
                capacity = policy.capacity(worker, allocations)
                candidates = [candidate for candidate in candidates if candidate.id != job.id]
                if job.array_throttle is not None:
                    # the page counted the array's running tasks before this start: its other tasks
                    # wait for the next read, which counts this one too (RUNNABLE_SQL)
                    candidates = [candidate for candidate in candidates if candidate.array_id != job.array_id]
                    throttled = True
            if read < page and not throttled:
                break  # the queue holds nothing more that fits
            if len(started_jobs) > before or loose:
                offset = 0  # capacity shrank, or another filter: again from the head of the queue
            else:
                offset += page
                page = min(page * 8, CLAIM_MAX_PAGE)
        self.applier.apply_transitions(tx, starts)
        return started_jobs

    def _borrowing_view(self, tx: Transaction) -> BorrowingView:
        """GPUs free on usable workers, each pool's guaranteed GPUs and the GPUs its jobs hold: read
        only when the policy asks (a candidate no preemption could take back), in its transaction."""
        guaranteed = {
            str(row[0]): int(row[1])
            for row in tx.execute("SELECT path, guarantee_gpus FROM pools WHERE guarantee_gpus > 0")
        }
        if not guaranteed:
            return BorrowingView(0, {}, {})
        held = {
            str(row[0]): int(row[1] or 0)
            for row in tx.execute(
                f"SELECT pool, SUM(gpus) FROM jobs WHERE status IN {HOLDING_SQL} GROUP BY pool"
            )
        }
        total = tx.execute(
            "SELECT COALESCE(SUM(gpus), 0) FROM workers WHERE status = 'active' AND flagged_dead_at IS NULL"
        )[0][0]
        busy = tx.execute(
            "SELECT COALESCE(SUM(jobs.gpus), 0) FROM jobs JOIN workers ON jobs.worker_id = workers.id"
            f" WHERE jobs.status IN {HOLDING_SQL} AND workers.status = 'active'"
            " AND workers.flagged_dead_at IS NULL"
        )[0][0]
        return BorrowingView(int(total) - int(busy), guaranteed, held)

    def _pool_held(self, tx: Transaction) -> Mapping[str, Resources]:
        """What each pool's own jobs hold (GPUs, memory, CPUs): read only when the policy asks (a
        candidate of a pool with limits), in its transaction. The limited pools' rows are locked
        first (PostgreSQL): two claims that could each take such a pool past its limits are
        serialised, the second reading the first's starts."""
        tx.execute(
            "SELECT path FROM pools WHERE limit_gpus IS NOT NULL ORDER BY path"
            f"{self.dialect.lock_clause_plain}"
        )
        rows = tx.execute(
            f"SELECT pool, SUM(gpus), SUM(memory_mb), SUM(cpus) FROM jobs WHERE status IN {HOLDING_SQL}"
            " GROUP BY pool"
        )
        return {
            str(row[0]): Resources(int(row[1] or 0), 0, int(row[2] or 0), int(row[3] or 0)) for row in rows
        }

    def claim_candidates_sql(self) -> str:
        """The claim's candidate query: pending jobs that fit the free capacity, in queue order.

        Parameters: free gpus, memory_mb, cpus, per-GPU vram_mb, page size, offset. Its ORDER BY is
        the ``jobs_queue`` index (the PostgreSQL ``EXPLAIN`` guard checks the plan uses it).
        """
        return (
            f"SELECT {JOB_SELECT} FROM jobs{self.dialect.queue_index_hint}"
            f" WHERE status = 'pending' AND gang_id IS NULL AND {RUNNABLE_SQL}"
            " AND gpus <= ? AND memory_mb <= ? AND cpus <= ? AND (gpus = 0 OR vram_mb <= ?)"
            f" ORDER BY {QUEUE_ORDER} LIMIT ? OFFSET ?{self.dialect.lock_clause}"
        )

    def holds_on(self, tx: Transaction, worker_id: str) -> list[Hold]:
        """The capacity held on a worker for waiting gangs (written by the admission leader)."""
        rows = tx.execute(
            "SELECT worker_id, gang_id, gpus, vram_mb, memory_mb, cpus, expected_at FROM holds"
            " WHERE worker_id = ? ORDER BY gang_id",
            (worker_id,),
        )
        return [Hold(row[1], row[0], Resources(row[2], row[3], row[4], row[5]), row[6]) for row in rows]
