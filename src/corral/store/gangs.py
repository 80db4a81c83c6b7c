"""Gang reads and writes of the store: the admission cycle's inputs, reserving all-or-nothing,
checkpoints, holds and loop leadership. Seeds 001 (gang scheduling) and 000 (gang drain) are the
specification; the rules themselves are ``corral.core.drain``'s.

Every gang operation locks the gang's task rows in id order first (``FOR UPDATE ... ORDER BY id`` on
PostgreSQL, the single writer on SQLite), so two replicas acting on one gang serialize instead of
deadlocking, and each decision is made on rows no one else can change under it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

from corral.domain import errors
from corral.domain.queue_order import PREEMPTOR_CANDIDATES, preemptor_floor
from corral.domain.records import Allocation, Hold, Job, Worker
from corral.domain.resources import Resources
from corral.domain.transitions import Outcome, Plan
from corral.store.base import AdmissionInputs, ClaimPolicy, PreemptionDecision
from corral.store.dialect import Applier, Database, Dialect, load_worker, lock_gang, worker_allocations
from corral.store.rows import (
    HOLDING_SQL,
    JOB_HEARTBEAT_READINGS,
    JOB_SELECT,
    JOB_SPEC_COLUMNS,
    QUEUE_ORDER,
    RUNNABLE_SQL,
    WORKER_HEARTBEAT_READINGS,
    KeptConversions,
    KeptConversionsRead,
    Transaction,
    job_from_row,
    select_without,
    worker_from_row,
)
from corral.store.schema import JOB_COLUMNS, WORKER_COLUMNS

#: the admission cycle's select lists: every column, but the heartbeats' readings as NULL
ADMISSION_JOB_SELECT = select_without(JOB_COLUMNS, JOB_HEARTBEAT_READINGS)
ADMISSION_WORKER_SELECT = select_without(WORKER_COLUMNS, WORKER_HEARTBEAT_READINGS)
#: what of a job's row the admission cycle reads first: the columns that may change after the submit
#: (the id first), compared with those of the kept records; the whole rows only where they differ
_CHANGEABLE_JOB_COLUMNS = tuple(
    column for column in JOB_COLUMNS if column not in JOB_SPEC_COLUMNS | JOB_HEARTBEAT_READINGS
)
ADMISSION_JOB_PARTS_SELECT = ", ".join(_CHANGEABLE_JOB_COLUMNS)
changeable_job_part = itemgetter(*(JOB_COLUMNS.index(column) for column in _CHANGEABLE_JOB_COLUMNS))
#: whole rows read by id at most this many at a time; more than ``WHOLE_ROWS_AT_ONCE`` (a first
#: pass) are read with the query's own condition, all at once
WHOLE_ROWS_BY_ID = 500
WHOLE_ROWS_AT_ONCE = 2000
#: where the dialect has it (``Dialect.row_text``), the changeable columns as one text instead: the
#: part read is then (id, that text), and the whole rows carry the text as a last column. At
#: 10,000 hosts x 8 a pass fetched and compared 80,000 rows of 35 values each only to find them
#: unchanged; two values a row cost the pass's Python a fraction of that.
ADMISSION_JOB_TEXT = f"ROW({ADMISSION_JOB_PARTS_SELECT})::text"


def text_part(row: Sequence[Any]) -> tuple[Any, Any]:
    """The part compared of a whole row read with ``ADMISSION_JOB_TEXT`` last: (id, that text)."""
    return row[0], row[-1]


def admission_record_of_text_row(row: Sequence[Any]) -> tuple[Job, Allocation | None]:
    """``admission_record`` of a whole row read with ``ADMISSION_JOB_TEXT`` last."""
    return admission_record(row[:-1])


def admission_record(row: Sequence[Any]) -> tuple[Job, Allocation | None]:
    """A job of the admission snapshot and, where it is placed, its allocation (kept with it, so
    that the cycle's per-worker lists hold the same allocation objects from pass to pass)."""
    job = job_from_row(row)
    if job.worker_id is None:
        return job, None
    return job, Allocation(job.id, job.worker_id, job.spec.resources, job.gpu_indices, job.status)


class SqlGangs:
    """The ``Gangs`` port: the admission cycle's reads, reservations, preemptions and holds,
    composed over the store's ``Database``, ``Dialect`` and ``Applier``."""

    #: the admission snapshot's records, kept between passes (``admission_inputs``); made on the
    #: first pass, one pair per store instance (each replica has its own)
    _admission_jobs: KeptConversions[tuple[Job, Allocation | None]] | None = None
    _admission_workers: KeptConversions[Worker] | None = None

    def __init__(self, db: Database, dialect: Dialect, applier: Applier) -> None:
        self.db = db
        self.dialect = dialect
        self.applier = applier
        #: what the admission read selects of a job: the part compared with the kept records', and
        #: the whole row (``ADMISSION_JOB_TEXT``)
        self._parts_select = ADMISSION_JOB_PARTS_SELECT
        self._whole_select = ADMISSION_JOB_SELECT
        if dialect.row_text:
            self._parts_select = f"id, {ADMISSION_JOB_TEXT}"
            self._whole_select = f"{ADMISSION_JOB_SELECT}, {ADMISSION_JOB_TEXT}"

    # --- reads ---------------------------------------------------------------------------

    def admission_inputs(self) -> AdmissionInputs:
        """The admission cycle's snapshot (``AdmissionInputs``: its jobs and workers carry no
        heartbeat readings). Records whose rows did not change since the last call are the same
        objects as then (``KeptConversions``), so a pass converts only what moved; of the jobs'
        rows it reads first the columns that may change, and whole rows only where they did."""
        if self._admission_jobs is None or self._admission_workers is None:
            self._admission_jobs = (
                KeptConversions(admission_record_of_text_row, text_part)
                if self.dialect.row_text
                else KeptConversions(admission_record, changeable_job_part)
            )
            self._admission_workers = KeptConversions(worker_from_row)
        reader = self.db.read()
        job_reading = self._admission_jobs.read()
        worker_reading = self._admission_workers.read()
        gangs: dict[str, list[Job]] = {}
        in_waiting_gangs = (
            "gang_id IN (SELECT DISTINCT gang_id FROM jobs"
            " WHERE gang_id IS NOT NULL AND status IN ('blocked', 'reserved'))"
        )
        for job, _ in self._admission_jobs_where(
            reader, job_reading, in_waiting_gangs, "gang_id, gang_index"
        ):
            gangs.setdefault(job.gang_id or "", []).append(job)
        workers = tuple(
            worker_reading.records(
                reader.execute(f"SELECT {ADMISSION_WORKER_SELECT} FROM workers ORDER BY registered_at, id")
            )
        )
        held = self._admission_jobs_where(
            reader, job_reading, f"status IN {HOLDING_SQL} AND worker_id IS NOT NULL", "id"
        )
        holding = tuple(job for job, _ in held)
        floor = preemptor_floor(holding)
        pending: tuple[Job, ...] = ()
        if floor is not None:  # single jobs that might preempt: none can take from a class above theirs
            candidates = self._admission_jobs_where(
                reader,
                job_reading,
                f"status = 'pending' AND gang_id IS NULL AND preemption_class >= ? AND {RUNNABLE_SQL}",
                f"{QUEUE_ORDER} LIMIT ?",
                (floor,),
                (PREEMPTOR_CANDIDATES,),
            )
            pending = tuple(job for job, _ in candidates)
        job_reading.finish()
        worker_reading.finish()
        return AdmissionInputs(
            workers=workers,
            allocations=tuple(allocation for _, allocation in held if allocation is not None),
            gangs=tuple((gang_id, tuple(tasks)) for gang_id, tasks in sorted(gangs.items())),
            holding=holding,
            pending=pending,
        )

    def _admission_jobs_where(
        self,
        reader: Transaction,
        job_reading: KeptConversionsRead[tuple[Job, Allocation | None]],
        condition: str,
        order: str,
        params: Sequence[Any] = (),
        order_params: Sequence[Any] = (),
    ) -> list[tuple[Job, Allocation | None]]:
        """The admission records of the jobs ``condition`` selects, in ``order``: their changeable
        columns first, then the whole rows of those not kept, read again under ``condition`` (a
        row that left it meanwhile is left out, as if read a moment later)."""
        parts_select, whole_select = self._parts_select, self._whole_select
        parts = reader.execute(
            f"SELECT {parts_select} FROM jobs WHERE {condition} ORDER BY {order}", (*params, *order_params)
        )

        def whole_rows(job_ids: list[str]) -> list[tuple[Any, ...]]:
            if len(job_ids) > WHOLE_ROWS_AT_ONCE:
                return reader.execute(f"SELECT {whole_select} FROM jobs WHERE {condition}", params)
            rows: list[tuple[Any, ...]] = []
            for start in range(0, len(job_ids), WHOLE_ROWS_BY_ID):
                some = job_ids[start : start + WHOLE_ROWS_BY_ID]
                rows += reader.execute(
                    f"SELECT {whole_select} FROM jobs WHERE ({condition})"
                    f" AND id IN ({', '.join('?' for _ in some)})",
                    (*params, *some),
                )
            return rows

        return job_reading.records(parts, whole_rows)

    def pending_in_pools(self, paths: Sequence[str], limit: int = PREEMPTOR_CANDIDATES) -> tuple[Job, ...]:
        """Pending single jobs of ``paths``' subtrees, in queue order, at most ``limit``: the
        starving pools' candidates to preempt for fair share, whatever their class."""
        if not paths:
            return ()
        within = " OR ".join("(pool = ? OR substr(pool, 1, length(?)) = ?)" for _ in paths)
        parameters: list[object] = []
        for path in paths:
            parameters.extend((path, path + "/", path + "/"))
        rows = self.db.read().execute(
            f"SELECT {JOB_SELECT} FROM jobs WHERE status = 'pending' AND gang_id IS NULL AND ({within})"
            f" AND {RUNNABLE_SQL}"
            f" ORDER BY {QUEUE_ORDER} LIMIT ?",
            (*parameters, limit),
        )
        return tuple(job_from_row(row) for row in rows)

    def preemptors_ahead(self, job: Job, limit: int = PREEMPTOR_CANDIDATES) -> int | None:
        """How many possible preemptors the cycle's read by class (``admission_inputs``) puts ahead
        of ``job`` in queue order, counted up to ``limit``: at ``limit``, the read stops before it
        (``why``'s ``search_limited``). None when the read by class never takes it: nothing runs,
        or its class is below the lowest running class (it may not preempt by class)."""
        reader = self.db.read()
        floor = reader.execute("SELECT MIN(preemption_class) FROM jobs WHERE status = 'running'")[0][0]
        spec = job.spec
        if floor is None or spec.preemption_class < int(floor):
            return None
        # ahead in QUEUE_ORDER: class, priority, queue_front descending; submitted_at, id ascending
        ahead = (
            "(preemption_class > ? OR (preemption_class = ? AND (priority > ? OR (priority = ? AND"
            " (queue_front > ? OR (queue_front = ? AND (submitted_at < ? OR (submitted_at = ? AND"
            " id < ?))))))))"
        )
        front = int(job.queue_front)
        rows = reader.execute(
            "SELECT COUNT(*) FROM (SELECT 1 FROM jobs WHERE status = 'pending' AND gang_id IS NULL"
            f" AND {RUNNABLE_SQL} AND preemption_class >= ? AND {ahead} LIMIT ?) AS ahead",
            (
                int(floor),
                *(spec.preemption_class, spec.preemption_class),
                *(spec.priority, spec.priority),
                *(front, front),
                *(job.submitted_at, job.submitted_at),
                job.id,
                limit,
            ),
        )
        return int(rows[0][0])

    # --- reserve and roll back -----------------------------------------------------------

    def reserve_gang(
        self,
        gang_id: str,
        placements: Sequence[tuple[str, str, tuple[int, ...]]],
        policy: ClaimPolicy[Any],
        decide: Callable[[tuple[Job, ...], set[int]], Plan[tuple[Job, ...] | None]],
    ) -> tuple[Job, ...] | None:
        """Reserve every task of a gang on its worker in one transaction, or nothing.

        ``placements`` are (job id, worker id, GPU indices) for every task. The capacity is checked
        again on the locked worker rows (``policy``), then ``decide`` gets the locked tasks and the
        rendezvous ports other gangs use on rank 0's worker. Nothing is written, and None
        returned, when the capacity is gone or ``decide`` declines (a task is no longer blocked: a
        claim or another replica got there first since the snapshot).
        """
        with self.db.transaction() as tx:
            tasks = tuple(lock_gang(tx, self.dialect, gang_id))
            by_id = {task.id: task for task in tasks}
            if set(by_id) != {job_id for job_id, _, _ in placements}:
                return None
            if not self._capacity_still_there(tx, by_id, placements, policy):
                return None
            rank_zero_worker = next(
                worker for job_id, worker, _ in placements if by_id[job_id].gang_index == 0
            )
            reserved = self.applier.apply_plan(tx, decide(tasks, self._master_ports_on(tx, rank_zero_worker)))
            if reserved is not None:
                tx.execute("DELETE FROM holds WHERE gang_id = ?", (gang_id,))
            return reserved

    def _capacity_still_there(
        self,
        tx: Transaction,
        tasks: dict[str, Job],
        placements: Sequence[tuple[str, str, tuple[int, ...]]],
        policy: ClaimPolicy[Any],
    ) -> bool:
        by_worker: dict[str, list[tuple[Job, tuple[int, ...]]]] = {}
        for job_id, worker_id, gpu_indices in placements:
            by_worker.setdefault(worker_id, []).append((tasks[job_id], gpu_indices))
        for worker_id in sorted(by_worker):
            try:
                worker = load_worker(tx, self.dialect, worker_id, lock=True)
            except errors.NotFound:
                return False
            if worker.status != "active":
                return False
            capacity = policy.capacity(worker, worker_allocations(tx, worker_id))
            needed = Resources()
            indices: list[int] = []
            for job, gpu_indices in by_worker[worker_id]:
                needed = needed + job.spec.resources
                indices.extend(gpu_indices)
            if not capacity.free.covers(needed) or not set(indices) <= set(capacity.free_gpu_indices):
                return False
            if len(indices) != len(set(indices)):
                return False
        return True

    def _master_ports_on(self, tx: Transaction, worker_id: str) -> set[int]:
        """The rendezvous ports the gangs holding ``worker_id`` use."""
        rows = tx.execute(
            "SELECT master_port FROM jobs WHERE worker_id = ? AND master_port IS NOT NULL"
            " AND status IN ('reserved', 'running', 'preempting')",
            (worker_id,),
        )
        return {int(row[0]) for row in rows}

    # --- preemption ----------------------------------------------------------------------

    def preempt(
        self,
        job_ids: Sequence[str],
        gang_ids: Sequence[str],
        worker_ids: Sequence[str],
        port_worker: str | None,
        decide: PreemptionDecision[Outcome],
    ) -> Outcome:
        """Apply one preemption in one transaction: lock the preemptor's and the victims' rows (the
        jobs ``job_ids`` and every task of ``gang_ids``, in id order, as every gang operation
        locks), then the placement workers in id order with their allocations, and let ``decide``
        (``corral.core.preemption.start_preemption``) check that nothing moved and say what changes.
        ``port_worker``: rank 0's worker of a gang preemptor, whose rendezvous ports are in use."""
        with self.db.transaction() as tx:
            marks = ", ".join("?" for _ in job_ids) or "NULL"
            gang_marks = ", ".join("?" for _ in gang_ids) or "NULL"
            rows = tx.execute(
                f"SELECT {JOB_SELECT} FROM jobs WHERE id IN ({marks}) OR gang_id IN ({gang_marks})"
                f" ORDER BY id{self.dialect.lock_clause_plain}",
                [*job_ids, *gang_ids],
            )
            jobs = {job.id: job for job in (job_from_row(row) for row in rows)}
            workers: dict[str, tuple[Worker, list[Allocation]]] = {}
            for worker_id in sorted(set(worker_ids)):
                try:
                    worker = load_worker(tx, self.dialect, worker_id, lock=True)
                except errors.NotFound:
                    continue
                workers[worker_id] = (worker, worker_allocations(tx, worker_id))
            ports = self._master_ports_on(tx, port_worker) if port_worker else set()
            return self.applier.apply_plan(tx, decide(jobs, workers, ports))

    # --- holds ---------------------------------------------------------------------------

    def replace_holds(self, holds: Sequence[Hold]) -> None:
        """The admission leader's current holds replace the previous ones, in one transaction."""
        with self.db.transaction() as tx:
            tx.execute("DELETE FROM holds")
            tx.executemany(
                "INSERT INTO holds (worker_id, gang_id, gpus, vram_mb, memory_mb, cpus, expected_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (hold.worker_id, hold.gang_id, hold.resources.gpus, hold.resources.vram_mb,
                     hold.resources.memory_mb, hold.resources.cpus, hold.expected_at)
                    for hold in holds
                ],
            )  # fmt: skip

    def list_holds(self) -> list[Hold]:
        rows = self.db.read().execute(
            "SELECT worker_id, gang_id, gpus, vram_mb, memory_mb, cpus, expected_at FROM holds"
            " ORDER BY worker_id, gang_id"
        )
        return [Hold(row[1], row[0], Resources(row[2], row[3], row[4], row[5]), row[6]) for row in rows]
