"""Worker bookkeeping and the server's sweeps: registration and heartbeats, the dead-worker flag,
and the reads the reaper decides on. No job status is decided here (``corral.core.lifecycle``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from corral.domain import errors
from corral.domain.ids import new_worker_id
from corral.domain.records import (
    Allocation,
    Job,
    Worker,
    WorkerContact,
    capacity_shortfall,
    unregistered_gpus,
)
from corral.domain.resources import Resources
from corral.store.base import JobReport, WorkerBeat, WorkerDecision, WorkerRegistration, WorkerView
from corral.store.dialect import Database, Dialect, load_worker, worker_allocations
from corral.store.jobs import SqlJobs
from corral.store.rows import (
    HOLDING_SQL,
    JOB_SELECT,
    LEASED_SQL,
    WORKER_SELECT,
    Transaction,
    allocation_from_row,
    indices_text,
    job_from_row,
    to_json,
    worker_from_row,
)
from corral.store.schema import DECLARED_INDEXES


def _partial_index_predicate(name: str) -> str:
    """The predicate of a declared partial index, word for word as its DDL writes it."""
    where = DECLARED_INDEXES[name].where
    if where is None:
        raise ValueError(f"index {name} is not partial")
    return where


#: the ids of the jobs a worker holds running or preempting (its heartbeat's ``running`` check).
#: It names the ``jobs_holding`` index's predicate as the DDL writes it: SQLite uses a partial index
#: only for a query whose WHERE holds that term as written (not the same statuses in another order,
#: as ``HOLDING_SQL`` lists them); without it, SQLite looked for a worker's jobs by status among every
#: running job of the fleet, at each worker heartbeat
LEASED_ON_WORKER_SQL = (
    f"SELECT id FROM jobs WHERE worker_id = ? AND {_partial_index_predicate('jobs_holding')}"
    f" AND status IN {LEASED_SQL}"
)


class SqlWorkers:
    """The ``Workers`` port over a ``Database``, with the reaper's reads of jobs (its candidates)
    and the cluster's counts."""

    def __init__(self, db: Database, dialect: Dialect, jobs: SqlJobs) -> None:
        self.db = db
        self.dialect = dialect
        #: the jobs' part: the leases a worker heartbeat carries are renewed in its transaction
        self.jobs = jobs

    # --- workers -------------------------------------------------------------------------

    def register_worker(self, registration: WorkerRegistration, now: float) -> Worker:
        """Upsert by id: a re-register updates resources and revives an offline worker. A
        re-register whose resources would not cover what the worker's jobs hold (fewer GPUs than
        it runs jobs on, say) is a ``Conflict`` naming them: nothing changes."""
        resources = registration.resources
        worker_id = registration.id or new_worker_id()
        with self.db.transaction() as tx:
            if registration.id:
                self._check_still_holds(tx, worker_id, resources)
            rows = tx.execute(
                f"INSERT INTO workers ({WORKER_SELECT})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'active', ?, ?, NULL, NULL, '', ?)"
                " ON CONFLICT (id) DO UPDATE SET address = excluded.address, gpus = excluded.gpus,"
                " vram_mb = excluded.vram_mb, memory_mb = excluded.memory_mb, cpus = excluded.cpus,"
                " gpu_model = excluded.gpu_model, labels = excluded.labels,"
                " enforcement = excluded.enforcement,"
                " status = CASE WHEN workers.status = 'draining' THEN 'draining' ELSE 'active' END,"
                " last_heartbeat_at = excluded.last_heartbeat_at, flagged_dead_at = NULL,"
                " unhealthy_gpus = ''"
                f" RETURNING {WORKER_SELECT}",
                (
                    worker_id, registration.address, resources.gpus, resources.vram_mb,
                    resources.memory_mb, resources.cpus, registration.gpu_model,
                    to_json(registration.labels), now, now, to_json(registration.enforcement),
                ),
            )  # fmt: skip
            return worker_from_row(rows[0])

    def _check_still_holds(self, tx: Transaction, worker_id: str, resources: Resources) -> None:
        # The worker's row first, locked: no claim places a job on it while this reads its jobs.
        tx.execute(f"SELECT id FROM workers WHERE id = ?{self.dialect.lock_clause_plain}", (worker_id,))
        held = worker_allocations(tx, worker_id)
        short = capacity_shortfall(resources, held)
        if short:
            jobs = ", ".join(sorted(allocation.job_id for allocation in held))
            raise errors.Conflict(
                f"worker {worker_id} cannot re-register with {resources.to_dict()}: too few"
                f" {', '.join(short)} for the jobs it holds ({jobs}); let them end or cancel them first"
            )

    def worker_heartbeat(
        self,
        worker_id: str,
        now: float,
        gpu_stats: list[dict[str, Any]] | None,
        unhealthy_gpus: Sequence[int] | None = None,
        running: Sequence[str] | None = None,
        jobs: Sequence[tuple[str, int, JobReport]] = (),
    ) -> WorkerBeat:
        """Renew a worker's liveness: revives an offline worker, clears a dead flag, keeps its GPU
        readings, and records the GPUs it reports unhealthy (a report only adds: a GPU comes back by
        re-registering). With ``running`` (the jobs the worker says it runs), also returns the jobs
        the store holds running or preempting on it that the list leaves out. ``jobs``: the leases
        renewed in the same transaction (SQLite locks the whole database, not rows: no lock order
        to keep; ``PostgresWorkers`` renews them after its transaction, ``Workers.worker_heartbeat``)."""
        with self.db.transaction() as tx:
            previous = load_worker(tx, self.dialect, worker_id, lock=True)
            for field, indices in (
                ("gpus", [reading["index"] for reading in gpu_stats or ()]),
                ("unhealthy_gpus", unhealthy_gpus or ()),
            ):
                unknown = unregistered_gpus(previous, indices)
                if unknown:
                    raise errors.InvalidRequest(
                        f"{field}: worker {worker_id} registered {previous.resources.gpus} GPU(s):"
                        f" it has no GPU {', '.join(map(str, unknown))}",
                        field=field,
                    )
            unhealthy_text = None
            if unhealthy_gpus:
                unhealthy_text = indices_text(sorted(set(previous.unhealthy_gpus) | set(unhealthy_gpus)))
            rows = tx.execute(
                "UPDATE workers SET last_heartbeat_at = ?, flagged_dead_at = NULL,"
                " status = CASE WHEN status = 'offline' THEN 'active' ELSE status END,"
                " gpu_stats = COALESCE(?, gpu_stats), unhealthy_gpus = COALESCE(?, unhealthy_gpus)"
                f" WHERE id = ? RETURNING {WORKER_SELECT}",
                (now, to_json(gpu_stats) if gpu_stats is not None else None, unhealthy_text, worker_id),
            )
            unlisted: tuple[Job, ...] = ()
            if running is not None:
                unlisted = self._unlisted_jobs(tx, worker_id, set(running))
            renewed = tuple(self.jobs.renew_leases(tx, worker_id, now, jobs)) if jobs else ()
            return WorkerBeat(
                worker_from_row(rows[0]),
                previous.last_heartbeat_at,
                previous.unhealthy_gpus,
                unlisted,
                renewed,
            )

    def _unlisted_jobs(self, tx: Transaction, worker_id: str, listed: set[str]) -> tuple[Job, ...]:
        """The jobs held running or preempting on the worker that ``listed`` leaves out, in id order.

        Ids first, then whole rows for the unlisted ones only: a worker lists every job it runs, so
        there are normally none, and a fleet's worker heartbeats need not build a ``Job`` for each
        of its jobs (issue 13)."""
        held = tx.execute(LEASED_ON_WORKER_SQL, (worker_id,))
        missing = sorted(job_id for (job_id,) in held if job_id not in listed)
        if not missing:
            return ()
        rows = tx.execute(
            f"SELECT {JOB_SELECT} FROM jobs WHERE worker_id = ? AND status IN {LEASED_SQL}"
            f" AND id IN ({', '.join('?' for _ in missing)}) ORDER BY id",
            (worker_id, *missing),
        )
        return tuple(map(job_from_row, rows))

    def drain_worker(self, worker_id: str) -> Worker:
        with self.db.transaction() as tx:
            rows = tx.execute(
                f"UPDATE workers SET status = 'draining' WHERE id = ? RETURNING {WORKER_SELECT}",
                (worker_id,),
            )
            if not rows:
                raise errors.NotFound(f"worker {worker_id} not found")
            return worker_from_row(rows[0])

    def undrain_worker(self, worker_id: str) -> Worker:
        """Undo a drain: a draining worker is active again (any other status is left as it is:
        an offline worker comes back by its heartbeat)."""
        with self.db.transaction() as tx:
            rows = tx.execute(
                "UPDATE workers SET status = CASE WHEN status = 'draining' THEN 'active' ELSE status END"
                f" WHERE id = ? RETURNING {WORKER_SELECT}",
                (worker_id,),
            )
            if not rows:
                raise errors.NotFound(f"worker {worker_id} not found")
            return worker_from_row(rows[0])

    def get_worker(self, worker_id: str) -> WorkerView | None:
        rows = self.db.read().execute(f"SELECT {WORKER_SELECT} FROM workers WHERE id = ?", (worker_id,))
        if not rows:
            return None
        worker = worker_from_row(rows[0])
        return self._views([worker], worker_allocations(self.db.read(), worker.id))[0]

    def workers(self) -> list[Worker]:
        """Every registered worker, without what it holds (callers that read ``allocations()``
        anyway need no second pass over them)."""
        rows = self.db.read().execute(f"SELECT {WORKER_SELECT} FROM workers ORDER BY registered_at, id")
        return [worker_from_row(row) for row in rows]

    def list_workers(self) -> list[WorkerView]:
        """Every worker with what it holds. The holdings are summed from plain rows, not read as
        ``Allocation`` records: at 2,000 workers x 8 jobs the records cost more than the rest of
        ``GET /workers``, a long read whose interpreter time the heartbeats wait on."""
        rows = self.db.read().execute(
            "SELECT worker_id, id, gpus, vram_mb, memory_mb, cpus FROM jobs"
            f" WHERE status IN {HOLDING_SQL} AND worker_id IS NOT NULL ORDER BY id"
        )
        held: dict[str, tuple[int, int, int, int, list[str]]] = {}
        for worker_id, job_id, gpus, vram_mb, memory_mb, cpus in rows:
            summed = held.get(worker_id)
            if summed is None:
                held[worker_id] = (gpus, vram_mb, memory_mb, cpus, [job_id])
            else:  # VRAM is per GPU: the largest is kept, as ``Resources.__add__`` does
                summed[4].append(job_id)
                held[worker_id] = (
                    summed[0] + gpus,
                    max(summed[1], vram_mb),
                    summed[2] + memory_mb,
                    summed[3] + cpus,
                    summed[4],
                )
        views = []
        for worker in self.workers():
            gpus, vram_mb, memory_mb, cpus, job_ids = held.get(worker.id, (0, 0, 0, 0, []))
            views.append(WorkerView(worker, Resources(gpus, vram_mb, memory_mb, cpus), tuple(job_ids)))
        return views

    def workers_by_id(self, worker_ids: Sequence[str]) -> dict[str, Worker]:
        """The named workers (unknown ids left out), without their allocations."""
        if not worker_ids:
            return {}
        unique = sorted(set(worker_ids))
        rows = self.db.read().execute(
            f"SELECT {WORKER_SELECT} FROM workers WHERE id IN ({', '.join('?' for _ in unique)})", unique
        )
        return {worker.id: worker for worker in map(worker_from_row, rows)}

    def _views(self, workers: list[Worker], allocations: list[Allocation]) -> list[WorkerView]:
        by_worker: dict[str, list[Allocation]] = {}
        for allocation in allocations:
            by_worker.setdefault(allocation.worker_id, []).append(allocation)
        views = []
        for worker in workers:
            held = by_worker.get(worker.id, [])
            used = Resources()
            for allocation in held:
                used = used + allocation.resources
            views.append(WorkerView(worker, used, tuple(allocation.job_id for allocation in held)))
        return views

    # --- liveness --------------------------------------------------------------------------

    #: no job of the worker heartbeated since the cutoff (the worker's own heartbeat is checked
    #: beside it): a worker heartbeats every 15 s, each of its jobs every 5 s, and any of them
    #: shows the worker alive
    NO_JOB_CONTACT_SQL = (
        "NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.worker_id = workers.id"
        f" AND jobs.status IN {LEASED_SQL} AND jobs.last_heartbeat_at >= ?)"
    )

    def dead_candidates(self, cutoff: float) -> list[str]:
        """Workers silent since ``cutoff`` that hold leased jobs and carry no dead flag: a
        pre-filter by ``core.workers.flagged_dead``'s rule, which decides each on its locked row."""
        rows = self.db.read().execute(
            "SELECT id FROM workers WHERE flagged_dead_at IS NULL AND last_heartbeat_at < ?"
            " AND EXISTS (SELECT 1 FROM jobs"
            f"             WHERE jobs.worker_id = workers.id AND jobs.status IN {LEASED_SQL})"
            f" AND {self.NO_JOB_CONTACT_SQL} ORDER BY id",
            (cutoff, cutoff),
        )
        return [row[0] for row in rows]

    def offline_candidates(self, cutoff: float) -> list[str]:
        """Active workers silent since ``cutoff``: a pre-filter by ``core.workers.goes_offline``'s
        rule, which decides each on its locked row."""
        rows = self.db.read().execute(
            "SELECT id FROM workers WHERE status = 'active' AND last_heartbeat_at < ?"
            f" AND {self.NO_JOB_CONTACT_SQL} ORDER BY id",
            (cutoff, cutoff),
        )
        return [row[0] for row in rows]

    def change_worker(self, worker_id: str, decide: WorkerDecision) -> tuple[Worker, WorkerContact] | None:
        """Lock the worker's row, read its contact, ask ``decide`` and write the record it returns
        (its status and dead flag: what the liveness rules change), in one transaction: a
        heartbeat that lands meanwhile waits on the lock and wins after. Returns the record
        written with the contact it was decided on, or None where ``decide`` changed nothing."""
        with self.db.transaction() as tx:
            worker = load_worker(tx, self.dialect, worker_id, lock=True)
            count, last_contact = tx.execute(
                "SELECT COUNT(*), MAX(last_heartbeat_at) FROM jobs"
                f" WHERE worker_id = ? AND status IN {LEASED_SQL}",
                (worker_id,),
            )[0]
            contact = WorkerContact(int(count), last_contact)
            after = decide(worker, contact)
            if after is None or after == worker:
                return None
            tx.execute(
                "UPDATE workers SET status = ?, flagged_dead_at = ? WHERE id = ?",
                (str(after.status), after.flagged_dead_at, worker_id),
            )
            return after, contact

    def remove_worker(self, worker_id: str, refused: Callable[[Worker, int], str | None]) -> None:
        """Delete the worker's row (and any capacity held on it for a gang) unless ``refused``
        (``core.workers.removal_refused``, given the locked row and the jobs holding resources on
        it) says why not: then ``Conflict`` with that message and nothing is changed."""
        with self.db.transaction() as tx:
            worker = load_worker(tx, self.dialect, worker_id, lock=True)
            (holding,) = tx.execute(
                f"SELECT COUNT(*) FROM jobs WHERE worker_id = ? AND status IN {HOLDING_SQL}", (worker_id,)
            )[0]
            refusal = refused(worker, int(holding))
            if refusal is not None:
                raise errors.Conflict(refusal)
            tx.execute("DELETE FROM holds WHERE worker_id = ?", (worker_id,))
            tx.execute("DELETE FROM workers WHERE id = ?", (worker_id,))

    def allocations(self) -> list[Allocation]:
        rows = self.db.read().execute(
            "SELECT id, worker_id, gpus, vram_mb, memory_mb, cpus, gpu_indices, status,"
            " reservation_epoch FROM jobs"
            f" WHERE status IN {HOLDING_SQL} AND worker_id IS NOT NULL ORDER BY id"
        )
        return [allocation_from_row(row) for row in rows]
