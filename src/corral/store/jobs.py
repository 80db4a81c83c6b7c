"""Jobs and their transitions (``ports.Jobs``): the core's decisions on a job or a gang applied
(``change``, ``change_many``, ``change_gang``), submit and the reads, the job heartbeat, the
reaper's candidates and checkpoints, composed over the backend's ``Database`` and ``Dialect`` and
the store's ``Applier`` (the one compare-and-set per transition).

The store decides nothing about a job's next status: ``change`` locks the rows a decision needs
(the job, and its gang's in id order), hands them to a decision function of ``corral.core`` passed
in by the server, and applies the plan it returns through the applier. ``PostgresJobs``
(``store.postgres``) settles a single job's report in one statement where nothing moved meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from corral.domain import errors
from corral.domain.records import Job, JobEvent, Reason
from corral.domain.status import Status
from corral.domain.transitions import Outcome, Submission
from corral.store.base import (
    ClusterCounts,
    GangDecision,
    JobDecision,
    JobFilter,
    JobReport,
    LeaseRenewed,
    SubmitResult,
    Submitted,
)
from corral.store.dialect import Applier, Database, Dialect, find_job, load_job, lock_gang
from corral.store.pool_rows import place_in_pools
from corral.store.rows import (
    HOLDING_SQL,
    INSERT_EVENT,
    INSERT_JOB,
    JOB_SELECT,
    LEASED_SQL,
    Transaction,
    insert_row,
    job_from_row,
    submit_event,
    to_json,
)
from corral.store.schema import EVENT_COLUMNS

__all__ = ["SqlJobs"]


#: a batch of leases renewed by one ``UPDATE ... FROM`` its ``beat`` rows (one per job: id, attempt
#: and what its heartbeat reports; SQLite a ``VALUES`` list, PostgreSQL ``unnest`` of arrays): a
#: value not reported (NULL) keeps the column as it is, as ``_renew`` does
RENEW_SET = (
    "UPDATE jobs SET last_heartbeat_at = ?,"
    " progress = COALESCE(beat.progress, jobs.progress),"
    " gpu_util_pct = COALESCE(beat.gpu_util_pct, jobs.gpu_util_pct),"
    " rss_mb = COALESCE(beat.rss_mb, jobs.rss_mb),"
    " last_checkpoint_at = COALESCE(beat.checkpoint_at, jobs.last_checkpoint_at)"
)
RENEW_WHERE = (
    "WHERE jobs.id = beat.id AND jobs.worker_id = ? AND jobs.attempts = beat.attempt"
    f" AND jobs.status IN {LEASED_SQL}"
)
RENEWED = "RETURNING jobs.id, jobs.status"


def may_renew_together(beats: Sequence[tuple[str, int, JobReport]]) -> bool:
    """Whether one statement may renew the batch's leases: at least one, each job named once
    (one ``UPDATE ... FROM`` would apply only one of a job's two beats)."""
    job_ids = {job_id for job_id, _, _ in beats}
    return 0 < len(job_ids) == len(beats)


class SqlJobs:
    """``ports.Jobs`` in SQL, for both backends (``PostgresJobs`` replaces the hot writes)."""

    def __init__(self, db: Database, dialect: Dialect, applier: Applier) -> None:
        self._db = db
        self._dialect = dialect
        self._applier = applier

    def change(self, job_id: str, decide: JobDecision[Outcome]) -> Outcome:
        """Lock the job (and every task of its gang), let ``decide`` choose, apply its plan: one
        transaction. A ``Conflict`` raised by ``decide`` leaves everything as it was."""
        with self._db.transaction() as tx:
            job, gang = self._lock_for_change(tx, job_id)
            return self._applier.apply_plan(tx, decide(job, gang))

    def change_many(self, changes: Sequence[tuple[str, JobDecision[Any]]]) -> list[Any]:
        """``change`` for each ``(job_id, decide)`` in order, in one transaction (a group commit):
        each one's outcome, or the error that refused it. Each change runs inside its own savepoint,
        so one that fails (a refused report, an unknown job, a fault) is rolled back alone and the
        others still apply; a failure of the transaction itself (a lost connection, a failed
        commit) raises, with nothing of the group written."""
        results: list[Any] = []
        with self._db.transaction() as tx:
            for job_id, decide in changes:
                tx.execute("SAVEPOINT one_change")
                try:
                    job, gang = self._lock_for_change(tx, job_id)
                    results.append(self._applier.apply_plan(tx, decide(job, gang)))
                except Exception as error:
                    tx.execute("ROLLBACK TO SAVEPOINT one_change")
                    results.append(error)
                tx.execute("RELEASE SAVEPOINT one_change")
        return results

    def change_gang(self, gang_id: str, decide: GangDecision[Outcome]) -> Outcome:
        """As ``change``, for a decision about a whole gang (a stale reservation, a drain's end)."""
        with self._db.transaction() as tx:
            tasks = self._lock_gang(tx, gang_id)
            if not tasks:
                raise errors.NotFound(f"gang {gang_id} not found")
            return self._applier.apply_plan(tx, decide(tuple(tasks)))

    def _load_job(self, tx: Transaction, job_id: str, lock: bool = False) -> Job:
        """The job's row; ``lock`` holds it (``FOR UPDATE``) until the transaction ends, for a
        decision that reads the row and then writes it."""
        return load_job(tx, self._dialect, job_id, lock)

    def _lock_for_change(self, tx: Transaction, job_id: str) -> tuple[Job, tuple[Job, ...]]:
        """The job's row and, for a gang task, its gang's rows, locked for a read-then-write decision.

        A gang task's whole gang is locked first, in id order, like every gang operation does:
        locking the one row first and the gang after would deadlock against a drain or a cancel
        of the same gang on another replica.
        """
        lock = self._dialect.lock_clause_plain
        rows = tx.execute(f"SELECT {JOB_SELECT} FROM jobs WHERE id = ? AND gang_id IS NULL{lock}", (job_id,))
        if rows:  # a single job, locked in the same read
            return job_from_row(rows[0]), ()
        job = self._load_job(tx, job_id)  # a gang task (gang_id never changes), or NotFound
        tasks = tuple(self._lock_gang(tx, job.gang_id or ""))
        return next(task for task in tasks if task.id == job_id), tasks

    def _lock_gang(self, tx: Transaction, gang_id: str) -> list[Job]:
        """Every task of the gang, locked in id order (the deadlock-free order), by gang_index."""
        return lock_gang(tx, self._dialect, gang_id)

    # --- submit and read -----------------------------------------------------------------

    def submit(
        self,
        submissions: Sequence[Submission],
        now: float,
        idempotency_key: str | None = None,
        fingerprint: str = "",
        key_owner: str = "",
    ) -> SubmitResult:
        """Insert every job and gang of ``submissions`` (``corral.core.lifecycle.submitted``) in one
        transaction, or none, creating any pool they name that does not exist yet (with its
        ancestors; the reason of each job in a created pool says so).

        With an idempotency key, a key ``key_owner`` already stored returns the jobs it created the
        first time (``replayed``); the same key with a different request is a conflict. Keys are
        per owner: another owner's same key is unrelated to it.
        """
        with self._db.transaction() as tx:
            if idempotency_key is not None:
                # Take the key first: a concurrent submit with the same key (another replica) waits
                # here for ours to commit, then finds the key taken and replays our result.
                result = [
                    {"gang_id": gang_id, "jobs": [job.id for job in jobs]} for gang_id, jobs in submissions
                ]
                taken = tx.execute(
                    "INSERT INTO idempotency_keys (owner, key, fingerprint, result, created_at)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (owner, key) DO NOTHING RETURNING key",
                    (key_owner, idempotency_key, fingerprint, to_json(result), now),
                )
                if not taken:
                    replay = self._replay(tx, key_owner, idempotency_key, fingerprint)
                    assert replay is not None
                    return replay
            # A pool the request names that does not exist yet is created here (store.pool_rows).
            submissions = place_in_pools(tx, submissions, now)
            tx.executemany(INSERT_JOB, [insert_row(job) for _, jobs in submissions for job in jobs])
            tx.executemany(INSERT_EVENT, [submit_event(job) for _, jobs in submissions for job in jobs])
        return SubmitResult(items=tuple(_submitted(group_id, jobs) for group_id, jobs in submissions))

    def _replay(self, tx: Transaction, owner: str, key: str, fingerprint: str) -> SubmitResult | None:
        """The jobs ``owner``'s stored key created, as they are now; a different request is a conflict."""
        rows = tx.execute(
            "SELECT fingerprint, result FROM idempotency_keys WHERE owner = ? AND key = ?", (owner, key)
        )
        if not rows:
            return None
        if rows[0][0] != fingerprint:
            raise errors.Conflict(f"Idempotency-Key {key!r} was first used for a different request")
        items = []
        for entry in orjson.loads(rows[0][1]):
            jobs = tuple(self._load_job(tx, job_id) for job_id in entry["jobs"])
            items.append(_submitted(entry["gang_id"], jobs))
        return SubmitResult(items=tuple(items), replayed=True)

    def get_job(self, job_id: str) -> Job | None:
        return find_job(self._db.read(), job_id)

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
            ("array_id", filters.array_id),
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
        rows = self._db.read().execute(
            f"SELECT {JOB_SELECT} FROM jobs {where} ORDER BY {order} LIMIT ?", [*params, limit]
        )
        return [job_from_row(row) for row in rows]

    def gang_tasks(self, gang_id: str) -> list[Job]:
        rows = self._db.read().execute(
            f"SELECT {JOB_SELECT} FROM jobs WHERE gang_id = ? ORDER BY gang_index", (gang_id,)
        )
        return [job_from_row(row) for row in rows]

    def array_tasks(self, array_id: str, limit: int) -> list[Job]:
        """The first ``limit`` tasks of the array, by index."""
        rows = self._db.read().execute(
            f"SELECT {JOB_SELECT} FROM jobs WHERE array_id = ? ORDER BY array_index LIMIT ?",
            (array_id, limit),
        )
        return [job_from_row(row) for row in rows]

    def array_counts(self, array_id: str) -> dict[str, int]:
        """How many of the array's tasks are in each status (none: no such array)."""
        rows = self._db.read().execute(
            "SELECT status, COUNT(*) FROM jobs WHERE array_id = ? GROUP BY status", (array_id,)
        )
        return {str(row[0]): int(row[1]) for row in rows}

    def task_statuses(self, ids: Sequence[str]) -> dict[str, tuple[Status, ...]]:
        """For each id that names a job, a gang or an array, the statuses of its tasks (one for a
        job): what ``core.dependencies`` decides on. An id that names nothing is left out."""
        found: dict[str, list[Status]] = {}
        reader = self._db.read()
        wanted = sorted(set(ids))
        for start in range(0, len(wanted), 500):
            some = wanted[start : start + 500]
            marks = ", ".join("?" for _ in some)
            for column in ("id", "gang_id", "array_id"):
                rows = reader.execute(f"SELECT {column}, status FROM jobs WHERE {column} IN ({marks})", some)
                for row in rows:
                    found.setdefault(str(row[0]), []).append(Status(row[1]))
        return {key: tuple(statuses) for key, statuses in found.items()}

    def awaiting_dependencies(self, limit: int) -> list[Job]:
        """Pending jobs still waiting on their ``after`` conditions, oldest first (``jobs_awaiting``)."""
        rows = self._db.read().execute(
            f"SELECT {JOB_SELECT} FROM jobs WHERE awaiting_dependencies = 1"
            " ORDER BY submitted_at, id LIMIT ?",
            (limit,),
        )
        return [job_from_row(row) for row in rows]

    def job_events(self, job_id: str) -> list[JobEvent]:
        rows = self._db.read().execute(
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
        rows = self._db.read().execute("SELECT status, COUNT(*) FROM jobs GROUP BY status")
        return {status: count for status, count in rows}

    def count_jobs_by_pool(self) -> dict[str, dict[str, tuple[int, int]]]:
        """Pool -> status -> (jobs, GPUs they ask for): the dashboard's pools page, one query."""
        rows = self._db.read().execute(
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
        with self._db.transaction() as tx:
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
        if not may_renew_together(beats):
            return self._heartbeat_each(worker_id, now, beats)
        with self._db.transaction() as tx:
            return self.renew_leases(tx, worker_id, now, beats)

    def renew_leases(
        self, tx: Transaction, worker_id: str, now: float, beats: Sequence[tuple[str, int, JobReport]]
    ) -> list[Job | LeaseRenewed | None]:
        """``heartbeat_jobs`` in the transaction ``tx`` (the worker heartbeat's, which carries
        them): one statement for the batch, then a read of each job whose answer needs its row.
        The beats must name each job once and be at least one (``may_renew_together``)."""
        params: list[Any] = []
        for job_id, attempt, report in beats:
            progress = to_json(report.progress) if report.progress is not None else None
            params += (job_id, attempt, progress, report.gpu_util_pct, report.rss_mb, report.checkpoint_at)
        values = ", ".join(["(?, ?, ?, ?, ?, ?)"] * len(beats))
        rows = tx.execute(
            "WITH beat(id, attempt, progress, gpu_util_pct, rss_mb, checkpoint_at)"
            f" AS (VALUES {values}) {self._RENEW_FROM_BEAT}",
            [*params, now, worker_id],
        )
        return self.lease_answers(tx, beats, rows)

    def lease_answers(
        self, tx: Transaction, beats: Sequence[tuple[str, int, JobReport]], rows: Sequence[tuple[Any, ...]]
    ) -> list[Job | LeaseRenewed | None]:
        """Each beat's answer from its renewal's rows (``id`` and ``status`` of each lease renewed)."""
        running = {job_id for job_id, status in rows if status == Status.RUNNING}
        return [self._lease_answer(tx, job_id, job_id in running) for job_id, _, _ in beats]

    #: every lease of a batch renewed by one statement (eight jobs took eight statements: a sixth of
    #: a batched heartbeat's time in the application, by cProfile on SQLite)
    _RENEW_FROM_BEAT = f"{RENEW_SET} FROM beat {RENEW_WHERE} {RENEWED}"

    def _heartbeat_each(
        self, worker_id: str, now: float, beats: Sequence[tuple[str, int, JobReport]]
    ) -> list[Job | LeaseRenewed | None]:
        """``heartbeat_jobs`` one statement per job, in order: a batch naming a job twice renews
        it twice (one ``UPDATE ... FROM`` would apply only one of the two)."""
        found: list[Job | LeaseRenewed | None] = []
        with self._db.transaction() as tx:
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

    # --- the cluster's counts ------------------------------------------------------------

    def cluster_counts(self) -> ClusterCounts:
        """Workers by status, the GPUs of the active ones and the GPUs held on them by the holding
        job's status, each counted in SQL: ``/metrics`` is scraped every few seconds, and reading
        every worker and allocation as records for three gauges cost 10% of a 2,000-host server."""
        read = self._db.read()
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
        rows = self._db.read().execute(
            "SELECT id FROM jobs WHERE status = 'running' AND COALESCE(last_heartbeat_at, started_at) < ?"
            " ORDER BY id",
            (cutoff,),
        )
        return [row[0] for row in rows]

    def stuck_stops(self, cutoff: float) -> list[tuple[str, int]]:
        """Preempting jobs whose stop began before ``cutoff``, with the epoch of that stop."""
        rows = self._db.read().execute(
            "SELECT id, preemption_epoch FROM jobs WHERE status = 'preempting'"
            " AND COALESCE(checkpoint_deadline, drain_started_at) < ?"
            " ORDER BY id",
            (cutoff,),
        )
        return [(row[0], int(row[1])) for row in rows]

    def gangs_to_complete(self) -> list[str]:
        """Gangs with a drain to complete or a finished task stranded beside waiting ones."""
        rows = self._db.read().execute(
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
        with self._db.transaction() as tx:
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
            return self._applier.apply_plan(tx, plan)

    def get_checkpoint(self, job_id: str) -> bytes | None:
        if self.get_job(job_id) is None:
            raise errors.NotFound(f"job {job_id} not found")
        rows = self._db.read().execute("SELECT data FROM checkpoints WHERE job_id = ?", (job_id,))
        return bytes(rows[0][0]) if rows else None


def _submitted(group_id: str | None, jobs: Sequence[Job]) -> Submitted:
    """One item of a submit's answer: a job, a gang or an array (its tasks carry its id)."""
    if group_id is None:
        return Submitted(job=jobs[0])
    if jobs[0].array_id is not None:
        return Submitted(tasks=tuple(jobs), array_id=group_id)
    return Submitted(gang_id=group_id, tasks=tuple(jobs))
