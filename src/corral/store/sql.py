"""The SQL store shared by both backends: the transition machinery, submit and reads, and the job
protocol (claim, heartbeat, done, fail, ack), written once.

The store is built in layers, each a module under ~600 lines: ``SqlStore`` (here) ->
``OperationsStore`` (cancel, workers, watchdog trips, the reaper) -> ``GangStore`` (seeds 001 and 000)
-> ``SqliteStore`` / ``PostgresStore``. A backend supplies a connection, a transaction context and
its dialect's few differences (placeholders, row locks, introspection). Queries are written with
``?`` placeholders; the PostgreSQL backend rewrites them once.

Every transition goes through ``_transition``: one ``UPDATE ... WHERE id = ? AND status = ? [AND
worker_id = ? AND attempts = ?] RETURNING ...`` (compare-and-set) followed by the ``job_events`` insert,
in the caller's transaction. Zero rows updated means a precondition failed; ``_explain_conflict``
reads the row once to say which one, and nothing has been written.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import orjson

from corral.domain import errors
from corral.domain.ids import new_gang_id, new_job_id
from corral.domain.records import Allocation, Hold, Job, JobEvent, JobSpec, Reason, Worker
from corral.domain.status import Status, WorkerStatus, is_allowed
from corral.store.base import ClaimPolicy, Drain, DrainCompletion, JobFilter, SubmitResult, Submitted
from corral.store.rows import (
    BATCH_STEP_S,
    CLAIM_FIRST_PAGE,
    CLAIM_MAX_PAGE,
    EVENT_COUNT,
    HOLDING_SQL,
    INSERT_EVENT,
    INSERT_JOB,
    JOB_SELECT,
    QUEUE_ORDER,
    QUEUED,
    REQUEUE_VALUES,
    WAITING_FOR_GANG,
    WORKER_SELECT,
    EventSpec,
    Raw,
    Transaction,
    allocation_from_row,
    indices_text,
    insert_row,
    job_from_row,
    submit_event,
    to_json,
    worker_from_row,
)
from corral.store.schema import EVENT_COLUMNS, MIGRATIONS


class SqlStore(abc.ABC):
    """Everything but the connection. Subclasses: ``SqliteStore``, ``PostgresStore``."""

    dialect = "sql"
    #: appended to the claim's candidate query where the backend has row locks
    lock_clause = ""
    #: after ``FROM jobs`` in the claim's candidate query, where the planner needs telling
    queue_index_hint = ""

    # --- backend hooks -------------------------------------------------------------------

    @abc.abstractmethod
    def _transaction(self) -> Any:
        """A context manager yielding a ``Transaction`` that commits on exit, rolls back on error."""

    @abc.abstractmethod
    def _read(self) -> Transaction:
        """A ``Transaction`` for reads outside any write transaction."""

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def ping(self, timeout_s: float) -> None: ...

    @abc.abstractmethod
    def table_columns(self) -> dict[str, tuple[str, ...]]:
        """The tables and columns the database holds (for the migration test)."""

    @abc.abstractmethod
    def index_names(self) -> set[str]: ...

    # --- schema --------------------------------------------------------------------------

    blob_type = "BLOB"

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

    # --- transitions ---------------------------------------------------------------------

    def _transition(
        self,
        tx: Transaction,
        job_id: str,
        now: float,
        source: Status,
        target: Status,
        values: dict[str, Any],
        event: EventSpec,
        fence: tuple[str, int] | None = None,
        expect: dict[str, Any] | None = None,
    ) -> Job | None:
        """Compare-and-set one job from ``source`` to ``target``; append its event.

        Returns the updated job, or ``None`` when the precondition did not hold (nothing written).
        """
        if not is_allowed(source, target):
            raise AssertionError(f"transition {source} -> {target} is not in the table")
        assignments = ["status = ?", "event_count = event_count + 1"]
        params: list[Any] = [target.value]
        if event.reason is not None:
            values = {"reason_code": event.reason.code, "reason_message": event.reason.message, **values}
        for column, value in values.items():
            if isinstance(value, Raw):
                assignments.append(f"{column} = {value}")
            else:
                assignments.append(f"{column} = ?")
                params.append(value)
        where = ["status = ?"]
        params_where: list[Any] = [job_id, source.value]
        if fence is not None:
            where += ["worker_id = ?", "attempts = ?"]
            params_where += [fence[0], fence[1]]
        for column, value in (expect or {}).items():
            where.append(f"{column} = ?")
            params_where.append(value)
        rows = tx.execute(
            f"UPDATE jobs SET {', '.join(assignments)} WHERE id = ? AND {' AND '.join(where)}"
            f" RETURNING {JOB_SELECT}",
            [*params, *params_where],
        )
        if not rows:
            return None
        row = rows[0]
        job = job_from_row(row)
        tx.execute(
            INSERT_EVENT,
            (
                job_id,
                row[EVENT_COUNT],
                now,
                source.value,
                target.value,
                event.reason.code if event.reason else None,
                event.reason.message if event.reason else None,
                event.epoch,
                job.worker_id,
                job.attempts,
            ),
        )
        return job

    def _load_job(self, tx: Transaction, job_id: str, lock: bool = False) -> Job:
        """The job's row; ``lock`` holds it (``FOR UPDATE``) until the transaction ends, for a
        decision that reads the row and then writes it."""
        lock_clause = self.lock_clause_plain if lock else ""
        rows = tx.execute(f"SELECT {JOB_SELECT} FROM jobs WHERE id = ?{lock_clause}", (job_id,))
        if not rows:
            raise errors.NotFound(f"job {job_id} not found")
        return job_from_row(rows[0])

    def _lock_for_change(self, tx: Transaction, job_id: str) -> Job:
        """The job's row, locked for a read-then-write decision.

        A gang task's whole gang is locked first, in id order, like every gang operation does:
        locking the one row first and the gang after would deadlock against a drain or a cancel
        of the same gang on another replica.
        """
        job = self._load_job(tx, job_id)
        if job.gang_id is None:
            return self._load_job(tx, job_id, lock=True)
        return next(task for task in self._lock_gang(tx, job.gang_id) if task.id == job_id)

    def _explain_conflict(
        self, tx: Transaction, job_id: str, fence: tuple[str, int] | None, wanted: Sequence[Status]
    ) -> errors.CorralError:
        """Why a compare-and-set updated nothing: unknown job, stale attempt, or wrong status."""
        job = self._load_job(tx, job_id)
        if fence is not None and (job.worker_id != fence[0] or job.attempts != fence[1]):
            return errors.StaleAttempt(
                f"job {job_id} is at attempt {job.attempts} on worker {job.worker_id}, "
                f"not attempt {fence[1]} on worker {fence[0]}: stop it"
            )
        if Status.PREEMPTING in wanted and Status.RUNNING not in wanted:
            return errors.NotPreempting(f"job {job_id} is {job.status}, not preempting")
        return errors.NotRunning(f"job {job_id} is {job.status}, not running")

    # --- submit and read -----------------------------------------------------------------

    def submit(
        self,
        specs: Sequence[JobSpec],
        now: float,
        idempotency_key: str | None = None,
        fingerprint: str = "",
    ) -> SubmitResult:
        """Create every job and gang of ``specs`` in one transaction, or none.

        With an idempotency key, a key already stored returns the jobs it created the first time
        (``replayed``); the same key with a different request is a conflict.
        """
        with self._transaction() as tx:
            job_rows: list[tuple[Any, ...]] = []
            event_rows: list[tuple[Any, ...]] = []
            plan: list[tuple[str | None, list[Job]]] = []
            stamp = now
            for spec in specs:
                if spec.gang_size > 1:
                    gang_id = new_gang_id()
                    task_ids = [new_job_id() for _ in range(spec.gang_size)]
                    tasks = [
                        Job(task_id, spec, Status.BLOCKED, stamp, gang_id, index, reason=WAITING_FOR_GANG)
                        for index, task_id in enumerate(task_ids)
                    ]
                    plan.append((gang_id, tasks))
                else:
                    tasks = [Job(new_job_id(), spec, Status.PENDING, stamp, reason=QUEUED)]
                    plan.append((None, tasks))
                for job in tasks:
                    job_rows.append(insert_row(job))
                    event_rows.append(submit_event(job))
                stamp += BATCH_STEP_S
            if idempotency_key is not None:
                # Take the key first: a concurrent submit with the same key (another replica) waits
                # here for ours to commit, then finds the key taken and replays our result.
                result = [{"gang_id": gang_id, "jobs": [job.id for job in jobs]} for gang_id, jobs in plan]
                taken = tx.execute(
                    "INSERT INTO idempotency_keys (key, fingerprint, result, created_at) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (key) DO NOTHING RETURNING key",
                    (idempotency_key, fingerprint, to_json(result), now),
                )
                if not taken:
                    replay = self._replay(tx, idempotency_key, fingerprint)
                    assert replay is not None
                    return replay
            tx.executemany(INSERT_JOB, job_rows)
            tx.executemany(INSERT_EVENT, event_rows)
        return SubmitResult(
            items=tuple(
                Submitted(job=jobs[0]) if gang_id is None else Submitted(gang_id=gang_id, tasks=tuple(jobs))
                for gang_id, jobs in plan
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
        rows = self._read().execute(f"SELECT {JOB_SELECT} FROM jobs WHERE id = ?", (job_id,))
        return job_from_row(rows[0]) if rows else None

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
        ):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if after is not None:
            clauses.append("(submitted_at > ? OR (submitted_at = ? AND id > ?))")
            params.extend([after[0], after[0], after[1]])
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._read().execute(
            f"SELECT {JOB_SELECT} FROM jobs {where} ORDER BY submitted_at, id LIMIT ?", [*params, limit]
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

    # --- the job protocol ----------------------------------------------------------------

    def claim(self, worker_id: str, now: float, policy: ClaimPolicy[Any]) -> Job | None:
        """Claim work for ``worker_id`` in one transaction: its reserved task first, else the best fit.

        Candidates come in queue order, pre-filtered in SQL by the worker's free capacity and checked
        by ``policy`` (constraints, GPU indices); on PostgreSQL they are locked ``SKIP LOCKED`` so
        replicas never hand out the same job.
        """
        with self._transaction() as tx:
            worker = self._load_worker(tx, worker_id, lock=True)
            if worker.status == WorkerStatus.DRAINING:
                return None
            allocations = self._worker_allocations(tx, worker_id)
            reserved = sorted(
                allocation.job_id for allocation in allocations if allocation.status == Status.RESERVED
            )
            if reserved:
                task = self._load_job(tx, reserved[0], lock=True)
                return self._start(tx, task, worker_id, task.gpu_indices, now, Status.RESERVED)
            capacity = policy.capacity(worker, allocations)
            holds = self.holds_on(tx, worker_id)
            free = capacity.free
            if free.cpus < 0 or free.memory_mb < 0 or free.gpus < 0:
                return None
            offset, page = 0, CLAIM_FIRST_PAGE
            while True:
                rows = tx.execute(
                    self.claim_candidates_sql(),
                    (free.gpus, free.memory_mb, free.cpus, free.vram_mb, page, offset),
                )
                if not rows:
                    return None
                chosen = policy.choose(worker, capacity, [job_from_row(row) for row in rows], holds, now)
                if chosen is not None:
                    job, gpu_indices = chosen
                    return self._start(tx, job, worker_id, gpu_indices, now, Status.PENDING)
                offset += page
                page = min(page * 8, CLAIM_MAX_PAGE)

    def claim_candidates_sql(self) -> str:
        """The claim's candidate query: pending jobs that fit the free capacity, in queue order.

        Parameters: free gpus, memory_mb, cpus, per-GPU vram_mb, page size, offset. Its ORDER BY is
        the ``jobs_queue`` index (the PostgreSQL ``EXPLAIN`` guard checks the plan uses it).
        """
        return (
            f"SELECT {JOB_SELECT} FROM jobs{self.queue_index_hint}"
            " WHERE status = 'pending' AND gang_id IS NULL"
            " AND gpus <= ? AND memory_mb <= ? AND cpus <= ? AND (gpus = 0 OR vram_mb <= ?)"
            f" ORDER BY {QUEUE_ORDER} LIMIT ? OFFSET ?{self.lock_clause}"
        )

    def _start(
        self,
        tx: Transaction,
        job: Job,
        worker_id: str,
        gpu_indices: Sequence[int],
        now: float,
        source: Status,
    ) -> Job | None:
        values: dict[str, Any] = {
            "worker_id": worker_id,
            "gpu_indices": indices_text(gpu_indices),
            "attempts": Raw("attempts + 1"),
            "started_at": now,
            "last_heartbeat_at": now,
            "queue_front": 0,
            "exit_code": None,
            "reason_code": None,
            "reason_message": None,
        }
        return self._transition(
            tx,
            job.id,
            now,
            source,
            Status.RUNNING,
            values,
            EventSpec(reason=Reason("claimed", f"claimed by worker {worker_id}")),
            expect=(
                {"reservation_epoch": job.reservation_epoch, "worker_id": worker_id}
                if source == Status.RESERVED
                else None
            ),
        )

    def heartbeat_job(
        self, job_id: str, worker_id: str, attempt: int, now: float, progress: dict[str, Any] | None
    ) -> Job:
        """Renew the lease of a running or preempting job held by this worker and attempt."""
        with self._transaction() as tx:
            assignments = "last_heartbeat_at = ?" + (", progress = ?" if progress is not None else "")
            params: list[Any] = [now] + ([to_json(progress)] if progress is not None else [])
            rows = tx.execute(
                f"UPDATE jobs SET {assignments} WHERE id = ? AND worker_id = ? AND attempts = ?"
                f" AND status IN ('running', 'preempting') RETURNING {JOB_SELECT}",
                [*params, job_id, worker_id, attempt],
            )
            if rows:
                return job_from_row(rows[0])
            raise self._explain_conflict(tx, job_id, (worker_id, attempt), (Status.RUNNING,))

    def complete(self, job_id: str, worker_id: str, attempt: int, now: float) -> Job:
        """running (or preempting: it finished before it was stopped) -> done."""
        fence = (worker_id, attempt)
        with self._transaction() as tx:
            job = None
            for source in (Status.RUNNING, Status.PREEMPTING):
                job = self._transition(
                    tx,
                    job_id,
                    now,
                    source,
                    Status.DONE,
                    {"finished_at": now, "exit_code": 0},
                    EventSpec(reason=Reason("completed", "exited with code 0")),
                    fence,
                )
                if job is not None:
                    break
            if job is None:
                raise self._explain_conflict(tx, job_id, fence, (Status.RUNNING,))
            return job

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
    ) -> Job:
        """running -> pending (retry while ``attempts < max_retries``) or failed.

        A job that fails while it is being stopped (preempting) ends as the stop intended:
        cancelled when a cancel asked for it, preempted otherwise. ``release`` (the worker gave the
        job back: it is shutting down) re-queues it with the attempt refunded; a gang task so
        released drains its gang, refunded too.
        """
        fence = (worker_id, attempt)
        with self._transaction() as tx:
            current = self._lock_for_change(tx, job_id)
            if current.worker_id != worker_id or current.attempts != attempt:
                raise self._explain_conflict(tx, job_id, fence, (Status.RUNNING,))
            outcome = "exited" if exit_code is None else f"exited with code {exit_code}"
            if current.status == Status.PREEMPTING:
                return self._finish_stop(tx, current, now, fence, "job exited while being stopped")
            detail: dict[str, Any] = {"exit_code": exit_code, "error": error, "output_tail": output_tail}
            if release:
                detail["refunds"] = Raw("refunds + 1")
            if current.gang_id is not None and current.status == Status.RUNNING:
                # A rank failed: its peers must stop too. The retry decision is the drain's.
                why = "was handed back by its worker" if release else outcome
                reason = Reason("task_failed", f"task {current.gang_index} {why}; draining the gang")
                return self._drain_for(tx, current, now, reason, detail).trigger
            if release:
                reason = Reason(
                    "released", f"worker {worker_id} handed the job back ({error or outcome}); re-queued"
                )
                job = self._transition(
                    tx, job_id, now, Status.RUNNING, Status.PENDING, {**detail, **REQUEUE_VALUES},
                    EventSpec(reason=reason), fence,
                )  # fmt: skip
                if job is None:
                    raise self._explain_conflict(tx, job_id, fence, (Status.RUNNING,))
                return job
            if current.retries_left:
                target = Status.PENDING
                reason = Reason(
                    "retrying",
                    f"attempt {current.attempts_used} of {current.spec.max_retries} {outcome}; re-queued",
                )
                values = {**detail, **REQUEUE_VALUES}
            else:
                target = Status.FAILED
                reason = Reason(
                    "failed", f"attempt {current.attempts_used} of {current.spec.max_retries} {outcome}"
                )
                values = {**detail, "finished_at": now}
            job = self._transition(
                tx, job_id, now, Status.RUNNING, target, values, EventSpec(reason=reason), fence
            )
            if job is None:
                raise self._explain_conflict(tx, job_id, fence, (Status.RUNNING,))
            return job

    def _finish_stop(
        self, tx: Transaction, job: Job, now: float, fence: tuple[str, int] | None, how: str
    ) -> Job:
        """preempting -> cancelled (a cancel asked for the stop) or preempted."""
        if job.cancel_requested:
            target, reason = Status.CANCELLED, Reason("cancelled", f"cancelled; {how}")
            values: dict[str, Any] = {"finished_at": now}
        else:
            target, reason = Status.PREEMPTED, Reason("preempted", how)
            values = {}
        updated = self._transition(
            tx,
            job.id,
            now,
            Status.PREEMPTING,
            target,
            values,
            EventSpec(reason=reason, epoch=job.preemption_epoch),
            fence,
            expect={"cancel_requested": int(job.cancel_requested)},
        )
        if updated is None:
            raise self._explain_conflict(tx, job.id, fence, (Status.PREEMPTING,))
        return updated

    def ack_preempted(self, job_id: str, worker_id: str, attempt: int, epoch: int, now: float) -> Job:
        """The worker stopped a preempting job: preempting -> preempted (or cancelled)."""
        with self._transaction() as tx:
            job = self._locked_preempting(tx, job_id, (worker_id, attempt), epoch)
            return self._finish_stop(tx, job, now, (worker_id, attempt), f"stopped by worker {worker_id}")

    def _locked_preempting(self, tx: Transaction, job_id: str, fence: tuple[str, int], epoch: int) -> Job:
        """The job's locked row, when ``fence`` holds it and it is preempting at ``epoch``: the
        precondition of a stopping worker's ack and checkpoint upload."""
        job = self._load_job(tx, job_id, lock=True)
        if job.worker_id != fence[0] or job.attempts != fence[1]:
            raise self._explain_conflict(tx, job_id, fence, (Status.PREEMPTING,))
        if job.status != Status.PREEMPTING:
            raise errors.NotPreempting(f"job {job_id} is {job.status}, not preempting")
        if job.preemption_epoch != epoch:
            raise errors.StaleEpoch(
                f"job {job_id} is at preemption epoch {job.preemption_epoch}, not {epoch}"
            )
        return job

    # --- hooks the gang operations provide ----------------------------------------------

    @abc.abstractmethod
    def _drain_for(
        self,
        tx: Transaction,
        trigger: Job,
        now: float,
        reason: Reason,
        trigger_values: dict[str, Any],
        expired_before: float | None = None,
    ) -> Drain:
        """Start the drain of ``trigger``'s gang in the caller's transaction; peers whose lease
        also expired (last contact before ``expired_before``) are treated like the trigger."""

    @abc.abstractmethod
    def complete_drains(self, now: float) -> list[DrainCompletion]: ...

    @abc.abstractmethod
    def _lock_gang(self, tx: Transaction, gang_id: str) -> list[Job]:
        """Every task of the gang, locked in id order, by gang_index."""

    @abc.abstractmethod
    def holds_on(self, tx: Transaction, worker_id: str) -> list[Hold]: ...

    # --- workers -------------------------------------------------------------------------

    def _load_worker(self, tx: Transaction, worker_id: str, lock: bool = False) -> Worker:
        rows = tx.execute(
            f"SELECT {WORKER_SELECT} FROM workers WHERE id = ?{self.lock_clause_plain if lock else ''}",
            (worker_id,),
        )
        if not rows:
            raise errors.NotFound(f"worker {worker_id} not found")
        return worker_from_row(rows[0])

    #: a plain row lock (no SKIP LOCKED), for the worker row during a claim
    lock_clause_plain = ""

    def _worker_allocations(self, tx: Transaction, worker_id: str) -> list[Allocation]:
        rows = tx.execute(
            "SELECT id, worker_id, gpus, vram_mb, memory_mb, cpus, gpu_indices, status FROM jobs"
            f" WHERE worker_id = ? AND status IN {HOLDING_SQL}",
            (worker_id,),
        )
        return [allocation_from_row(row) for row in rows]

    def allocations(self) -> list[Allocation]:
        rows = self._read().execute(
            "SELECT id, worker_id, gpus, vram_mb, memory_mb, cpus, gpu_indices, status FROM jobs"
            f" WHERE status IN {HOLDING_SQL} AND worker_id IS NOT NULL ORDER BY id"
        )
        return [allocation_from_row(row) for row in rows]
