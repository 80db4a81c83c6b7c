"""Worker bookkeeping and the server's sweeps: registration and heartbeats, watchdog trips, the
dead-worker flag and the reaper. Each change is its own compare-and-set transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from corral.domain import errors
from corral.domain.ids import new_worker_id
from corral.domain.records import Allocation, Job, Reason, Worker
from corral.domain.resources import Resources
from corral.domain.status import TERMINAL, Status
from corral.store.base import Drain, ReapReport, WorkerRegistration, WorkerView
from corral.store.rows import (
    JOB_SELECT,
    REQUEUE_VALUES,
    WORKER_SELECT,
    EventSpec,
    Raw,
    Transaction,
    indices_text,
    job_from_row,
    to_json,
    worker_from_row,
)
from corral.store.sql import SqlStore


class OperationsStore(SqlStore):
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
            job = self._lock_for_change(tx, job_id)
            if job.worker_id != worker_id or job.attempts != attempt:
                raise self._explain_conflict(tx, job_id, fence, (Status.RUNNING,))
            if job.status == Status.PREEMPTING:
                return self._finish_stop(tx, job, now, fence, f"{kind} watchdog stopped it: {detail}")
            if job.status != Status.RUNNING:
                # A retried report for a trip already applied: nothing left to change.
                raise self._explain_conflict(tx, job_id, fence, (Status.RUNNING,))
            trip = f"{kind} watchdog tripped ({job.watchdog_retries + 1} of {max_retries + 1})"
            if job.gang_id is not None:
                return self._gang_watchdog_trip(tx, job, now, kind, detail, trip, max_retries, fence)
            if job.watchdog_retries < max_retries:
                target = Status.PENDING
                reason = Reason(f"watchdog_{kind}", f"{trip}; re-queued at the front: {detail}")
                values: dict[str, Any] = {
                    **REQUEUE_VALUES,
                    "queue_front": 1,
                    "watchdog_retries": Raw("watchdog_retries + 1"),
                    "error": f"{kind} watchdog: {detail}",
                }
            else:
                target = Status.FAILED
                reason = Reason(f"watchdog_{kind}", f"{trip}; out of watchdog retries: {detail}")
                values = {"finished_at": now, "error": f"{kind} watchdog: {detail}"}
            result = self._transition(
                tx, job_id, now, Status.RUNNING, target, values, EventSpec(reason), fence
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
        drain completes the gang as failed. As for a single job, the watchdog budget alone decides:
        the trip does not also spend the rank's attempt (it is refunded)."""
        error = f"{kind} watchdog: {detail}"
        if job.watchdog_retries < max_retries:
            reason = Reason(f"watchdog_{kind}", f"{trip}; draining the gang: {detail}")
            values = {
                "watchdog_retries": job.watchdog_retries + 1,
                "error": error,
                "refunds": Raw("refunds + 1"),
            }
            return self._drain_for(tx, job, now, reason, values).trigger
        reason = Reason(f"watchdog_{kind}", f"{trip}; out of watchdog retries: {detail}")
        failed = self._transition(
            tx,
            job.id,
            now,
            Status.RUNNING,
            Status.FAILED,
            {"finished_at": now, "error": error, "drain_started_at": now},
            EventSpec(reason),
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
                "             WHERE jobs.worker_id = workers.id AND jobs.status IN ('running', 'preempting'))"
                f" RETURNING {WORKER_SELECT}",
                (now, now - after_s),
            )
            flagged = sorted((worker_from_row(row) for row in rows), key=lambda worker: worker.id)
            result = []
            for worker in flagged:
                count = tx.execute(
                    "SELECT COUNT(*) FROM jobs WHERE worker_id = ? AND status IN ('running', 'preempting')",
                    (worker.id,),
                )[0][0]
                result.append((worker, int(count)))
            return result

    # --- cancel --------------------------------------------------------------------------

    def cancel(self, job_id: str, now: float) -> list[Job]:
        """Cancel a job, or every task of its gang, in one transaction.

        Jobs that are not running are cancelled at once. Running jobs go to ``preempting`` with
        ``cancel_requested``: their next heartbeat tells the worker to stop them (SIGTERM, grace,
        SIGKILL), and the worker's ack makes them ``cancelled``. 409 ``already_terminal`` when the
        job (every task, for a gang) has already finished.
        """
        with self._transaction() as tx:
            job = self._lock_for_change(tx, job_id)
            targets = self._lock_gang(tx, job.gang_id) if job.gang_id is not None else [job]
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
                EventSpec(Reason("cancel_requested", "cancel requested; stopping the job"), epoch),
            )
        if job.status == Status.PREEMPTING:
            # Already being stopped (a drain or a preemption): the stop ends as a cancel instead.
            rows = tx.execute(
                "UPDATE jobs SET cancel_requested = 1 WHERE id = ? AND status = 'preempting'"
                f" RETURNING {JOB_SELECT}",
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
            EventSpec(Reason("cancelled", "cancelled by request")),
        )

    # --- workers -------------------------------------------------------------------------

    def register_worker(self, registration: WorkerRegistration, now: float) -> Worker:
        """Upsert by id: a re-register updates resources and revives an offline worker."""
        resources = registration.resources
        worker_id = registration.id or new_worker_id()
        with self._transaction() as tx:
            rows = tx.execute(
                f"INSERT INTO workers ({WORKER_SELECT})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'active', ?, ?, NULL, NULL, '')"
                " ON CONFLICT (id) DO UPDATE SET address = excluded.address, gpus = excluded.gpus,"
                " vram_mb = excluded.vram_mb, memory_mb = excluded.memory_mb, cpus = excluded.cpus,"
                " gpu_model = excluded.gpu_model, labels = excluded.labels,"
                " status = CASE WHEN workers.status = 'draining' THEN 'draining' ELSE 'active' END,"
                " last_heartbeat_at = excluded.last_heartbeat_at, flagged_dead_at = NULL,"
                " unhealthy_gpus = ''"
                f" RETURNING {WORKER_SELECT}",
                (
                    worker_id, registration.address, resources.gpus, resources.vram_mb,
                    resources.memory_mb, resources.cpus, registration.gpu_model,
                    to_json(registration.labels), now, now,
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
                unhealthy_text = indices_text(sorted(set(known) | set(unhealthy_gpus)))
            else:
                unhealthy_text = None
            rows = tx.execute(
                "UPDATE workers SET last_heartbeat_at = ?, flagged_dead_at = NULL,"
                " status = CASE WHEN status = 'offline' THEN 'active' ELSE status END,"
                " gpu_stats = COALESCE(?, gpu_stats), unhealthy_gpus = COALESCE(?, unhealthy_gpus)"
                f" WHERE id = ? RETURNING {WORKER_SELECT}",
                (now, to_json(gpu_stats) if gpu_stats is not None else None, unhealthy_text, worker_id),
            )
            if not rows:
                raise errors.NotFound(f"worker {worker_id} not found")
            return worker_from_row(rows[0])

    def drain_worker(self, worker_id: str) -> Worker:
        with self._transaction() as tx:
            rows = tx.execute(
                f"UPDATE workers SET status = 'draining' WHERE id = ? RETURNING {WORKER_SELECT}",
                (worker_id,),
            )
            if not rows:
                raise errors.NotFound(f"worker {worker_id} not found")
            return worker_from_row(rows[0])

    def get_worker(self, worker_id: str) -> WorkerView | None:
        rows = self._read().execute(f"SELECT {WORKER_SELECT} FROM workers WHERE id = ?", (worker_id,))
        if not rows:
            return None
        worker = worker_from_row(rows[0])
        return self._views([worker], self._worker_allocations(self._read(), worker.id))[0]

    def workers(self) -> list[Worker]:
        """Every registered worker, without what it holds (callers that read ``allocations()``
        anyway need no second pass over them)."""
        rows = self._read().execute(f"SELECT {WORKER_SELECT} FROM workers ORDER BY registered_at, id")
        return [worker_from_row(row) for row in rows]

    def list_workers(self) -> list[WorkerView]:
        return self._views(self.workers(), self.allocations())

    def workers_by_id(self, worker_ids: Sequence[str]) -> dict[str, Worker]:
        """The named workers (unknown ids left out), without their allocations."""
        if not worker_ids:
            return {}
        unique = sorted(set(worker_ids))
        rows = self._read().execute(
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
                f"SELECT {JOB_SELECT} FROM jobs WHERE status = 'running'"
                " AND COALESCE(last_heartbeat_at, started_at) < ? ORDER BY id",
                (now - heartbeat_timeout_s,),
            )
        ]
        for candidate in stale:
            with self._transaction() as tx:
                # Re-read under lock: a heartbeat or a report may have landed since the scan.
                job = self._lock_for_change(tx, candidate.id)
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
                if job.retries_left:
                    target, values, outcome = Status.PENDING, dict(REQUEUE_VALUES), "re-queued"
                else:
                    target, values, outcome = Status.FAILED, {"finished_at": now}, "out of retries"
                reason = Reason(
                    "lease_expired", f"no heartbeat from worker {job.worker_id} for {silent:.0f}s; {outcome}"
                )
                result = self._transition(
                    tx, job.id, now, Status.RUNNING, target, values, EventSpec(reason), fence
                )
                if result is not None:
                    (requeued if target == Status.PENDING else failed).append(result)
        stuck = [
            job_from_row(row)
            for row in reader.execute(
                f"SELECT {JOB_SELECT} FROM jobs WHERE status = 'preempting' AND drain_started_at < ?"
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
