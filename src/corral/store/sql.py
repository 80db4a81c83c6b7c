"""The SQL store shared by both backends: every query and every transition, written once.

A backend supplies a connection, a transaction context and its dialect's few differences
(placeholders, row locks, introspection). Queries are written with ``?`` placeholders; the PostgreSQL
backend rewrites them once.

Every transition goes through ``_transition``: one ``UPDATE ... WHERE id = ? AND status = ? [AND
worker_id = ? AND attempts = ?] RETURNING ...`` (compare-and-set) followed by the ``job_events`` insert,
in the caller's transaction. Zero rows updated means a precondition failed; ``_explain_conflict``
reads the row once to say which one, and nothing has been written.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from corral.domain import errors
from corral.domain.ids import new_gang_id, new_job_id, new_worker_id
from corral.domain.records import Allocation, Constraints, Hold, Job, JobEvent, JobSpec, Reason, Worker
from corral.domain.resources import Resources
from corral.domain.status import HOLDING, TERMINAL, Status, WorkerStatus, is_allowed
from corral.store.base import (
    ClaimPolicy,
    Drain,
    DrainCompletion,
    JobFilter,
    ReapReport,
    SubmitResult,
    Submitted,
    WorkerRegistration,
    WorkerView,
)
from corral.store.schema import EVENT_COLUMNS, JOB_COLUMNS, MIGRATIONS, WORKER_COLUMNS

_JOB_SELECT = ", ".join(JOB_COLUMNS)
_EVENT_COUNT = JOB_COLUMNS.index("event_count")
_WORKER_SELECT = ", ".join(WORKER_COLUMNS)
_HOLDING_SQL = "('reserved', 'running', 'preempting')"
_QUEUE_ORDER = "preemption_class DESC, priority DESC, queue_front DESC, submitted_at, id"
# The SQL pre-filter makes the first candidate fit almost always (only constraints can refuse it),
# so the claim reads one row first and widens the page only when constraints skip them.
_CLAIM_FIRST_PAGE = 1
_CLAIM_MAX_PAGE = 512
# Within one batch, jobs are stamped this far apart so the batch's order is its queue order.
_BATCH_STEP_S = 1e-6


QUEUED = Reason("queued", "waiting for a worker with free capacity")
WAITING_FOR_GANG = Reason("gang_waiting", "waiting for the admission cycle to place the whole gang")


class Transaction(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...
    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...


class Raw(str):
    """A SET value written as SQL (``attempts + 1``) rather than bound as a parameter."""


@dataclass(frozen=True)
class _EventSpec:
    reason: Reason | None = None
    epoch: int | None = None


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def _indices_text(indices: Sequence[int]) -> str:
    return ",".join(str(index) for index in indices)


def _indices(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",")) if text else ()


def job_from_row(row: Sequence[Any]) -> Job:
    (
        job_id, name, command, env, status, gang_id, gang_size, gang_index, gpus, vram_mb, memory_mb,
        cpus, gpu_model, labels, pool, username, priority, preemption_class, checkpoint_mode,
        max_retries, attempts, watchdog_retries, preempted_count, queue_front, worker_id, gpu_indices,
        reservation_epoch, reserved_at, preemption_epoch, drain_started_at, cancel_requested,
        submitted_at, started_at, finished_at, last_heartbeat_at, exit_code, error, output_tail,
        reason_code, reason_message, has_checkpoint, progress, budget_s, walltime_s, stall_timeout_s,
        _event_count, master_port, attempt_refund,
    ) = row  # fmt: skip
    spec = JobSpec(
        command=command,
        name=name,
        env=orjson.loads(env),
        gang_size=gang_size,
        resources=Resources(gpus, vram_mb, memory_mb, cpus),
        constraints=Constraints(gpu_model=gpu_model, labels=orjson.loads(labels)),
        pool=pool,
        user=username,
        priority=priority,
        preemption_class=preemption_class,
        checkpoint_mode=checkpoint_mode,
        max_retries=max_retries,
        budget_s=budget_s,
        walltime_s=walltime_s,
        stall_timeout_s=stall_timeout_s,
    )
    return Job(
        id=job_id,
        spec=spec,
        status=Status(status),
        submitted_at=submitted_at,
        gang_id=gang_id,
        gang_index=gang_index,
        attempts=attempts,
        watchdog_retries=watchdog_retries,
        preempted_count=preempted_count,
        queue_front=bool(queue_front),
        worker_id=worker_id,
        gpu_indices=tuple(int(part) for part in gpu_indices.split(",")) if gpu_indices else (),
        reservation_epoch=reservation_epoch,
        reserved_at=reserved_at,
        preemption_epoch=preemption_epoch,
        drain_started_at=drain_started_at,
        cancel_requested=bool(cancel_requested),
        started_at=started_at,
        finished_at=finished_at,
        last_heartbeat_at=last_heartbeat_at,
        exit_code=exit_code,
        error=error,
        output_tail=output_tail,
        reason=Reason(reason_code, reason_message or "") if reason_code else None,
        has_checkpoint=bool(has_checkpoint),
        progress=orjson.loads(progress) if progress else None,
        master_port=master_port,
        attempt_refund=bool(attempt_refund),
    )


def worker_from_row(row: Sequence[Any]) -> Worker:
    (
        worker_id, address, gpus, vram_mb, memory_mb, cpus, gpu_model, labels, status, registered_at,
        last_heartbeat_at, flagged_dead_at, _gpu_stats, unhealthy_gpus,
    ) = row  # fmt: skip
    return Worker(
        id=worker_id,
        address=address,
        resources=Resources(gpus, vram_mb, memory_mb, cpus),
        gpu_model=gpu_model,
        labels=orjson.loads(labels),
        status=status,
        registered_at=registered_at,
        last_heartbeat_at=last_heartbeat_at,
        flagged_dead_at=flagged_dead_at,
        unhealthy_gpus=_indices(unhealthy_gpus),
    )


def _insert_row(job: Job) -> tuple[Any, ...]:
    spec, resources = job.spec, job.spec.resources
    reason = job.reason or QUEUED
    return (
        job.id, spec.name, spec.command, _json(spec.env), job.status.value,
        job.gang_id, spec.gang_size, job.gang_index,
        resources.gpus, resources.vram_mb, resources.memory_mb, resources.cpus,
        spec.constraints.gpu_model, _json(spec.constraints.labels), spec.pool, spec.user,
        spec.priority, spec.preemption_class, spec.checkpoint_mode, spec.max_retries,
        job.submitted_at, spec.budget_s, spec.walltime_s, spec.stall_timeout_s,
        reason.code, reason.message,
    )  # fmt: skip


_INSERT_JOB = (
    "INSERT INTO jobs (id, name, command, env, status, gang_id, gang_size, gang_index, gpus, vram_mb,"
    " memory_mb, cpus, gpu_model, labels, pool, username, priority, preemption_class, checkpoint_mode,"
    " max_retries, submitted_at, budget_s, walltime_s, stall_timeout_s, reason_code, reason_message,"
    " event_count) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1)"
)
_INSERT_EVENT = f"INSERT INTO job_events ({', '.join(EVENT_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


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
        event: _EventSpec,
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
            f" RETURNING {_JOB_SELECT}",
            [*params, *params_where],
        )
        if not rows:
            return None
        row = rows[0]
        job = job_from_row(row)
        tx.execute(
            _INSERT_EVENT,
            (
                job_id,
                row[_EVENT_COUNT],
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
        rows = tx.execute(f"SELECT {_JOB_SELECT} FROM jobs WHERE id = ?{lock_clause}", (job_id,))
        if not rows:
            raise errors.NotFound(f"job {job_id} not found")
        return job_from_row(rows[0])

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
                    job_rows.append(_insert_row(job))
                    event_rows.append(_submit_event(job))
                stamp += _BATCH_STEP_S
            if idempotency_key is not None:
                # Take the key first: a concurrent submit with the same key (another replica) waits
                # here for ours to commit, then finds the key taken and replays our result.
                result = [{"gang_id": gang_id, "jobs": [job.id for job in jobs]} for gang_id, jobs in plan]
                taken = tx.execute(
                    "INSERT INTO idempotency_keys (key, fingerprint, result, created_at) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (key) DO NOTHING RETURNING key",
                    (idempotency_key, fingerprint, _json(result), now),
                )
                if not taken:
                    replay = self._replay(tx, idempotency_key, fingerprint)
                    assert replay is not None
                    return replay
            tx.executemany(_INSERT_JOB, job_rows)
            tx.executemany(_INSERT_EVENT, event_rows)
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
        rows = self._read().execute(f"SELECT {_JOB_SELECT} FROM jobs WHERE id = ?", (job_id,))
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
            f"SELECT {_JOB_SELECT} FROM jobs {where} ORDER BY submitted_at, id LIMIT ?", [*params, limit]
        )
        return [job_from_row(row) for row in rows]

    def gang_tasks(self, gang_id: str) -> list[Job]:
        rows = self._read().execute(
            f"SELECT {_JOB_SELECT} FROM jobs WHERE gang_id = ? ORDER BY gang_index", (gang_id,)
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
            offset, page = 0, _CLAIM_FIRST_PAGE
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
                page = min(page * 8, _CLAIM_MAX_PAGE)

    def claim_candidates_sql(self) -> str:
        """The claim's candidate query: pending jobs that fit the free capacity, in queue order.

        Parameters: free gpus, memory_mb, cpus, per-GPU vram_mb, page size, offset. Its ORDER BY is
        the ``jobs_queue`` index (the PostgreSQL ``EXPLAIN`` guard checks the plan uses it).
        """
        return (
            f"SELECT {_JOB_SELECT} FROM jobs{self.queue_index_hint}"
            " WHERE status = 'pending' AND gang_id IS NULL"
            " AND gpus <= ? AND memory_mb <= ? AND cpus <= ? AND (gpus = 0 OR vram_mb <= ?)"
            f" ORDER BY {_QUEUE_ORDER} LIMIT ? OFFSET ?{self.lock_clause}"
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
            "gpu_indices": _indices_text(gpu_indices),
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
            _EventSpec(reason=Reason("claimed", f"claimed by worker {worker_id}")),
            expect={"reservation_epoch": job.reservation_epoch} if source == Status.RESERVED else None,
        )

    def heartbeat_job(
        self, job_id: str, worker_id: str, attempt: int, now: float, progress: dict[str, Any] | None
    ) -> Job:
        """Renew the lease of a running or preempting job held by this worker and attempt."""
        with self._transaction() as tx:
            assignments = "last_heartbeat_at = ?" + (", progress = ?" if progress is not None else "")
            params: list[Any] = [now] + ([_json(progress)] if progress is not None else [])
            rows = tx.execute(
                f"UPDATE jobs SET {assignments} WHERE id = ? AND worker_id = ? AND attempts = ?"
                f" AND status IN ('running', 'preempting') RETURNING {_JOB_SELECT}",
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
                    _EventSpec(reason=Reason("completed", "exited with code 0")),
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
    ) -> Job:
        """running -> pending (retry while ``attempts < max_retries``) or failed.

        A job that fails while it is being stopped (preempting) ends as the stop intended:
        cancelled when a cancel asked for it, preempted otherwise.
        """
        fence = (worker_id, attempt)
        with self._transaction() as tx:
            current = self._load_job(tx, job_id, lock=True)
            if current.worker_id != worker_id or current.attempts != attempt:
                raise self._explain_conflict(tx, job_id, fence, (Status.RUNNING,))
            outcome = "exited" if exit_code is None else f"exited with code {exit_code}"
            if current.status == Status.PREEMPTING:
                return self._finish_stop(tx, current, now, fence, "job exited while being stopped")
            detail = {"exit_code": exit_code, "error": error, "output_tail": output_tail}
            if current.gang_id is not None and current.status == Status.RUNNING:
                # A rank failed: its peers must stop too. The retry decision is the drain's.
                reason = Reason("task_failed", f"task {current.gang_index} {outcome}; draining the gang")
                return self._drain_for(tx, current, now, reason, detail).trigger
            if current.attempts < current.spec.max_retries:
                target = Status.PENDING
                reason = Reason(
                    "retrying",
                    f"attempt {current.attempts} of {current.spec.max_retries} {outcome}; re-queued",
                )
                values = {**detail, **_REQUEUE_VALUES}
            else:
                target = Status.FAILED
                reason = Reason(
                    "failed", f"attempt {current.attempts} of {current.spec.max_retries} {outcome}"
                )
                values = {**detail, "finished_at": now}
            job = self._transition(
                tx, job_id, now, Status.RUNNING, target, values, _EventSpec(reason=reason), fence
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
            _EventSpec(reason=reason, epoch=job.preemption_epoch),
            fence,
            expect={"cancel_requested": int(job.cancel_requested)},
        )
        if updated is None:
            raise self._explain_conflict(tx, job.id, fence, (Status.PREEMPTING,))
        return updated

    def ack_preempted(self, job_id: str, worker_id: str, attempt: int, epoch: int, now: float) -> Job:
        """The worker stopped a preempting job: preempting -> preempted (or cancelled)."""
        fence = (worker_id, attempt)
        with self._transaction() as tx:
            job = self._load_job(tx, job_id, lock=True)
            if job.worker_id != worker_id or job.attempts != attempt:
                raise self._explain_conflict(tx, job_id, fence, (Status.PREEMPTING,))
            if job.status != Status.PREEMPTING:
                raise errors.NotPreempting(f"job {job_id} is {job.status}, not preempting")
            if job.preemption_epoch != epoch:
                raise errors.StaleEpoch(
                    f"job {job_id} is at preemption epoch {job.preemption_epoch}, not {epoch}"
                )
            return self._finish_stop(tx, job, now, fence, f"stopped by worker {worker_id}")

    def cancel(self, job_id: str, now: float) -> list[Job]:
        """Cancel a job, or every task of its gang, in one transaction.

        Jobs that are not running are cancelled at once. Running jobs go to ``preempting`` with
        ``cancel_requested``: their next heartbeat tells the worker to stop them (SIGTERM, grace,
        SIGKILL), and the worker's ack makes them ``cancelled``. 409 ``already_terminal`` when the
        job (every task, for a gang) has already finished.
        """
        with self._transaction() as tx:
            job = self._load_job(tx, job_id, lock=True)
            if job.gang_id is not None:
                rows = tx.execute(
                    f"SELECT {_JOB_SELECT} FROM jobs WHERE gang_id = ? ORDER BY id{self.lock_clause_plain}",
                    (job.gang_id,),
                )
                targets = [job_from_row(row) for row in rows]
            else:
                targets = [job]
            if all(target.status in TERMINAL for target in targets):
                raise errors.AlreadyTerminal(f"job {job_id} is already {job.status}")
            changed = []
            for target in targets:
                result = self._cancel_one(tx, target, now)
                if result is not None:
                    changed.append(result)
            # Rows are locked, so a compare-and-set cannot miss here; if one ever did, fail loudly
            # (the transaction rolls back) rather than answer 200 for a cancel that did not happen.
            expected = [target for target in targets if self._cancellable(target)]
            if len(changed) != len(expected):
                raise errors.Conflict(f"job {job_id} changed while it was being cancelled; retry")
            return [result for result in changed if result.id == job_id] + [
                result for result in changed if result.id != job_id
            ]

    @staticmethod
    def _cancellable(job: Job) -> bool:
        return job.status not in TERMINAL and not (job.status == Status.PREEMPTING and job.cancel_requested)

    def _cancel_one(self, tx: Transaction, job: Job, now: float) -> Job | None:
        """Cancel one job whose row this transaction holds; None when there is nothing to change."""
        if job.status in TERMINAL or (job.status == Status.PREEMPTING and job.cancel_requested):
            return None
        if job.status == Status.RUNNING:
            epoch = job.preemption_epoch + 1
            return self._transition(
                tx,
                job.id,
                now,
                Status.RUNNING,
                Status.PREEMPTING,
                {"preemption_epoch": epoch, "drain_started_at": now, "cancel_requested": 1},
                _EventSpec(Reason("cancel_requested", "cancel requested; stopping the job"), epoch),
            )
        if job.status == Status.PREEMPTING:
            # Already being stopped (a drain or a preemption): the stop ends as a cancel instead.
            rows = tx.execute(
                "UPDATE jobs SET cancel_requested = 1 WHERE id = ? AND status = 'preempting'"
                f" RETURNING {_JOB_SELECT}",
                (job.id,),
            )
            return job_from_row(rows[0])
        return self._transition(
            tx,
            job.id,
            now,
            job.status,
            Status.CANCELLED,
            {"finished_at": now},
            _EventSpec(Reason("cancelled", "cancelled by request")),
        )

    def watchdog_trip(
        self,
        job_id: str,
        worker_id: str,
        attempt: int,
        now: float,
        kind: str,
        detail: str,
        max_retries: int,
    ) -> Job:
        """A worker's watchdog stopped the job: re-queue it at the front, or fail it past the cap.

        running -> pending with ``queue_front`` and ``watchdog_retries`` + 1 while
        ``watchdog_retries < max_retries``, else running -> failed. A job that was being stopped
        anyway (preempting) ends as that stop intended. Fenced like every worker report.
        """
        fence = (worker_id, attempt)
        with self._transaction() as tx:
            job = self._load_job(tx, job_id, lock=True)
            if job.worker_id != worker_id or job.attempts != attempt:
                raise self._explain_conflict(tx, job_id, fence, (Status.RUNNING,))
            if job.status == Status.PREEMPTING:
                return self._finish_stop(tx, job, now, fence, f"{kind} watchdog stopped it: {detail}")
            trip = f"{kind} watchdog tripped ({job.watchdog_retries + 1} of {max_retries + 1})"
            if job.gang_id is not None:
                return self._gang_watchdog_trip(tx, job, now, kind, detail, trip, max_retries, fence)
            if job.watchdog_retries < max_retries:
                target = Status.PENDING
                reason = Reason(f"watchdog_{kind}", f"{trip}; re-queued at the front: {detail}")
                values: dict[str, Any] = {
                    **_REQUEUE_VALUES,
                    "queue_front": 1,
                    "watchdog_retries": Raw("watchdog_retries + 1"),
                    "error": f"{kind} watchdog: {detail}",
                }
            else:
                target = Status.FAILED
                reason = Reason(f"watchdog_{kind}", f"{trip}; out of watchdog retries: {detail}")
                values = {"finished_at": now, "error": f"{kind} watchdog: {detail}"}
            result = self._transition(
                tx, job_id, now, Status.RUNNING, target, values, _EventSpec(reason), fence
            )
            if result is None:
                raise self._explain_conflict(tx, job_id, fence, (Status.RUNNING,))
            return result

    def _gang_watchdog_trip(
        self,
        tx: Transaction,
        job: Job,
        now: float,
        kind: str,
        detail: str,
        trip: str,
        max_retries: int,
        fence: tuple[str, int],
    ) -> Job:
        """A rank tripped: under the cap the gang drains and re-runs; past it the rank fails and the
        drain completes the gang as failed."""
        error = f"{kind} watchdog: {detail}"
        if job.watchdog_retries < max_retries:
            reason = Reason(f"watchdog_{kind}", f"{trip}; draining the gang: {detail}")
            values = {"watchdog_retries": job.watchdog_retries + 1, "error": error}
            return self._drain_for(tx, job, now, reason, values).trigger
        reason = Reason(f"watchdog_{kind}", f"{trip}; out of watchdog retries: {detail}")
        failed = self._transition(
            tx,
            job.id,
            now,
            Status.RUNNING,
            Status.FAILED,
            {"finished_at": now, "error": error},
            _EventSpec(reason),
            fence,
        )
        if failed is None:
            raise self._explain_conflict(tx, job.id, fence, (Status.RUNNING,))
        self._drain_for(tx, failed, now, Reason("gang_drain", f"task {job.gang_index} failed: {error}"), {})
        return failed

    def flag_dead_workers(self, now: float, after_s: float) -> list[tuple[Worker, int]]:
        """Flag workers silent for ``after_s`` that still hold running jobs, once per episode.

        A flag is set only where none is (a fresh heartbeat clears it, so a worker that goes
        silent again is flagged again). Returns each newly flagged worker with its running jobs.
        Nothing is killed or re-queued here: the lease reaper recovers the jobs.
        """
        with self._transaction() as tx:
            rows = tx.execute(
                "UPDATE workers SET flagged_dead_at = ?"
                " WHERE flagged_dead_at IS NULL AND last_heartbeat_at < ?"
                " AND EXISTS (SELECT 1 FROM jobs"
                "             WHERE jobs.worker_id = workers.id AND jobs.status = 'running')"
                f" RETURNING {_WORKER_SELECT}",
                (now, now - after_s),
            )
            flagged = sorted((worker_from_row(row) for row in rows), key=lambda worker: worker.id)
            result = []
            for worker in flagged:
                count = tx.execute(
                    "SELECT COUNT(*) FROM jobs WHERE worker_id = ? AND status = 'running'", (worker.id,)
                )[0][0]
                result.append((worker, int(count)))
            return result

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
    def holds_on(self, tx: Transaction, worker_id: str) -> list[Hold]: ...

    # --- workers -------------------------------------------------------------------------

    def _load_worker(self, tx: Transaction, worker_id: str, lock: bool = False) -> Worker:
        rows = tx.execute(
            f"SELECT {_WORKER_SELECT} FROM workers WHERE id = ?{self.lock_clause_plain if lock else ''}",
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
            f" WHERE worker_id = ? AND status IN {_HOLDING_SQL}",
            (worker_id,),
        )
        return [_allocation_from_row(row) for row in rows]

    def allocations(self) -> list[Allocation]:
        rows = self._read().execute(
            "SELECT id, worker_id, gpus, vram_mb, memory_mb, cpus, gpu_indices, status FROM jobs"
            f" WHERE status IN {_HOLDING_SQL} AND worker_id IS NOT NULL ORDER BY id"
        )
        return [_allocation_from_row(row) for row in rows]

    def register_worker(self, registration: WorkerRegistration, now: float) -> Worker:
        """Upsert by id: a re-register updates resources and revives an offline worker."""
        resources = registration.resources
        worker_id = registration.id or new_worker_id()
        with self._transaction() as tx:
            rows = tx.execute(
                f"INSERT INTO workers ({_WORKER_SELECT})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'active', ?, ?, NULL, NULL, '')"
                " ON CONFLICT (id) DO UPDATE SET address = excluded.address, gpus = excluded.gpus,"
                " vram_mb = excluded.vram_mb, memory_mb = excluded.memory_mb, cpus = excluded.cpus,"
                " gpu_model = excluded.gpu_model, labels = excluded.labels,"
                " status = CASE WHEN workers.status = 'draining' THEN 'draining' ELSE 'active' END,"
                " last_heartbeat_at = excluded.last_heartbeat_at, flagged_dead_at = NULL,"
                " unhealthy_gpus = ''"
                f" RETURNING {_WORKER_SELECT}",
                (
                    worker_id, registration.address, resources.gpus, resources.vram_mb,
                    resources.memory_mb, resources.cpus, registration.gpu_model,
                    _json(registration.labels), now, now,
                ),
            )  # fmt: skip
            return worker_from_row(rows[0])

    def worker_heartbeat(
        self,
        worker_id: str,
        now: float,
        gpu_stats: list[dict[str, Any]] | None,
        unhealthy_gpus: Sequence[int] | None = None,
    ) -> Worker:
        """Renew a worker's liveness: revives an offline worker, clears a dead flag, and records
        the GPUs it reports unhealthy (a report only adds: a GPU comes back by re-registering)."""
        with self._transaction() as tx:
            if unhealthy_gpus:
                known = self._load_worker(tx, worker_id).unhealthy_gpus
                unhealthy_text = _indices_text(sorted(set(known) | set(unhealthy_gpus)))
            else:
                unhealthy_text = None
            rows = tx.execute(
                "UPDATE workers SET last_heartbeat_at = ?, flagged_dead_at = NULL,"
                " status = CASE WHEN status = 'offline' THEN 'active' ELSE status END,"
                " gpu_stats = COALESCE(?, gpu_stats), unhealthy_gpus = COALESCE(?, unhealthy_gpus)"
                f" WHERE id = ? RETURNING {_WORKER_SELECT}",
                (now, _json(gpu_stats) if gpu_stats is not None else None, unhealthy_text, worker_id),
            )
            if not rows:
                raise errors.NotFound(f"worker {worker_id} not found")
            return worker_from_row(rows[0])

    def drain_worker(self, worker_id: str) -> Worker:
        with self._transaction() as tx:
            rows = tx.execute(
                f"UPDATE workers SET status = 'draining' WHERE id = ? RETURNING {_WORKER_SELECT}",
                (worker_id,),
            )
            if not rows:
                raise errors.NotFound(f"worker {worker_id} not found")
            return worker_from_row(rows[0])

    def get_worker(self, worker_id: str) -> WorkerView | None:
        rows = self._read().execute(f"SELECT {_WORKER_SELECT} FROM workers WHERE id = ?", (worker_id,))
        if not rows:
            return None
        return self._views([worker_from_row(rows[0])])[0]

    def list_workers(self) -> list[WorkerView]:
        rows = self._read().execute(f"SELECT {_WORKER_SELECT} FROM workers ORDER BY registered_at, id")
        return self._views([worker_from_row(row) for row in rows])

    def _views(self, workers: list[Worker]) -> list[WorkerView]:
        by_worker: dict[str, list[Allocation]] = {}
        for allocation in self.allocations():
            by_worker.setdefault(allocation.worker_id, []).append(allocation)
        views = []
        for worker in workers:
            held = by_worker.get(worker.id, [])
            used = Resources()
            for allocation in held:
                used = used + allocation.resources
            views.append(WorkerView(worker, used, tuple(allocation.job_id for allocation in held)))
        return views

    # --- the reaper ----------------------------------------------------------------------

    def reap(
        self, now: float, heartbeat_timeout_s: float, preempt_timeout_s: float, worker_offline_s: float
    ) -> ReapReport:
        """One reaper pass; each change is its own compare-and-set, so a pass is idempotent.

        1. Running jobs whose lease expired (no heartbeat within ``heartbeat_timeout_s``): re-queued
           while attempts remain, else failed.
        2. Preempting jobs stuck past ``preempt_timeout_s``: force-drained (cancelled when a cancel
           asked for the stop, else preempted).
        3. Active workers silent for ``worker_offline_s``: offline.
        """
        requeued: list[Job] = []
        failed: list[Job] = []
        drained: list[Job] = []
        drains: list[Drain] = []
        reader = self._read()
        stale = [
            job_from_row(row)
            for row in reader.execute(
                f"SELECT {_JOB_SELECT} FROM jobs WHERE status = 'running'"
                " AND COALESCE(last_heartbeat_at, started_at) < ? ORDER BY id",
                (now - heartbeat_timeout_s,),
            )
        ]
        for candidate in stale:
            with self._transaction() as tx:
                # Re-read under lock: a heartbeat or a report may have landed since the scan.
                job = self._load_job(tx, candidate.id, lock=True)
                last_contact = job.last_heartbeat_at or job.started_at or now
                if job.status != Status.RUNNING or last_contact >= now - heartbeat_timeout_s:
                    continue
                silent = now - last_contact
                fence = (job.worker_id or "", job.attempts)
                if job.gang_id is not None:
                    reason = Reason(
                        "lease_expired", f"no heartbeat from worker {job.worker_id} for {silent:.0f}s"
                    )
                    drains.append(
                        self._drain_for(tx, job, now, reason, {}, expired_before=now - heartbeat_timeout_s)
                    )
                    continue
                if job.attempts < job.spec.max_retries:
                    target, values, outcome = Status.PENDING, dict(_REQUEUE_VALUES), "re-queued"
                else:
                    target, values, outcome = Status.FAILED, {"finished_at": now}, "out of retries"
                reason = Reason(
                    "lease_expired", f"no heartbeat from worker {job.worker_id} for {silent:.0f}s; {outcome}"
                )
                result = self._transition(
                    tx, job.id, now, Status.RUNNING, target, values, _EventSpec(reason), fence
                )
                if result is not None:
                    (requeued if target == Status.PENDING else failed).append(result)
        stuck = [
            job_from_row(row)
            for row in reader.execute(
                f"SELECT {_JOB_SELECT} FROM jobs WHERE status = 'preempting' AND drain_started_at < ?"
                " ORDER BY id",
                (now - preempt_timeout_s,),
            )
        ]
        for candidate in stuck:
            with self._transaction() as tx:
                job = self._load_job(tx, candidate.id, lock=True)
                if job.status != Status.PREEMPTING or job.preemption_epoch != candidate.preemption_epoch:
                    continue
                how = f"force-drained after {preempt_timeout_s:.0f}s without an ack"
                drained.append(self._finish_stop(tx, job, now, None, how))
        # After the force-drain, so a gang whose last stuck task was just drained completes now.
        completions = self.complete_drains(now)
        with self._transaction() as tx:
            offline = tx.execute(
                "UPDATE workers SET status = 'offline' WHERE status = 'active' AND last_heartbeat_at < ?"
                " RETURNING id",
                (now - worker_offline_s,),
            )
        return ReapReport(
            requeued=tuple(requeued),
            failed=tuple(failed),
            force_drained=tuple(drained),
            offline_workers=tuple(sorted(row[0] for row in offline)),
            drains=tuple(drains),
            completions=tuple(completions),
        )


_REQUEUE_VALUES: dict[str, Any] = {
    "worker_id": None,
    "gpu_indices": "",
    "started_at": None,
    "last_heartbeat_at": None,
}


def _allocation_from_row(row: Sequence[Any]) -> Allocation:
    return Allocation(
        job_id=row[0],
        worker_id=row[1],
        resources=Resources(row[2], row[3], row[4], row[5]),
        gpu_indices=tuple(int(part) for part in row[6].split(",")) if row[6] else (),
        status=Status(row[7]),
    )


def _submit_event(job: Job) -> tuple[Any, ...]:
    reason = job.reason or QUEUED
    return (job.id, 1, job.submitted_at, None, job.status.value, reason.code, reason.message, None, None, 0)


__all__ = ["HOLDING", "QUEUED", "Raw", "SqlStore", "Transaction", "job_from_row", "worker_from_row"]
