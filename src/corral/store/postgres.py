"""PostgreSQL backend: the production store, for several server replicas and large clusters.

Claims lock their candidate rows ``FOR UPDATE SKIP LOCKED`` so replicas claiming at the same moment
never wait on, or hand out, the same job; the worker's row is locked ``FOR UPDATE`` so two claims by
one worker cannot both spend its last free GPU. The connection runs in autocommit for reads and in
an explicit transaction for every change.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache, partial
from typing import Any, cast

from corral.domain import errors
from corral.domain.records import Job
from corral.domain.status import HOLDING, LEASED, Status
from corral.domain.transitions import FencedReport, Outcome, Plan, Transition
from corral.store import on_loop
from corral.store.base import JobDecision, JobReport, LeaseRenewed, WorkerBeat
from corral.store.composed import ComposedStore
from corral.store.dialect import ALLOCATIONS_AND_CANDIDATES, POSTGRESQL
from corral.store.jobs import RENEW_SET, RENEW_WHERE, RENEWED, SqlJobs, may_renew_together
from corral.store.operations import SqlWorkers
from corral.store.pg_pipeline import (
    CHECKED_ANSWER,
    TUPLES_OK,
    LoopConnection,
    OpenTransaction,
    Pipeline,
    number_array,
    roll_back,
    text_array,
    unavailable_on_connection_loss,
)
from corral.store.rows import (
    HOLDING_SQL,
    JOB_SELECT,
    LEASED_SQL,
    Transaction,
    columns_of_fields,
    job_from_row,
    to_json,
    worker_from_row,
)
from corral.store.schema import EVENT_COLUMNS, USAGE_COLUMNS, WORKER_COLUMNS, Column, Index
from corral.store.sql import PROBE_WRITE

try:  # the driver is an optional extra: corral[postgres]
    import psycopg
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]


# Advisory lock key for migrations (any constant unique to corral).
_MIGRATION_LOCK = 0x636F7272616C
# Loops lock (space, key) pairs: the space is corral's, the key the loop's name.
_LOOP_LOCK_SPACE = 0x636F7272


def _loop_key(loop: str) -> int:
    """A stable 31-bit key for a loop name (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(loop.encode()).digest()[:4], "big") & 0x7FFFFFFF


@lru_cache(maxsize=512)
def _to_pyformat(sql: str) -> str:
    """Rewrite the shared ``?`` placeholders as psycopg's ``%s`` (no literal ``%`` in corral's SQL)."""
    return re.sub(r"\?", "%s", sql)


#: a worker's columns, as ``WORKER_SELECT``, named by table (a statement joining another row of it)
_WORKER_RETURNED = ", ".join(f"workers.{column}" for column in WORKER_COLUMNS)


