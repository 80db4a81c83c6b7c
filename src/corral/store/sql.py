"""The SQL store shared by both backends: applying the core's decisions, submit and reads, and the
job heartbeat, written once.

The store is ``SqlStore`` (here: applying the core's decisions, jobs, checkpoints, leadership) ->
``ComposedStore`` (``store.composed``: the claim, gangs and reservations, workers, pools, logs and
retention, each a part composed over the store's ``Database``, ``Dialect`` and ``Applier``) ->
``SqliteStore`` / ``PostgresStore``. A backend supplies a connection, a transaction context and its
``Dialect`` (``store.dialect``: row locks, index hints, the claim's first-page read, the DDL's blob
type).
Queries are written with ``?`` placeholders; the PostgreSQL backend rewrites them once.

The store decides nothing about a job's next status: ``change`` locks the rows a decision needs
(the job, and its gang's in id order), hands them to a decision function of ``corral.core`` passed
in by the server, and applies the plan it returns through ``_apply``, the one place a job's row
changes status: a compare-and-set on status and version, and the ``job_events`` row, in the same
transaction. The claim works the same way through its ``ClaimPolicy``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import orjson

from corral.domain import errors
from corral.domain.records import Allocation, Job, JobEvent, Reason, Worker
from corral.domain.status import Status, is_allowed
from corral.domain.transitions import Outcome, Plan, Submission, Transition
from corral.store.base import (
    ClusterCounts,
    GangDecision,
    JobDecision,
    JobFilter,
    JobReport,
    LeaseRenewed,
    SubmitResult,
    Submitted,
    WouldWait,
)
from corral.store.dialect import Dialect, find_job, load_job, load_worker, lock_gang, worker_allocations
from corral.store.pool_rows import place_in_pools
from corral.store.rows import (
    HOLDING_SQL,
    INSERT_EVENT,
    INSERT_JOB,
    JOB_SELECT,
    LEASED_SQL,
    Transaction,
    changed_columns,
    insert_row,
    job_from_row,
    submit_event,
    to_json,
)
from corral.store.schema import EVENT_COLUMNS, MIGRATIONS

T = TypeVar("T")


class SqlStore(abc.ABC):
    """Everything but the connection. Subclasses: ``SqliteStore``, ``PostgresStore``."""

    dialect = "sql"
    #: the SQL that differs between the backends
    sql_dialect: Dialect

    @property
    def lock_clause(self) -> str:
        return self.sql_dialect.lock_clause

    @property
    def lock_clause_plain(self) -> str:
        return self.sql_dialect.lock_clause_plain

    @property
    def queue_index_hint(self) -> str:
        return self.sql_dialect.queue_index_hint

    @property
    def blob_type(self) -> str:
        return self.sql_dialect.blob_type

    def transaction(self) -> Any:
        """``Database.transaction``: the backend's transaction (``_transaction``)."""
        return self._transaction()

    def read(self) -> Transaction:
        """``Database.read``: the backend's reads (``_read``)."""
        return self._read()

    # --- backend hooks -------------------------------------------------------------------

    @abc.abstractmethod
    def _transaction(self) -> Any:
        """A context manager yielding a ``Transaction`` that commits on exit, rolls back on error."""

    @abc.abstractmethod
    def _read(self) -> Transaction:
        """A ``Transaction`` for reads outside any write transaction."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def run_inline(self, work: Callable[[], T]) -> T:
        """Never inline here: every statement is a round trip to a database server, a wait the event
        loop must not make. ``SqliteStore`` runs short work inline when no lock is in the way."""
        raise WouldWait("this store runs no work inline")

    @abc.abstractmethod
    def ping(self, timeout_s: float) -> None: ...

    @abc.abstractmethod
    def table_columns(self) -> dict[str, tuple[str, ...]]:
        """The tables and columns the database holds (for the migration test)."""

    @abc.abstractmethod
    def index_names(self) -> set[str]: ...

    # --- schema --------------------------------------------------------------------------

    def migrate(self) -> None:
        """Apply every migration not yet applied, each in its own transaction."""
        with self._transaction() as tx:
            tx.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations"
                " (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
            )
        applied = {row[0] for row in self._read().execute("SELECT version FROM schema_migrations")}
        for migration in MIGRATIONS:
            if migration.version in applied:
                continue
            with self._transaction() as tx:
                for statement in migration.statements:
                    tx.execute(statement.replace("{blob}", self.blob_type))
                if self.dialect == "postgresql":
                    for statement in migration.postgres_statements:
                        tx.execute(statement)
                tx.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, 0)",
                    (migration.version, migration.name),
                )

    # --- applying the core's decisions ---------------------------------------------------

    def _apply(
        self, tx: Transaction, transition: Transition, guard: str = "", guard_params: Sequence[Any] = ()
    ) -> Job:
        """Write one transition: the one place a job's row changes status.

        A compare-and-set on the row's status and version (the event count): the decision was made
        on exactly that row, so it applies to exactly that row, and the row is then exactly
        ``transition.after``. A status change is checked against the status table and appends its
        ``job_events`` row; a change of fields alone writes none. A missed compare-and-set means the
        row moved under a decision that was supposed to hold it locked: it raises ``Conflict`` and
        the whole transaction rolls back. ``guard`` (a condition on the row, with ``guard_params``)
        narrows the compare-and-set further (``PostgresStore.change``: the row version it read).
        """
        if not self._applied(tx, transition, guard, guard_params):
            raise errors.Conflict(f"job {transition.before.id} changed while it was being decided on; retry")
        return transition.after

    def _applied(
        self, tx: Transaction, transition: Transition, guard: str = "", guard_params: Sequence[Any] = ()
    ) -> bool:
        """``_apply``'s compare-and-set and event row; whether the row matched (a miss writes
        nothing)."""
        statement = self._compare_and_set(transition, guard, guard_params)
        return statement is None or self._write(tx, *statement)

    def _apply_all(self, tx: Transaction, transitions: Sequence[Transition]) -> None:
        """``_apply`` each, in order (PostgreSQL sends a run of like statements at once)."""
        for transition in transitions:
            self._apply(tx, transition)

    def _compare_and_set(
        self, transition: Transition, guard: str = "", guard_params: Sequence[Any] = ()
    ) -> tuple[str, list[Any], tuple[Any, ...] | None] | None:
        """The compare-and-set of ``transition``, its parameters and its event row (None when the
        transition writes nothing)."""
        before, after = transition.before, transition.after
        moves = transition.changes_status
        if moves and not is_allowed(before.status, after.status):
            raise AssertionError(f"transition {before.status} -> {after.status} is not in the table")
        changes = changed_columns(transition)
        if not changes:
            return None
        assignments = [f"{column} = ?" for column in changes]
        if moves:
            assignments.append("event_count = event_count + 1")
        update = (
            f"UPDATE jobs SET {', '.join(assignments)} WHERE id = ? AND status = ? AND event_count = ?"
            f"{guard} RETURNING id"
        )
        params = [*changes.values(), before.id, before.status.value, before.version, *guard_params]
        return update, params, self._event_values(transition) if moves else None

    @staticmethod
    def _event_values(transition: Transition) -> tuple[Any, ...]:
        """The ``job_events`` row of a status change, in ``EVENT_COLUMNS`` order."""
        after, reason = transition.after, transition.reason
        return (
            after.id, after.version, transition.at, transition.before.status.value, after.status.value,
            reason.code if reason else None, reason.message if reason else None,
            transition.epoch, after.worker_id, after.attempts,
        )  # fmt: skip

    def _write(self, tx: Transaction, update: str, params: list[Any], event: tuple[Any, ...] | None) -> bool:
        """Run the compare-and-set ``update`` and, when it matched, insert ``event``; whether it
        matched. Two statements here; PostgreSQL makes them one round trip."""
        if not tx.execute(update, params):
            return False
        if event is not None:
            tx.execute(INSERT_EVENT, event)
        return True

    # ``Applier``, for the composed parts (``store.dialect``)
    def apply_transition(self, tx: Transaction, transition: Transition) -> Job:
        return self._apply(tx, transition)

    def apply_transitions(self, tx: Transaction, transitions: Sequence[Transition]) -> None:
        self._apply_all(tx, transitions)

    def apply_plan(self, tx: Transaction, plan: Plan[Outcome]) -> Outcome:
        return self._apply_plan(tx, plan)

    def _apply_plan(self, tx: Transaction, plan: Plan[Outcome]) -> Outcome:
        for transition in plan.transitions:
            self._apply(tx, transition)
        return plan.outcome

    def change(self, job_id: str, decide: JobDecision[Outcome]) -> Outcome:
        """Lock the job (and every task of its gang), let ``decide`` choose, apply its plan: one
        transaction. A ``Conflict`` raised by ``decide`` leaves everything as it was."""
        with self._transaction() as tx:
            job, gang = self._lock_for_change(tx, job_id)
            return self._apply_plan(tx, decide(job, gang))

    def change_many(self, changes: Sequence[tuple[str, JobDecision[Any]]]) -> list[Any]:
        """``change`` for each ``(job_id, decide)`` in order, in one transaction (a group commit):
        each one's outcome, or the error that refused it. Each change runs inside its own savepoint,
        so one that fails (a refused report, an unknown job, a fault) is rolled back alone and the
        others still apply; a failure of the transaction itself (a lost connection, a failed
        commit) raises, with nothing of the group written."""
        results: list[Any] = []
        with self._transaction() as tx:
            for job_id, decide in changes:
                tx.execute("SAVEPOINT one_change")
                try:
                    job, gang = self._lock_for_change(tx, job_id)
                    results.append(self._apply_plan(tx, decide(job, gang)))
                except Exception as error:
                    tx.execute("ROLLBACK TO SAVEPOINT one_change")
                    results.append(error)
                tx.execute("RELEASE SAVEPOINT one_change")
        return results

    def change_gang(self, gang_id: str, decide: GangDecision[Outcome]) -> Outcome:
        """As ``change``, for a decision about a whole gang (a stale reservation, a drain's end)."""
        with self._transaction() as tx:
            tasks = self._lock_gang(tx, gang_id)
            if not tasks:
                raise errors.NotFound(f"gang {gang_id} not found")
            return self._apply_plan(tx, decide(tuple(tasks)))

    def _load_job(self, tx: Transaction, job_id: str, lock: bool = False) -> Job:
        """The job's row; ``lock`` holds it (``FOR UPDATE``) until the transaction ends, for a
        decision that reads the row and then writes it."""
        return load_job(tx, self.sql_dialect, job_id, lock)

    def _lock_for_change(self, tx: Transaction, job_id: str) -> tuple[Job, tuple[Job, ...]]:
        """The job's row and, for a gang task, its gang's rows, locked for a read-then-write decision.

        A gang task's whole gang is locked first, in id order, like every gang operation does:
        locking the one row first and the gang after would deadlock against a drain or a cancel
        of the same gang on another replica.
        """
        rows = tx.execute(
            f"SELECT {JOB_SELECT} FROM jobs WHERE id = ? AND gang_id IS NULL{self.lock_clause_plain}",
            (job_id,),
        )
        if rows:  # a single job, locked in the same read
            return job_from_row(rows[0]), ()
        job = self._load_job(tx, job_id)  # a gang task (gang_id never changes), or NotFound
        tasks = tuple(self._lock_gang(tx, job.gang_id or ""))
        return next(task for task in tasks if task.id == job_id), tasks

    def _lock_gang(self, tx: Transaction, gang_id: str) -> list[Job]:
        """Every task of the gang, locked in id order (the deadlock-free order), by gang_index."""
        return lock_gang(tx, self.sql_dialect, gang_id)

    # --- submit and read -----------------------------------------------------------------

    def submit(
        self,
        submissions: Sequence[Submission],
        now: float,
        idempotency_key: str | None = None,
        fingerprint: str = "",
    ) -> SubmitResult:
        """Insert every job and gang of ``submissions`` (``corral.core.lifecycle.submitted``) in one
        transaction, or none, creating any pool they name that does not exist yet (with its
        ancestors; the reason of each job in a created pool says so).

        With an idempotency key, a key already stored returns the jobs it created the first time
        (``replayed``); the same key with a different request is a conflict.
        """
        with self._transaction() as tx:
            if idempotency_key is not None:
                # Take the key first: a concurrent submit with the same key (another replica) waits
                # here for ours to commit, then finds the key taken and replays our result.
                result = [
                    {"gang_id": gang_id, "jobs": [job.id for job in jobs]} for gang_id, jobs in submissions
                ]
                taken = tx.execute(
                    "INSERT INTO idempotency_keys (key, fingerprint, result, created_at) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (key) DO NOTHING RETURNING key",
                    (idempotency_key, fingerprint, to_json(result), now),
                )
                if not taken:
                    replay = self._replay(tx, idempotency_key, fingerprint)
                    assert replay is not None
                    return replay
            # A pool the request names that does not exist yet is created here (store.pool_rows).
            submissions = place_in_pools(tx, submissions, now)
            tx.executemany(INSERT_JOB, [insert_row(job) for _, jobs in submissions for job in jobs])
            tx.executemany(INSERT_EVENT, [submit_event(job) for _, jobs in submissions for job in jobs])
        return SubmitResult(
            items=tuple(
                Submitted(job=jobs[0]) if gang_id is None else Submitted(gang_id=gang_id, tasks=jobs)
                for gang_id, jobs in submissions
            )
        )

    def _replay(self, tx: Transaction, key: str, fingerprint: str) -> SubmitResult | None:
        """The jobs a stored key created, as they are now; a different request is a conflict."""
        rows = tx.execute("SELECT fingerprint, result FROM idempotency_keys WHERE key = ?", (key,))
        if not rows:
            return None
        if rows[0][0] != fingerprint:
            raise errors.Conflict(f"Idempotency-Key {key!r} was first used for a different request")
        items = []
        for entry in orjson.loads(rows[0][1]):
            jobs = tuple(self._load_job(tx, job_id) for job_id in entry["jobs"])
            if entry["gang_id"] is None:
                items.append(Submitted(job=jobs[0]))
            else:
                items.append(Submitted(gang_id=entry["gang_id"], tasks=jobs))
        return SubmitResult(items=tuple(items), replayed=True)

    def get_job(self, job_id: str) -> Job | None:
        return find_job(self._read(), job_id)

    def list_jobs(self, filters: JobFilter, limit: int, after: tuple[float, str] | None) -> list[Job]:
        clauses: list[str] = []
        params: list[Any] = []
        if filters.status:
            clauses.append(f"status IN ({', '.join('?' for _ in filters.status)})")
            params.extend(filters.status)
        for column, value in (
            ("gang_id", filters.gang_id),
            ("pool", filters.pool),
            ("worker_id", filters.worker_id),
            ("username", filters.user),
        ):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        # Newest first walks the same (submitted_at, id) indexes backwards.
        beyond, order = ("<", "submitted_at DESC, id DESC") if filters.newest else (">", "submitted_at, id")
        if after is not None:
            clauses.append(f"(submitted_at {beyond} ? OR (submitted_at = ? AND id {beyond} ?))")
            params.extend([after[0], after[0], after[1]])
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._read().execute(
            f"SELECT {JOB_SELECT} FROM jobs {where} ORDER BY {order} LIMIT ?", [*params, limit]
        )
        return [job_from_row(row) for row in rows]

    def gang_tasks(self, gang_id: str) -> list[Job]:
        rows = self._read().execute(
            f"SELECT {JOB_SELECT} FROM jobs WHERE gang_id = ? ORDER BY gang_index", (gang_id,)
        )
        return [job_from_row(row) for row in rows]

    def job_events(self, job_id: str) -> list[JobEvent]:
        rows = self._read().execute(
            f"SELECT {', '.join(EVENT_COLUMNS)} FROM job_events WHERE job_id = ? ORDER BY seq", (job_id,)
        )
        return [
            JobEvent(
                job_id=row[0],
                at=row[2],
                from_status=Status(row[3]) if row[3] else None,
                to_status=Status(row[4]),
                reason=Reason(row[5], row[6] or "") if row[5] else None,
                epoch=row[7],
                worker_id=row[8],
                attempt=row[9],
            )
            for row in rows
        ]

    def count_jobs_by_status(self) -> dict[str, int]:
        rows = self._read().execute("SELECT status, COUNT(*) FROM jobs GROUP BY status")
        return {status: count for status, count in rows}

    def count_jobs_by_pool(self) -> dict[str, dict[str, tuple[int, int]]]:
        """Pool -> status -> (jobs, GPUs they ask for): the dashboard's pools page, one query."""
        rows = self._read().execute(
            "SELECT pool, status, COUNT(*), SUM(gpus) FROM jobs GROUP BY pool, status"
        )
        pools: dict[str, dict[str, tuple[int, int]]] = {}
        for pool, status, count, gpus in rows:
            pools.setdefault(pool, {})[status] = (int(count), int(gpus or 0))
        return pools

    # --- the job protocol ----------------------------------------------------------------

    def heartbeat_job(self, job_id: str, worker_id: str, attempt: int, now: float, report: JobReport) -> Job:
        """Renew the lease of a running or preempting job held by this worker and attempt, with what
        the heartbeat reports (progress, GPU utilisation, memory). One statement on the hot path.

        Returns the job as it is now: renewed, or, when the row did not match (another attempt owns
        the job, it ended), untouched, for the core to say why the heartbeat is refused.
        """
        with self._transaction() as tx:
            return self._renew(tx, job_id, worker_id, attempt, now, report)

    def heartbeat_jobs(
        self, worker_id: str, now: float, beats: Sequence[tuple[str, int, JobReport]]
    ) -> list[Job | LeaseRenewed | None]:
        """``heartbeat_job`` for each ``(job_id, attempt, report)`` of one worker, all in one
        transaction (a worker heartbeat carrying its jobs' leases).

        Each lease renewed on a running job comes back as a ``LeaseRenewed`` (the renewal reads
        back its status alone: its answer is "carry on"); any other job as it is now, for the
        answer that needs the row: renewed while being stopped (its checkpoint phase), or untouched
        (the core says why its heartbeat is refused); None for an unknown job."""
        found: list[Job | LeaseRenewed | None] = []
        with self._transaction() as tx:
            for job_id, attempt, report in beats:
                rows = self._renew_returning(tx, "status", job_id, worker_id, attempt, now, report)
                found.append(self._lease_answer(tx, job_id, bool(rows) and rows[0][0] == Status.RUNNING))
        return found

    def _lease_answer(self, tx: Transaction, job_id: str, renewed_running: bool) -> Job | LeaseRenewed | None:
        """What ``heartbeat_jobs`` gives for one job: ``LeaseRenewed`` for a lease renewed on a
        running job, else the job as it is now (its answer needs the row), None when unknown."""
        if renewed_running:
            return LeaseRenewed(job_id)
        try:
            return self._load_job(tx, job_id)
        except errors.NotFound:
            return None

    def _renew(
        self, tx: Transaction, job_id: str, worker_id: str, attempt: int, now: float, report: JobReport
    ) -> Job:
        rows = self._renew_returning(tx, JOB_SELECT, job_id, worker_id, attempt, now, report)
        return job_from_row(rows[0]) if rows else self._load_job(tx, job_id)

    @staticmethod
    def _renew_returning(
        tx: Transaction,
        returning: str,
        job_id: str,
        worker_id: str,
        attempt: int,
        now: float,
        report: JobReport,
    ) -> list[tuple[Any, ...]]:
        """Renew the lease when this worker and attempt hold the job while it runs or is being
        stopped, writing what the heartbeat reports; the ``returning`` columns of the renewed row,
        or no row when it did not match."""
        assignments = ["last_heartbeat_at = ?"]
        params: list[Any] = [now]
        for column, value in (
            ("progress", to_json(report.progress) if report.progress is not None else None),
            ("gpu_util_pct", report.gpu_util_pct),
            ("rss_mb", report.rss_mb),
            ("last_checkpoint_at", report.checkpoint_at),
        ):
            if value is not None:
                assignments.append(f"{column} = ?")
                params.append(value)
        return tx.execute(
            f"UPDATE jobs SET {', '.join(assignments)} WHERE id = ? AND worker_id = ? AND attempts = ?"
            f" AND status IN {LEASED_SQL} RETURNING {returning}",
            [*params, job_id, worker_id, attempt],
        )

    # --- workers -------------------------------------------------------------------------

    def _load_worker(self, tx: Transaction, worker_id: str, lock: bool = False) -> Worker:
        return load_worker(tx, self.sql_dialect, worker_id, lock)

    def _worker_allocations(self, tx: Transaction, worker_id: str) -> list[Allocation]:
        return worker_allocations(tx, worker_id)

    # --- the cluster's counts ------------------------------------------------------------

    def cluster_counts(self) -> ClusterCounts:
        """Workers by status, the GPUs of the active ones and the GPUs held on them by the holding
        job's status, each counted in SQL: ``/metrics`` is scraped every few seconds, and reading
        every worker and allocation as records for three gauges cost 10% of a 2,000-host server."""
        read = self._read()
        workers_by_status: dict[str, int] = {}
        active_gpus = 0
        for status, count, gpus in read.execute(
            "SELECT status, COUNT(*), SUM(gpus) FROM workers GROUP BY status"
        ):
            workers_by_status[str(status)] = int(count)
            if status == "active":
                active_gpus = int(gpus or 0)
        rows = read.execute(
            "SELECT jobs.status, SUM(jobs.gpus) FROM jobs JOIN workers ON workers.id = jobs.worker_id"
            f" WHERE jobs.status IN {HOLDING_SQL} AND workers.status = 'active' GROUP BY jobs.status"
        )
        return ClusterCounts(
            workers_by_status, active_gpus, {str(status): int(gpus or 0) for status, gpus in rows}
        )

    # --- the reaper's reads -------------------------------------------------------------------
    # Candidates only: each is decided again by the core on its locked row, so a heartbeat or a
    # report that lands between this read and that decision wins.

    def expired_leases(self, cutoff: float) -> list[str]:
        """Running jobs whose last contact is before ``cutoff``."""
        rows = self._read().execute(
            "SELECT id FROM jobs WHERE status = 'running' AND COALESCE(last_heartbeat_at, started_at) < ?"
            " ORDER BY id",
            (cutoff,),
        )
        return [row[0] for row in rows]

    def stuck_stops(self, cutoff: float) -> list[tuple[str, int]]:
        """Preempting jobs whose stop began before ``cutoff``, with the epoch of that stop."""
        rows = self._read().execute(
            "SELECT id, preemption_epoch FROM jobs WHERE status = 'preempting'"
            " AND COALESCE(checkpoint_deadline, drain_started_at) < ?"
            " ORDER BY id",
            (cutoff,),
        )
        return [(row[0], int(row[1])) for row in rows]

    def gangs_to_complete(self) -> list[str]:
        """Gangs with a drain to complete or a finished task stranded beside waiting ones."""
        rows = self._read().execute(
            "SELECT DISTINCT gang_id FROM jobs WHERE gang_id IS NOT NULL"
            " AND (status IN ('preempting', 'preempted') OR (status IN ('done', 'failed') AND gang_id IN"
            "  (SELECT gang_id FROM jobs WHERE status IN ('blocked', 'pending'))))"
            " ORDER BY gang_id"
        )
        return [row[0] for row in rows]

    # --- checkpoints ---------------------------------------------------------------------

    def save_checkpoint(self, job_id: str, data: bytes, now: float, decide: JobDecision[Outcome]) -> Outcome:
        """Store opaque bytes for the job's next attempt when ``decide`` (the core's acceptance rule,
        which refuses a stale upload) allows it. One slot per job: a save replaces the last one."""
        with self._transaction() as tx:
            # The job's row alone: a checkpoint is one rank's, and its peers' heartbeats need not
            # wait for a large upload (holding one row, this transaction waits for no other lock).
            job = self._load_job(tx, job_id, lock=True)
            plan = decide(job, ())
            tx.execute("DELETE FROM checkpoints WHERE job_id = ?", (job_id,))
            tx.execute(
                "INSERT INTO checkpoints (job_id, data, size, epoch, saved_at, attempt)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (job_id, data, len(data), job.preemption_epoch, now, job.attempts),
            )
            return self._apply_plan(tx, plan)

    def get_checkpoint(self, job_id: str) -> bytes | None:
        if self.get_job(job_id) is None:
            raise errors.NotFound(f"job {job_id} not found")
        rows = self._read().execute("SELECT data FROM checkpoints WHERE job_id = ?", (job_id,))
        return bytes(rows[0][0]) if rows else None

    # --- leadership ----------------------------------------------------------------------

    def try_lead(self, loop: str) -> bool:
        """Whether this process runs ``loop`` now. One process per SQLite file: always."""
        return True
