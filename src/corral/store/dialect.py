"""What a store's parts are composed over: a ``Database`` (transactions and reads on the backend's
connections) and a ``Dialect`` (the SQL that differs between SQLite and PostgreSQL).

Each concern's class (``SqlPools``, ``SqlLogs``, ``SqlRetention``, ``SqlWorkers``) takes both and
nothing else, so that it is written once for both backends and reads no backend's internals.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from corral.domain import errors
from corral.domain.records import Allocation, Job, Worker
from corral.domain.transitions import Outcome, Plan, Transition
from corral.store.rows import (
    HOLDING_SQL,
    JOB_SELECT,
    QUEUE_ORDER,
    RUNNABLE_SQL,
    WORKER_SELECT,
    Transaction,
    allocation_from_row,
    job_from_row,
    worker_from_row,
)


@dataclass(frozen=True)
class Dialect:
    """The SQL that differs between the backends."""

    #: ``sqlite`` or ``postgresql``
    name: str
    #: the DDL's type for bytes
    blob_type: str = "BLOB"
    #: appended to the claim's candidate query where the backend has row locks (skipping locked rows)
    lock_clause: str = ""
    #: a plain row lock (no SKIP LOCKED): a row read to be written in the same transaction
    lock_clause_plain: str = ""
    #: after ``FROM jobs`` in the claim's candidate query, where the planner needs telling
    queue_index_hint: str = ""
    #: the claim's allocations and first page of candidates in one statement (``SqlClaims``), or
    #: None: the allocations alone, the candidates read after
    first_page_sql: str | None = None
    #: whether ``ROW(...)::text`` gives a row's values as one text, equal only for equal values
    #: (PostgreSQL's record output: each field's own output, quoted where needed, floats in their
    #: shortest exact form): a read that compares rows may fetch that text instead of the columns
    row_text: bool = False


#: A claim's second read on PostgreSQL, one round trip: the jobs holding resources on the worker
#: (its row is locked by then, so this statement's snapshot sees every allocation committed before),
#: and the first page of pending candidates filtered by what those leave free of the worker's
#: resources (GPU indices and unhealthy GPUs aside: never stricter than the policy, which checks
#: each candidate), locked SKIP LOCKED like the claim's candidate query.
ALLOCATIONS_AND_CANDIDATES = (
    f"WITH held AS (SELECT {JOB_SELECT} FROM jobs WHERE worker_id = ? AND status IN {HOLDING_SQL}),"
    " free AS (SELECT workers.gpus - COALESCE((SELECT SUM(gpus) FROM held), 0) AS gpus,"
    " workers.memory_mb - COALESCE((SELECT SUM(memory_mb) FROM held), 0) AS memory_mb,"
    " workers.cpus - COALESCE((SELECT SUM(cpus) FROM held), 0) AS cpus, workers.vram_mb"
    " FROM workers WHERE id = ?),"
    f" candidates AS (SELECT {JOB_SELECT} FROM jobs WHERE status = 'pending' AND gang_id IS NULL"
    f" AND {RUNNABLE_SQL}"
    " AND gpus <= (SELECT gpus FROM free) AND memory_mb <= (SELECT memory_mb FROM free)"
    " AND cpus <= (SELECT cpus FROM free) AND (gpus = 0 OR vram_mb <= (SELECT vram_mb FROM free))"
    f" ORDER BY {QUEUE_ORDER} LIMIT ? FOR UPDATE SKIP LOCKED)"
    " SELECT false, * FROM held UNION ALL SELECT true, * FROM candidates"
)

SQLITE = Dialect("sqlite", queue_index_hint=" INDEXED BY jobs_queue")
POSTGRESQL = Dialect(
    "postgresql",
    blob_type="BYTEA",
    lock_clause=" FOR UPDATE SKIP LOCKED",
    lock_clause_plain=" FOR UPDATE",
    first_page_sql=ALLOCATIONS_AND_CANDIDATES,
    row_text=True,
)


class Database(Protocol):
    """The backend's connections, as the store's parts use them."""

    def transaction(self) -> AbstractContextManager[Transaction]:
        """A transaction that commits on exit and rolls back on error."""
        ...

    def read(self) -> Transaction:
        """Reads outside any write transaction."""
        ...


class Applier(Protocol):
    """Where a part writes the core's transitions: the store's one compare-and-set per transition
    (``SqlStore._apply``), in the part's transaction."""

    def apply_transition(self, tx: Transaction, transition: Transition) -> Job: ...
    def apply_transitions(self, tx: Transaction, transitions: Sequence[Transition]) -> None: ...
    def apply_plan(self, tx: Transaction, plan: Plan[Outcome]) -> Outcome: ...


def load_job(tx: Transaction, dialect: Dialect, job_id: str, lock: bool = False) -> Job:
    """The job's row; ``lock`` holds it (``FOR UPDATE``) until the transaction ends, for a decision
    that reads the row and then writes it."""
    lock_clause = dialect.lock_clause_plain if lock else ""
    rows = tx.execute(f"SELECT {JOB_SELECT} FROM jobs WHERE id = ?{lock_clause}", (job_id,))
    if not rows:
        raise errors.NotFound(f"job {job_id} not found")
    return job_from_row(rows[0])


def find_job(tx: Transaction, job_id: str) -> Job | None:
    """The job's row, or None."""
    rows = tx.execute(f"SELECT {JOB_SELECT} FROM jobs WHERE id = ?", (job_id,))
    return job_from_row(rows[0]) if rows else None


def lock_gang(tx: Transaction, dialect: Dialect, gang_id: str) -> list[Job]:
    """Every task of the gang, locked in id order (the deadlock-free order), by gang_index."""
    rows = tx.execute(
        f"SELECT {JOB_SELECT} FROM jobs WHERE gang_id = ? ORDER BY id{dialect.lock_clause_plain}", (gang_id,)
    )
    return sorted((job_from_row(row) for row in rows), key=lambda job: job.gang_index or 0)


def load_worker(tx: Transaction, dialect: Dialect, worker_id: str, lock: bool = False) -> Worker:
    """The worker's row; ``lock`` as ``load_job``'s."""
    lock_clause = dialect.lock_clause_plain if lock else ""
    rows = tx.execute(f"SELECT {WORKER_SELECT} FROM workers WHERE id = ?{lock_clause}", (worker_id,))
    if not rows:
        raise errors.NotFound(f"worker {worker_id} not found")
    return worker_from_row(rows[0])


#: a worker's allocations (a claim's first read): by the ``jobs_holding`` index, whose predicate
#: ``HOLDING_SQL`` writes word for word
WORKER_ALLOCATIONS_SQL = (
    "SELECT id, worker_id, gpus, vram_mb, memory_mb, cpus, gpu_indices, status, reservation_epoch"
    " FROM jobs"
    f" WHERE worker_id = ? AND status IN {HOLDING_SQL}"
)


def worker_allocations(tx: Transaction, worker_id: str) -> list[Allocation]:
    """What the jobs on the worker hold."""
    return [allocation_from_row(row) for row in tx.execute(WORKER_ALLOCATIONS_SQL, (worker_id,))]