class _PostgresTransaction:
    """Statements on the calling thread's connection, inside the transaction open on it if any. A
    lost connection is a 503 (``StoreUnavailable``), and the thread's next call reconnects."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        #: the statements that may carry a transaction's ``BEGIN`` and deferred writes with them
        #: (``Pipeline``: their parameters' types are inferred from their context)
        self.pipelined: frozenset[str] = frozenset()

    def _open(self) -> OpenTransaction | None:
        return getattr(self._store._local, "open", None)

    def execute(self, sql: str, params: Sequence[Any] = (), pipelined: bool = False) -> list[tuple[Any, ...]]:
        """``sql``'s rows, its values bound. A statement of ``pipelined`` (or ``pipelined``: a
        compare-and-set) goes through ``Pipeline``, with the transaction's ``BEGIN`` and deferred
        writes if they wait; any other through psycopg (prepared at its fifth run)."""
        with unavailable_on_connection_loss():
            open_transaction = self._open()
            if pipelined or sql in self.pipelined:  # the BEGIN and the deferred writes, if any, go with it
                if open_transaction is None:
                    return self._store.pipeline().last([(sql, params)])
                return open_transaction.pipeline.last([*open_transaction.prefix(), (sql, params)])
            if open_transaction is not None:
                open_transaction.send_prefix()
            cursor = self._store.connection().execute(_to_pyformat(sql), params)
            # Whether rows came back, from the result's status: ``cursor.description`` would build
            # a ``Column`` per column first (~50 per job row, a third of the driver's CPU per job).
            result = cursor.pgresult
            return cursor.fetchall() if result is not None and result.status == TUPLES_OK else []

    def execute_each(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[list[tuple[Any, ...]]]:
        """Each statement's rows, all sent in one round trip through ``Pipeline`` (with the open
        transaction's ``BEGIN`` and deferred writes, if they wait): PostgreSQL still runs them one
        after another, each with its own snapshot. Outside a transaction they are one implicit
        transaction, every lock held to the last (``execute_apart`` for separate ones). Every
        statement must be one ``Pipeline`` may prepare (its parameters' types inferred)."""
        with unavailable_on_connection_loss():
            open_transaction = self._open()
            if open_transaction is None:
                return self._store.pipeline().run(statements)
            prefix = open_transaction.prefix()
            return open_transaction.pipeline.run([*prefix, *statements])[len(prefix) :]

    def execute_apart(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[list[tuple[Any, ...]]]:
        """``execute_each`` outside any transaction, each statement committed before the next
        runs (a sync after each, ``Pipeline.run``'s ``apart``): one round trip, and no statement
        holds the locks of the one before it. One that fails does not stop those after it."""
        assert self._open() is None, "execute_apart runs outside a transaction"
        with unavailable_on_connection_loss():
            return self._store.pipeline().run(statements, apart=True)

    def defer(self, sql: str, params: Sequence[Any]) -> None:
        """Run ``sql`` (a statement that raises when its write matched no row) with the next
        statement of the open transaction, or its ``COMMIT``; at once outside a transaction."""
        open_transaction = self._open()
        if open_transaction is None:
            with unavailable_on_connection_loss():
                self._store.pipeline().last([(sql, params)])
            return
        open_transaction.deferred.append((sql, params))

    def together(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[list[tuple[Any, ...]]]:
        """Several statements, each with its rows, in one round trip and one transaction of their
        own (``BEGIN`` and ``COMMIT`` in the same pipeline): each is written or none. Outside any
        transaction."""
        assert self._open() is None, "together() runs its own transaction"
        with unavailable_on_connection_loss():
            pipeline = self._store.pipeline()
            try:
                rows = pipeline.run([("BEGIN", ()), *statements, ("COMMIT", ())])
            except BaseException:
                roll_back(pipeline.connection)
                raise
            return rows[1:-1]

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with unavailable_on_connection_loss():
            open_transaction = self._open()
            if open_transaction is not None:
                open_transaction.send_prefix()
            with self._store.connection().cursor() as cursor:
                cursor.executemany(_to_pyformat(sql), rows)


class PostgresWorkers(SqlWorkers):
    """``SqlWorkers`` with a worker heartbeat in one statement (``worker_heartbeat``)."""

    def worker_heartbeat(
        self,
        worker_id: str,
        now: float,
        gpu_stats: list[dict[str, Any]] | None,
        unhealthy_gpus: Sequence[int] | None = None,
        running: Sequence[str] | None = None,
        jobs: Sequence[tuple[str, int, JobReport]] = (),
    ) -> WorkerBeat:
        """``SqlWorkers.worker_heartbeat`` in one statement where the heartbeat reports no
        unhealthy GPU (every heartbeat but the rare one that does): one round trip, not five.

        The statement locks the worker's row, updates it, and returns it with its contact before
        this heartbeat and the ids of the jobs held running or preempting on it. A heartbeat that
        reports unhealthy GPUs merges them with the row's in Python, the locked way.

        The leases of ``jobs`` are renewed after the worker's row is committed, never while it is
        locked: a preemption locks its victims' job rows and then their workers' rows
        (``SqlGangs.preempt``), so a heartbeat holding its worker's row while it renewed those jobs
        would deadlock with it (PostgreSQL aborts one after ``deadlock_timeout``). In the same
        round trip (``execute_apart``: a sync between the two) where each job is named once."""
        if unhealthy_gpus:
            return self._renewed_after(
                super().worker_heartbeat(worker_id, now, gpu_stats, unhealthy_gpus, running), now, jobs
            )
        statement = self._BEAT_LISTING if running is not None else self._BEAT
        highest = max((int(reading["index"]) for reading in gpu_stats or ()), default=-1)
        tx = self.db.read()
        assert isinstance(tx, _PostgresTransaction)
        beat = (statement, (now, to_json(gpu_stats) if gpu_stats is not None else None, worker_id, highest))
        renewal: list[tuple[Any, ...]] | None = None
        if jobs and may_renew_together(jobs):
            leases = [*PostgresJobs.renewal_parameters(worker_id, now, jobs), highest]
            rows, renewal = tx.execute_apart([beat, (PostgresJobs._RENEW_AFTER_BEAT, leases)])
        else:
            rows = tx.execute(*beat)
        if not rows:
            # no such worker, or a reading of a GPU it did not register: the locked way says which
            return self._renewed_after(
                super().worker_heartbeat(worker_id, now, gpu_stats, unhealthy_gpus, running), now, jobs
            )
        row = rows[0]
        worker = worker_from_row(row[: len(WORKER_COLUMNS)])
        unlisted: tuple[Job, ...] = ()
        if running is not None:
            listed = set(running)
            unlisted = self._leased_jobs(
                worker_id, sorted(job_id for job_id in row[-1] if job_id not in listed)
            )
        taken = WorkerBeat(worker, row[len(WORKER_COLUMNS)], worker.unhealthy_gpus, unlisted)
        if renewal is None:
            return self._renewed_after(taken, now, jobs)
        return dataclasses.replace(taken, renewed=tuple(self.jobs.lease_answers(tx, jobs, renewal)))

    def _renewed_after(
        self, beat: WorkerBeat, now: float, jobs: Sequence[tuple[str, int, JobReport]]
    ) -> WorkerBeat:
        """``beat`` (taken and committed) with the leases of ``jobs`` renewed after it, in a
        statement of their own (``worker_heartbeat`` says why not with the worker's row)."""
        if not jobs:
            return beat
        renewed = tuple(self.jobs.heartbeat_jobs(beat.worker.id, now, jobs))
        return dataclasses.replace(beat, renewed=renewed)

    #: a worker heartbeat's update: the row is locked first by the ``previous`` subquery (the
    #: contact before this heartbeat comes from the row as locked, the newest version), then
    #: updated; the lock makes ``previous`` and the update see the same row. The last parameter
    #: is the highest GPU index the heartbeat reads (-1: none): a worker has GPUs 0 .. gpus - 1
    _BEAT = (
        "UPDATE workers SET last_heartbeat_at = ?, flagged_dead_at = NULL,"
        " status = CASE WHEN workers.status = 'offline' THEN 'active' ELSE workers.status END,"
        " gpu_stats = COALESCE(?, workers.gpu_stats)"
        " FROM (SELECT id, last_heartbeat_at FROM workers WHERE id = ? FOR UPDATE) AS previous"
        " WHERE workers.id = previous.id AND workers.gpus > ?"
        f" RETURNING {_WORKER_RETURNED}, previous.last_heartbeat_at"
    )
    #: ``_BEAT`` and the ids of the jobs held running or preempting on the worker (by the
    #: ``jobs_holding`` index, as ``LEASED_ON_WORKER_SQL``), for its ``running`` list
    _BEAT_LISTING = (
        f"{_BEAT}, ARRAY(SELECT jobs.id FROM jobs WHERE jobs.worker_id = workers.id"
        f" AND jobs.status IN {HOLDING_SQL} AND jobs.status IN {LEASED_SQL})"
    )

    def _leased_jobs(self, worker_id: str, job_ids: list[str]) -> tuple[Job, ...]:
        """The named jobs still held running or preempting on the worker, in id order (the jobs a
        heartbeat's ``running`` list left out: normally none, and then no read)."""
        if not job_ids:
            return ()
        rows = self.db.read().execute(
            f"SELECT {JOB_SELECT} FROM jobs WHERE worker_id = ? AND status IN {LEASED_SQL}"
            " AND id = ANY(?) ORDER BY id",
            (worker_id, job_ids),
        )
        return tuple(map(job_from_row, rows))


class PostgresJobs(SqlJobs):
    """``SqlJobs`` with a job report settled in one statement where its row did not move, a group
    of reports in one round trip, and heartbeats without a transaction around their one statement
    (``PostgresStore.autocommit``)."""

    def __init__(self, store: PostgresStore) -> None:
        super().__init__(store, store.sql_dialect, store)
        self._store = store

    #: a single job's row and its version (``xmin``: a new one at every update of the row)
    _VERSIONED_JOB = f"SELECT {JOB_SELECT}, xmin::text FROM jobs WHERE id = ?"
    #: several jobs' rows and versions (the ids as an array's text: ``text_array``)
    _VERSIONED_JOBS = f"SELECT {JOB_SELECT}, xmin::text FROM jobs WHERE id = ANY(?::text[])"
    #: the compare-and-set's extra condition: the row is still the version the decision read
    _SAME_VERSION = " AND xmin::text = ?"

    def change(self, job_id: str, decide: JobDecision[Outcome]) -> Outcome:
        """A single job's report in one statement where nothing moves meanwhile, else as
        ``SqlJobs.change`` (locked).

        1. Read the job and its row version, with no transaction and no lock.
        2. A gang task goes the locked way (its decision reads its gang's rows, locked in id order).
        3. ``decide`` on that row; a refusal raises, nothing written; a plan that changes nothing
           is its outcome.
        4. A plan of one transition of this job is applied by one statement (the compare-and-set
           and its event row) that matches only while the row is still that version: the decision
           is then exactly the one the locked way would have made. A row that moved meanwhile is
           decided again, locked. (Two round trips and one commit for a ``done``, where the locked
           way takes four.)

        A ``FencedReport`` (a ``done``) first tries its one statement (``_fenced``): one round
        trip, no read; only where it matched no row does it go the way above.
        """
        if isinstance(decide, FencedReport):
            settled = self._store.autocommit.execute(*self._fenced(job_id, decide), pipelined=True)
            if settled:
                return cast(Outcome, decide.outcome(job_from_row(settled[0])))
        rows = self._store.autocommit.execute(self._VERSIONED_JOB, (job_id,))
        if not rows:
            raise errors.NotFound(f"job {job_id} not found")
        job = job_from_row(rows[0][:-1])
        if job.gang_id is None:
            plan = decide(job, ())
            if not plan.transitions:
                return plan.outcome
            if self._single(plan, job) and self._store.applied(
                self._store.autocommit, plan.transitions[0], self._SAME_VERSION, (rows[0][-1],)
            ):
                return plan.outcome
        return super().change(job_id, decide)

    @staticmethod
    def _single(plan: Plan[Any], job: Job) -> bool:
        return len(plan.transitions) == 1 and plan.transitions[0].before.id == job.id

    @staticmethod
    def _fenced(job_id: str, report: FencedReport) -> tuple[str, list[Any]]:
        """``report``'s one statement: the compare-and-set on what the report is fenced by (a single
        job, that status, that attempt on that worker), its event row and its usage row, answering
        the job's row as it now is (none where it matched nothing)."""
        assert Status(report.from_status) in LEASED and report.fields["status"] not in HOLDING, (
            "a fenced report ends a leased attempt (the usage row below)"
        )
        assert not report.fields.keys() & {"worker_id", "attempts", "started_at"}, "the fence stays"
        changes = columns_of_fields(report.fields)
        changes.update(reason_code=report.reason_code, reason_message=report.reason_message)
        assignments = ", ".join(f"{column} = ?" for column in changes)
        sql = (
            f"WITH moved AS (UPDATE jobs SET {assignments}, event_count = event_count + 1"
            " WHERE id = ? AND gang_id IS NULL AND worker_id = ? AND attempts = ?::bigint AND status = ?"
            f" RETURNING {JOB_SELECT}),"
            f" event AS (INSERT INTO job_events ({', '.join(EVENT_COLUMNS)}) SELECT id, event_count,"
            " ?::double precision, ?::text, status, reason_code, reason_message, NULL::bigint, worker_id,"
            " attempts FROM moved),"
            f" usage AS (INSERT INTO attempt_usage ({', '.join(USAGE_COLUMNS)}) SELECT id, attempts,"
            " username, pool, worker_id, gpus, cpus, submitted_at, started_at, ?::double precision,"
            " CASE WHEN attempts = 1 THEN started_at - submitted_at END, status FROM moved"
            " WHERE started_at IS NOT NULL ON CONFLICT (job_id, attempt) DO NOTHING)"
            f" SELECT {JOB_SELECT} FROM moved"
        )
        params = [
            *changes.values(), job_id, report.worker_id, report.attempt, report.from_status,
            report.at, report.from_status, report.at,
        ]  # fmt: skip
        return sql, params

    def _settle_fenced(
        self, changes: Sequence[tuple[str, JobDecision[Any]]], results: list[Any]
    ) -> list[int]:
        """The ``FencedReport`` changes of a group (each of a job named once in it), their one
        statements in one transaction and one round trip: each that matched its outcome into
        ``results``; the indexes of every other change, for the read-and-decide way."""
        named: dict[str, int] = {}
        for job_id, _ in changes:
            named[job_id] = named.get(job_id, 0) + 1
        fenced = sorted(
            (job_id, index)
            for index, (job_id, decide) in enumerate(changes)
            if isinstance(decide, FencedReport) and named[job_id] == 1
        )
        if not fenced:
            return list(range(len(changes)))
        statements = [self._fenced(job_id, cast(FencedReport, changes[index][1])) for job_id, index in fenced]
        if len(statements) == 1:
            answers = [self._store.autocommit.execute(*statements[0], pipelined=True)]
        else:
            answers = self._store.autocommit.together(statements)
        settled: set[int] = set()
        for (_, index), rows in zip(fenced, answers, strict=True):
            if rows:
                results[index] = cast(FencedReport, changes[index][1]).outcome(job_from_row(rows[0]))
                settled.add(index)
        return [index for index in range(len(changes)) if index not in settled]

    def change_many(self, changes: Sequence[tuple[str, JobDecision[Any]]]) -> list[Any]:
        """``FencedReport`` changes (``done``) first in one statement each, all in one round trip
        (``_settle_fenced``); then the rest as follows.

        ``change`` for several reports at once (a group commit): one read of every job, each
        decided on its row as read, and the compare-and-sets of the single-transition plans in one
        transaction and one round trip (``_write_together``). A change the group cannot
        settle (a gang task, a plan of several transitions, a row that moved, the second report of
        one job) goes the locked way after it, alone. A refused report's error is its result; only
        the read or the group's transaction failing raises (nothing of the group written)."""
        results: list[Any] = [None] * len(changes)
        rest = self._settle_fenced(changes, results)
        if len(rest) == len(changes):  # nothing written yet: a failure raises, as ever
            return self._read_and_decide(changes)
        if rest:
            for index, result in zip(
                rest, self._rest_of_group([changes[index] for index in rest]), strict=True
            ):
                results[index] = result
        return results

    def _rest_of_group(self, changes: Sequence[tuple[str, JobDecision[Any]]]) -> list[Any]:
        """``_read_and_decide`` of a group some of whose changes are already written (committed by
        their one statement): a failure must not raise then, or the written ones would be answered
        as failed (503) or applied again alone (a committed ``done`` refused 409 ``not_running``).
        The store gone: each of the rest answered by it; another fault: each of the rest alone, as
        the group commit does with a group that raised (``server.grouped.TurnGroup``)."""
        try:
            return self._read_and_decide(changes)
        except errors.StoreUnavailable as failure:
            return [failure] * len(changes)
        except Exception:
            results: list[Any] = []
            for job_id, decide in changes:
                try:
                    results.append(self.change(job_id, decide))
                except Exception as error:
                    results.append(error)
            return results

    def _read_and_decide(self, changes: Sequence[tuple[str, JobDecision[Any]]]) -> list[Any]:
        """``change_many`` of changes not settled by their one statement."""
        results: list[Any] = [None] * len(changes)
        job_ids = text_array(sorted({job_id for job_id, _ in changes}))
        rows = self._store.autocommit.execute(self._VERSIONED_JOBS, (job_ids,), pipelined=True)
        found = {row[0]: (job_from_row(row[:-1]), row[-1]) for row in rows}
        writes: list[tuple[str, int, Plan[Any], str]] = []
        alone: list[int] = []
        seen: set[str] = set()
        for index, (job_id, decide) in enumerate(changes):
            if job_id not in found:
                results[index] = errors.NotFound(f"job {job_id} not found")
                continue
            job, version = found[job_id]
            if job.gang_id is not None or job_id in seen:
                alone.append(index)
                continue
            seen.add(job_id)
            try:
                plan = decide(job, ())
            except Exception as error:
                results[index] = error
                continue
            if not plan.transitions:
                results[index] = plan.outcome
            elif self._single(plan, job):
                writes.append((job_id, index, plan, version))
            else:
                alone.append(index)
        alone += self._write_together(writes, results)
        for index in sorted(alone):
            try:
                results[index] = self.change(*changes[index])
            except Exception as error:
                results[index] = error
        return results

    def _write_together(self, writes: list[tuple[str, int, Plan[Any], str]], results: list[Any]) -> list[int]:
        """The compare-and-sets of ``change_many``'s group (in job id order, the order every lock
        is taken in) in one round trip and one transaction (``_PostgresTransaction.together``):
        each matched one's outcome into ``results``; the indexes of those that missed (their row
        moved since the read: decided again, alone)."""
        missed: list[int] = []
        sent: list[tuple[int, Plan[Any]]] = []
        statements: list[tuple[str, Sequence[Any]]] = []
        for _, index, plan, version in sorted(writes, key=lambda write: write[0]):
            statement = self._store.compare_and_set(plan.transitions[0], self._SAME_VERSION, (version,))
            if statement is None:  # nothing to write
                results[index] = plan.outcome
                continue
            sent.append((index, plan))
            statements.append(self._store.one_statement(*statement))
        if statements:
            for (index, plan), rows in zip(sent, self._store.autocommit.together(statements), strict=True):
                if rows:
                    results[index] = plan.outcome
                else:
                    missed.append(index)
        return missed

    def heartbeat_job(self, job_id: str, worker_id: str, attempt: int, now: float, report: JobReport) -> Job:
        """``SqlJobs.heartbeat_job`` without a transaction around its one statement (one round
        trip, not three)."""
        return self._renew(self._store.autocommit, job_id, worker_id, attempt, now, report)

    #: every lease of a worker heartbeat in one statement: the batch as arrays, one row per job
    _RENEW_BATCH_FROM = (
        f"{RENEW_SET} FROM unnest(?::text[], ?::bigint[], ?::text[], ?::double precision[],"
        " ?::double precision[], ?::double precision[])"
        f" AS beat(id, attempt, progress, gpu_util_pct, rss_mb, checkpoint_at) {RENEW_WHERE}"
    )
    _RENEW_BATCH = f"{_RENEW_BATCH_FROM} {RENEWED}"
    #: ``_RENEW_BATCH`` sent in the round trip of its worker's heartbeat, just after that commits
    #: (``PostgresWorkers.worker_heartbeat``): it renews nothing unless the heartbeat was taken, a
    #: worker of that id having a GPU of every index read (the last parameter: the highest index,
    #: -1 for none), as it renewed nothing when it came after a heartbeat refused
    _RENEW_AFTER_BEAT = (
        f"{_RENEW_BATCH_FROM} AND EXISTS (SELECT 1 FROM workers"
        f" WHERE workers.id = jobs.worker_id AND workers.gpus > ?) {RENEWED}"
    )

    def heartbeat_jobs(
        self, worker_id: str, now: float, beats: Sequence[tuple[str, int, JobReport]]
    ) -> list[Job | LeaseRenewed | None]:
        """``SqlJobs.heartbeat_jobs`` in one statement for the whole batch (one round trip, not
        one per job), then a read of each job whose answer needs its row (normally none). The
        statement is atomic alone: no transaction around it (no ``BEGIN`` and ``COMMIT`` round
        trips; the reads after it were each a statement of their own in the transaction too).

        A batch naming a job twice renews it in order, one statement per job, as ``SqlJobs`` does:
        one ``UPDATE ... FROM`` would apply only one of the two."""
        if not may_renew_together(beats):
            return self._heartbeat_each(worker_id, now, beats)
        return self.renew_leases(self._store.autocommit, worker_id, now, beats)

    def renew_leases(
        self, tx: Transaction, worker_id: str, now: float, beats: Sequence[tuple[str, int, JobReport]]
    ) -> list[Job | LeaseRenewed | None]:
        """``SqlJobs.renew_leases`` by ``_RENEW_BATCH``."""
        rows = tx.execute(self._RENEW_BATCH, self.renewal_parameters(worker_id, now, beats))
        return self.lease_answers(tx, beats, rows)

    @staticmethod
    def renewal_parameters(
        worker_id: str, now: float, beats: Sequence[tuple[str, int, JobReport]]
    ) -> list[Any]:
        """``_RENEW_BATCH``'s parameters: the batch as arrays."""
        reports = [report for _, _, report in beats]
        return [
            now,
            text_array([job_id for job_id, _, _ in beats]),
            number_array([attempt for _, attempt, _ in beats]),
            text_array(
                [to_json(report.progress) if report.progress is not None else None for report in reports]
            ),
            number_array([report.gpu_util_pct for report in reports]),
            number_array([report.rss_mb for report in reports]),
            number_array([report.checkpoint_at for report in reports]),
            worker_id,
        ]


class PostgresStore(ComposedStore):
    """One connection per calling thread (the server's store threads, a loop's own thread), one
    more that holds the loops' advisory locks, and one for the readiness probe.

    Every session has ``lock_timeout`` = ``busy_timeout_s``: a statement that waits longer for a
    lock (a ``LOCK TABLE`` by an operator, a long migration) gives up, its transaction rolls back,
    and the request is answered 503 ``store_busy`` with ``Retry-After`` instead of hanging."""

    dialect = "postgresql"
    sql_dialect = POSTGRESQL
    workers_part = PostgresWorkers

    def _jobs_part(self) -> SqlJobs:
        return PostgresJobs(self)

    def _write(
        self,
        tx: Any,
        update: str,
        params: list[Any],
        event: tuple[Any, ...] | None,
        usage: tuple[Any, ...] | None = None,
    ) -> bool:
        """The compare-and-set, its event row and its usage row in one statement (one round
        trip): the rows are inserted only for the row the update matched."""
        return bool(tx.execute(*self.one_statement(update, params, event, usage), pipelined=True))

    @staticmethod
    def one_statement(
        update: str,
        params: list[Any],
        event: tuple[Any, ...] | None,
        usage: tuple[Any, ...] | None = None,
        checked: bool = False,
    ) -> tuple[str, list[Any]]:
        """The compare-and-set ``update`` with its event row's and usage row's inserts, one
        statement. ``checked``: a statement that raises (``CHECKED_ANSWER``) when the update
        matched no row, so that it can be sent without waiting for its answer: its transaction
        then fails whole."""
        if event is None and usage is None and not checked:
            return update, params
        answer = CHECKED_ANSWER if checked else "SELECT id FROM moved"
        parts = [f"moved AS ({update})"]
        values = list(params)
        if event is not None:
            parts.append(
                f"event AS (INSERT INTO job_events ({', '.join(EVENT_COLUMNS)}) SELECT id, ?::integer,"
                " ?::double precision, ?::text, ?::text, ?::text, ?::text, ?::bigint, ?::text, ?::integer"
                " FROM moved)"
            )
            values += event[1:]
        if usage is not None:
            parts.append(
                f"usage AS (INSERT INTO attempt_usage ({', '.join(USAGE_COLUMNS)}) SELECT id, ?::integer,"
                " ?::text, ?::text, ?::text, ?::integer, ?::integer, ?::double precision,"
                " ?::double precision, ?::double precision, ?::double precision, ?::text FROM moved"
                " ON CONFLICT (job_id, attempt) DO NOTHING)"
            )
            values += usage[1:]
        return f"WITH {', '.join(parts)} {answer}", values

    def _apply_all(self, tx: Any, transitions: Sequence[Transition]) -> None:
        """A claim's starts, not waited for: each compare-and-set (checked: it raises when it
        matched no row) goes with the claim's next statement or its ``COMMIT``, in the same round
        trip. A start that missed fails the statement, so the transaction rolls back whole and the
        claim raises ``Conflict``, as ``_apply`` would (its candidates are locked: it cannot)."""
        for transition in transitions:
            statement = self.compare_and_set(transition)
            if statement is not None:
                tx.defer(*self.one_statement(*statement, checked=True))

    def __init__(self, url: str, busy_timeout_s: float = 5.0) -> None:
        if psycopg is None:
            raise errors.CorralError(
                "PostgreSQL needs the driver: pip install 'corral[postgres]' (psycopg 3)"
            )
        self.url = url
        self.busy_timeout_s = busy_timeout_s
        #: leadership (the advisory locks' connection) and migration
        self.lock = threading.RLock()
        self._thread_local = threading.local()
        self._connections: list[Any] = []
        self._connections_lock = threading.Lock()
        self._leader: Any = None
        self._leading: set[str] = set()
        self._probe: Any = None
        self._probe_lock = threading.Lock()
        self.connection()
        self.autocommit = _PostgresTransaction(self)
        self._compose()
        self.autocommit.pipelined = frozenset({
            self.claims.claiming_worker_sql(), ALLOCATIONS_AND_CANDIDATES, self.claims.claim_candidates_sql(),
            PostgresJobs._VERSIONED_JOB, PostgresJobs._RENEW_BATCH,
            PostgresWorkers._BEAT, PostgresWorkers._BEAT_LISTING,
        })  # fmt: skip

    def pipeline(self) -> Pipeline:
        """This thread's connection's pipeline (``Pipeline``)."""
        connection = self.connection()
        pipeline: Pipeline | None = getattr(self._local, "pipeline", None)
        if pipeline is None or pipeline.connection is not connection:
            pipeline = self._local.pipeline = Pipeline(connection)
        return pipeline

    def connection(self) -> Any:
        """This thread's open connection, (re)connecting when there is none or it was lost."""
        connection = getattr(self._local, "connection", None)
        if connection is None or connection.closed:
            # from work on the event loop the connect is a store thread's (it waits on no socket of ours)
            connection = on_loop.off_loop(partial(self._connect, self.busy_timeout_s))
            self._local.connection = connection
            with self._connections_lock:
                self._connections = [known for known in self._connections if not known.closed]
                self._connections.append(connection)
        return connection

    def _connect(self, lock_timeout_s: float) -> Any:
        try:
            # Client and server keepalives: a replica that vanishes (host crash, partition)
            # loses its session, and the advisory locks of the loops it led, within ~25 s
            # instead of the kernel's two hours.
            connection = LoopConnection.connect(
                self.url,
                autocommit=True,
                keepalives=1,
                keepalives_idle=10,
                keepalives_interval=5,
                keepalives_count=3,
            )
        except psycopg.OperationalError as error:
            raise errors.StoreUnavailable(f"cannot connect to PostgreSQL: {error}") from error
        # A freshly filled queue has stale statistics: the planner then picks a bitmap scan plus
        # a sort of every pending row over the ordered walk of jobs_queue (and a bitmap scan
        # never marks dead index entries, so each claim wades through all of them again).
        # corral's queries are all served by their indexes in order; bitmap scans buy nothing.
        connection.execute("SET enable_bitmapscan = off")
        for setting, value in (
            ("tcp_keepalives_idle", 10),
            ("tcp_keepalives_interval", 5),
            ("tcp_keepalives_count", 3),
            ("lock_timeout", max(1, int(lock_timeout_s * 1000))),
            # floats in their shortest exact text (PostgreSQL's default, pinned against a server
            # configured otherwise): the admission read compares rows by ``ROW(...)::text``, and a
            # rounded time would hide a change
            ("extra_float_digits", 1),
        ):
            connection.execute("SELECT set_config(%s, %s, false)", (setting, str(value)))
        return connection

    def migrate(self) -> None:
        """Migrate under an advisory lock, so replicas starting together migrate once (waiting for
        another replica's migration as long as it takes: no lock timeout meanwhile)."""
        with self.lock:
            self.autocommit.execute("SET lock_timeout = 0")
            self.autocommit.execute("SELECT pg_advisory_lock(?)", (_MIGRATION_LOCK,))
            try:
                super().migrate()
                self.pipeline().names.clear()  # psycopg saw ALTERs: DEALLOCATE ALL
            finally:
                self.autocommit.execute("SELECT pg_advisory_unlock(?)", (_MIGRATION_LOCK,))
                self.autocommit.execute(
                    "SELECT set_config('lock_timeout', ?, false)",
                    (str(max(1, int(self.busy_timeout_s * 1000))),),
                )

    @contextmanager
    def _transaction(self) -> Iterator[_PostgresTransaction]:
        """A transaction on this thread's connection whose ``BEGIN`` goes with its first statement
        and whose deferred writes go with its ``COMMIT`` (``OpenTransaction``). One opened inside
        another is a savepoint of it (psycopg's, once the outer one has begun)."""
        local = self._local
        outer: OpenTransaction | None = getattr(local, "open", None)
        if outer is not None:
            with unavailable_on_connection_loss():
                outer.send_prefix()
                try:
                    with outer.connection.transaction():
                        yield self.autocommit
                except BaseException:
                    outer.pipeline.names.clear()  # psycopg saw its ROLLBACK TO: DEALLOCATE ALL
                    raise
            return
        with unavailable_on_connection_loss():
            transaction = OpenTransaction(self.pipeline())
        local.open = transaction
        try:
            with unavailable_on_connection_loss():
                try:
                    yield self.autocommit
                except BaseException:
                    transaction.rollback()
                    raise
                try:
                    transaction.commit()
                except BaseException:
                    transaction.rollback()
                    raise
        finally:
            local.open = None

    def _read(self) -> _PostgresTransaction:
        return self.autocommit

    def try_lead(self, loop: str) -> bool:
        """Lead ``loop`` while the leader connection holds its advisory lock (seed 001's leader
        election).

        A session lock, taken once and kept: when this replica stops or loses that connection the
        lock is released by PostgreSQL, and another replica's next try takes the loop over. Every
        call while leading checks the connection is still there (one ``SELECT 1``): a leader that
        lost its session must stop believing it leads.
        """
        with self.lock, unavailable_on_connection_loss():
            if self._leader is not None and not self._leader.closed and self._leading:
                try:
                    self._leader.execute("SELECT 1")
                except psycopg.OperationalError:
                    self._leader.close()
            if self._leader is None or self._leader.closed:
                self._leader, self._leading = self._connect(self.busy_timeout_s), set()
            if loop not in self._leading:
                # Advisory locks are database-wide: the key names the schema too, so that two corral
                # deployments in two schemas of one database each elect their own leaders.
                schema = self._leader.execute("SELECT current_schema()").fetchone()[0]
                row = self._leader.execute(
                    "SELECT pg_try_advisory_lock(%s, %s)", (_LOOP_LOCK_SPACE, _loop_key(f"{schema}.{loop}"))
                ).fetchone()
                if row[0]:
                    self._leading.add(loop)
            return loop in self._leading

    def close(self) -> None:
        with self._connections_lock:
            for connection in self._connections:
                connection.close()
            self._connections.clear()
        for connection in (self._leader, self._probe):
            if connection is not None:
                connection.close()
        self._thread_local = threading.local()

    #: short work may run on the event loop (``on_loop``), its waits the loop's
    waits_on_loop = on_loop.available()

    @property
    def _local(self) -> Any:
        """The session of the calling work: its thread's, or its own when it runs on the event
        loop (``on_loop.Session``): the connection, its pipeline, the transaction open on it."""
        return on_loop.session() or self._thread_local

    def ping(self, timeout_s: float, write: bool = False) -> None:
        """Ready when a writer could take the jobs table within ``timeout_s`` (on the probe's own
        connection, so busy store threads cannot hold the probe up): ``LOCK TABLE jobs`` by an
        operator, or a database that does not answer, is not ready. ``write``: and a write commits
        (``PROBE_WRITE``: a full disk or a read-only database refuses it)."""
        if not self._probe_lock.acquire(timeout=timeout_s):
            raise errors.StoreUnavailable(f"the readiness probe stayed busy for {timeout_s:g}s")
        try:
            with unavailable_on_connection_loss():
                if self._probe is None or self._probe.closed:
                    self._probe = self._connect(timeout_s)
                with self._probe.transaction():
                    self._probe.execute("LOCK TABLE jobs IN ROW EXCLUSIVE MODE")
                    for statement in PROBE_WRITE if write else ():
                        self._probe.execute(statement)
        except errors.StoreUnavailable:
            if self._probe is not None and self._probe.broken:
                self._probe.close()
            raise
        finally:
            self._probe_lock.release()

    def table_columns(self) -> dict[str, tuple[str, ...]]:
        rows = self.autocommit.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"
        )
        tables: dict[str, list[str]] = {}
        for table, column in rows:
            tables.setdefault(table, []).append(column)
        return {table: tuple(columns) for table, columns in tables.items()}

    def size_bytes(self) -> int:
        """Tables of this schema with their indexes and TOAST (a replica's schema, not the database)."""
        rows = self._read().execute(
            "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = current_schema() AND c.relkind = 'r'"
        )
        return int(rows[0][0])

    def index_names(self) -> set[str]:
        rows = self.autocommit.execute(
            "SELECT indexname FROM pg_indexes"
            " WHERE schemaname = current_schema() AND indexname NOT LIKE '%%_pkey'"
        )
        return {row[0] for row in rows}

    # --- the catalogue in the declaration's terms (for the migration test) -------------------

    def column_definitions(self) -> dict[str, tuple[Column, ...]]:
        """Every table's columns in order, as ``schema.Column`` (types and defaults in the DDL's
        spelling: ``bytea`` is the declaration's ``BLOB``, ``''::text`` its ``''``)."""
        rows = self.autocommit.execute(
            "SELECT table_name, column_name, data_type, is_nullable, column_default"
            " FROM information_schema.columns"
            " WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"
        )
        definitions: dict[str, list[Column]] = {}
        for table, name, data_type, nullable, default in rows:
            column = Column(
                name,
                _DDL_TYPES.get(data_type, data_type.upper()),
                nullable == "NO",
                None if default is None else _without_casts(default),
            )
            definitions.setdefault(table, []).append(column)
        return {table: tuple(columns) for table, columns in definitions.items()}

    def primary_keys(self) -> dict[str, tuple[str, ...]]:
        rows = self.autocommit.execute(
            "SELECT table_class.relname, pg_get_indexdef(index.indexrelid, key.position, true)"
            " FROM pg_index AS index"
            " JOIN pg_class AS table_class ON table_class.oid = index.indrelid"
            " CROSS JOIN LATERAL generate_series(1, index.indnkeyatts) AS key(position)"
            " WHERE table_class.relnamespace = current_schema()::regnamespace AND index.indisprimary"
            " ORDER BY table_class.relname, key.position"
        )
        keys: dict[str, list[str]] = {}
        for table, column in rows:
            keys.setdefault(table, []).append(column)
        return {table: tuple(columns) for table, columns in keys.items()}

    def index_definitions(self) -> dict[str, Index]:
        """Every index but the primary keys', as ``schema.Index``: a key is descending when bit 1
        of its ``indoption`` is set; the partial predicate is PostgreSQL's own rendering, brought
        back to the DDL's words (casts dropped, ``= ANY (ARRAY[...])`` read as ``IN (...)``)."""
        rows = self.autocommit.execute(
            "SELECT index_class.relname, table_class.relname, index.indisunique,"
            " pg_get_expr(index.indpred, index.indrelid, true),"
            " pg_get_indexdef(index.indexrelid, key.position, true),"
            " (index.indoption[key.position - 1] & 1) = 1"
            " FROM pg_index AS index"
            " JOIN pg_class AS index_class ON index_class.oid = index.indexrelid"
            " JOIN pg_class AS table_class ON table_class.oid = index.indrelid"
            " CROSS JOIN LATERAL generate_series(1, index.indnkeyatts) AS key(position)"
            " WHERE table_class.relnamespace = current_schema()::regnamespace AND NOT index.indisprimary"
            " ORDER BY index_class.relname, key.position"
        )
        keys: dict[str, list[str]] = {}
        described: dict[str, tuple[str, bool, str | None]] = {}
        for name, table, unique, predicate, column, descending in rows:
            keys.setdefault(name, []).append(column + (" DESC" if descending else ""))
            described[name] = (table, unique, predicate)
        return {
            name: Index(table, tuple(keys[name]), _ddl_predicate(predicate), unique)
            for name, (table, unique, predicate) in described.items()
        }

    def explain(self, sql: str, params: Sequence[Any]) -> dict[str, Any]:
        """The root node of ``sql``'s plan (``EXPLAIN (FORMAT JSON)``) on fresh statistics, for the
        plan guard tests: each node has its ``Node Type`` and its children under ``Plans``."""
        self.autocommit.execute("ANALYZE jobs")
        rows = self.autocommit.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        plan: dict[str, Any] = rows[0][0][0]["Plan"]
        return plan


# information_schema's type names -> the migrations' DDL spelling (the rest only change case).
_DDL_TYPES = {"bytea": "BLOB"}


def _without_casts(expression: str) -> str:
    """``'pending'::text`` -> ``'pending'``: PostgreSQL adds the casts when it stores an expression."""
    return re.sub(r"::[a-z_]+(?: (?:precision|varying))?(?:\[\])?", "", expression)


def _ddl_predicate(predicate: str | None) -> str | None:
    """A partial index's predicate as the DDL wrote it: PostgreSQL stores ``status IN ('a', 'b')``
    as ``status = ANY (ARRAY['a'::text, 'b'::text])``."""
    if predicate is None:
        return None
    plain = _without_casts(predicate)
    return re.sub(r"(\w+) = ANY \(ARRAY\[(.*?)\]\)", r"\1 IN (\2)", plain)
