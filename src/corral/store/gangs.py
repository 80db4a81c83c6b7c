"""Gang operations of the store: reserve all-or-nothing, roll back, drain, complete, checkpoints,
holds and loop leadership. Seeds 001 (gang scheduling) and 000 (gang drain) are the specification.

Every operation locks the gang's task rows in id order first (``FOR UPDATE ... ORDER BY id`` on
PostgreSQL, the single writer on SQLite), so two replicas acting on one gang serialize instead of
deadlocking, and each decision is made on rows no one else can change under it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from corral.domain import errors
from corral.domain.records import Hold, Job, Reason
from corral.domain.resources import Resources
from corral.domain.status import TERMINAL, Status
from corral.store.base import AdmissionInputs, ClaimPolicy, Drain, DrainCompletion
from corral.store.operations import OperationsStore
from corral.store.rows import JOB_SELECT, REQUEUE_VALUES, EventSpec, Raw, Transaction, job_from_row

#: the first rendezvous port handed out on a worker (PyTorch's customary MASTER_PORT)
FIRST_MASTER_PORT = 29500
BLOCKED_VALUES: dict[str, Any] = {**REQUEUE_VALUES, "reserved_at": None, "drain_started_at": None}


class GangStore(OperationsStore):
    # --- reads ---------------------------------------------------------------------------

    def admission_inputs(self, now: float) -> AdmissionInputs:
        reader = self._read()
        rows = reader.execute(
            f"SELECT {JOB_SELECT} FROM jobs WHERE gang_id IN"
            " (SELECT DISTINCT gang_id FROM jobs"
            "  WHERE gang_id IS NOT NULL AND status IN ('blocked', 'reserved'))"
            " ORDER BY gang_id, gang_index"
        )
        gangs: dict[str, list[Job]] = {}
        for row in rows:
            job = job_from_row(row)
            gangs.setdefault(job.gang_id or "", []).append(job)
        workers = tuple(self.workers())
        ends = reader.execute(
            "SELECT id, COALESCE(started_at, ?) + walltime_s FROM jobs"
            " WHERE status IN ('reserved', 'running', 'preempting') AND walltime_s IS NOT NULL",
            (now,),
        )
        return AdmissionInputs(
            workers=workers,
            allocations=tuple(self.allocations()),
            gangs=tuple((gang_id, tuple(tasks)) for gang_id, tasks in sorted(gangs.items())),
            expected_ends={job_id: float(end) for job_id, end in ends},
        )

    def _lock_gang(self, tx: Transaction, gang_id: str) -> list[Job]:
        """Every task of the gang, locked in id order (the deadlock-free order), by gang_index."""
        rows = tx.execute(
            f"SELECT {JOB_SELECT} FROM jobs WHERE gang_id = ? ORDER BY id{self.lock_clause_plain}",
            (gang_id,),
        )
        return sorted((job_from_row(row) for row in rows), key=lambda job: job.gang_index or 0)

    # --- reserve and roll back -----------------------------------------------------------

    def reserve_gang(
        self,
        gang_id: str,
        placements: Sequence[tuple[str, str, tuple[int, ...]]],
        now: float,
        policy: ClaimPolicy[Any],
    ) -> list[Job] | None:
        """Reserve every task of a gang on its worker in one transaction, or nothing.

        ``placements`` are (job id, worker id, GPU indices) for every task. Nothing is written, and
        None returned, when a task is no longer blocked or a worker no longer has the capacity (a
        claim or another replica got there first since the snapshot).
        """
        with self._transaction() as tx:
            tasks = self._lock_gang(tx, gang_id)
            by_id = {task.id: task for task in tasks}
            if set(by_id) != {job_id for job_id, _, _ in placements} or any(
                task.status != Status.BLOCKED for task in tasks
            ):
                return None
            if not self._capacity_still_there(tx, by_id, placements, policy):
                return None
            rank_zero_worker = next(
                worker for job_id, worker, _ in placements if by_id[job_id].gang_index == 0
            )
            port = self._free_master_port(tx, rank_zero_worker)
            reserved = []
            for job_id, worker_id, gpu_indices in sorted(
                placements, key=lambda item: by_id[item[0]].gang_index or 0
            ):
                job = self._transition(
                    tx,
                    job_id,
                    now,
                    Status.BLOCKED,
                    Status.RESERVED,
                    {
                        "worker_id": worker_id,
                        "gpu_indices": ",".join(str(index) for index in gpu_indices),
                        "reservation_epoch": Raw("reservation_epoch + 1"),
                        "reserved_at": now,
                        "master_port": port,
                    },
                    EventSpec(
                        Reason("reserved", f"gang reserved on worker {worker_id}; waiting for its claim")
                    ),
                )
                assert job is not None  # the row is locked and was blocked
                reserved.append(job)
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
                worker = self._load_worker(tx, worker_id, lock=True)
            except errors.NotFound:
                return False
            if worker.status != "active":
                return False
            capacity = policy.capacity(worker, self._worker_allocations(tx, worker_id))
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

    def _free_master_port(self, tx: Transaction, worker_id: str) -> int:
        """The lowest port from 29500 that no other gang holding this worker uses for its rendezvous."""
        rows = tx.execute(
            "SELECT master_port FROM jobs WHERE worker_id = ? AND master_port IS NOT NULL"
            " AND status IN ('reserved', 'running', 'preempting')",
            (worker_id,),
        )
        used = {row[0] for row in rows}
        port = FIRST_MASTER_PORT
        while port in used:
            port += 1
        return port

    def rollback_gang(self, gang_id: str, now: float, reservation_timeout_s: float) -> Drain | list[Job]:
        """Undo a reservation that went unclaimed past the timeout.

        Reserved tasks go back to ``blocked``. If some siblings already run (the stuck state of seed
        001: they would wait forever for a peer that never joins), the gang is drained instead, with
        the stale task as the trigger. Returns the drain, or the tasks rolled back (empty when the
        reservation was claimed or renewed meanwhile).
        """
        with self._transaction() as tx:
            tasks = self._lock_gang(tx, gang_id)
            stale = [
                task
                for task in tasks
                if task.status == Status.RESERVED and (task.reserved_at or now) < now - reservation_timeout_s
            ]
            if not stale:
                return []
            reason = Reason(
                "reservation_expired",
                f"worker {stale[0].worker_id} did not claim its task within {reservation_timeout_s:.0f}s",
            )
            if any(task.status in (Status.RUNNING, Status.PREEMPTING) for task in tasks):
                return self._drain(tx, tasks, stale[0].id, now, reason, {})
            rolled = []
            for task in tasks:
                if task.status == Status.RESERVED:
                    job = self._transition(
                        tx,
                        task.id,
                        now,
                        Status.RESERVED,
                        Status.BLOCKED,
                        dict(BLOCKED_VALUES),
                        EventSpec(reason),
                    )
                    assert job is not None
                    rolled.append(job)
            return rolled

    # --- drain ---------------------------------------------------------------------------

    def _drain_for(
        self,
        tx: Transaction,
        trigger: Job,
        now: float,
        reason: Reason,
        trigger_values: dict[str, Any],
        expired_before: float | None = None,
    ) -> Drain:
        """Start the drain of ``trigger``'s gang (called by fail, the reaper and watchdog trips)."""
        assert trigger.gang_id is not None
        tasks = self._lock_gang(tx, trigger.gang_id)
        return self._drain(tx, tasks, trigger.id, now, reason, trigger_values, expired_before)

    def _drain(
        self,
        tx: Transaction,
        tasks: list[Job],
        trigger_id: str,
        now: float,
        reason: Reason,
        trigger_values: dict[str, Any],
        expired_before: float | None = None,
    ) -> Drain:
        """Seed 000's PreemptGang, in the caller's transaction, on locked rows.

        1. A new preemption epoch shared by the gang: the highest of its tasks' plus one.
        2. The trigger, whose process is gone, goes straight to ``preempted`` (no ack can come) and
           keeps its attempt: that attempt is the real failure the retry budget must count.
        3. Running peers go to ``preempting`` with the epoch (their next heartbeat says stop) and
           get their attempt back (``refunds`` + 1; ``attempts``, the fence their workers report
           with, is untouched).
        4. Reserved and pending peers go back to ``blocked``; terminal and blocked tasks stay.
        5. With ``expired_before`` (a lease-expiry drain), running peers silent since before it are
           gone too: they go straight to ``preempted`` (refunded) instead of waiting out the
           force-drain for an ack their dead worker will never send.
        """
        epoch = max(task.preemption_epoch for task in tasks) + 1
        gang_id = tasks[0].gang_id or ""
        transitioned: list[Job] = []
        trigger: Job | None = None
        for task in tasks:
            changed: Job | None = None
            if task.id == trigger_id and task.status == Status.RUNNING:
                values = {**trigger_values, "preemption_epoch": epoch, "drain_started_at": now}
                changed = self._transition(
                    tx, task.id, now, Status.RUNNING, Status.PREEMPTED, values, EventSpec(reason, epoch)
                )
            elif task.status == Status.RUNNING and _silent_since_before(task, expired_before):
                gone_reason = Reason(
                    "lease_expired", f"gang drain: {reason.message}; this task's lease expired too"
                )
                values = {
                    "preemption_epoch": epoch,
                    "drain_started_at": now,
                    "refunds": Raw("refunds + 1"),
                }
                changed = self._transition(
                    tx, task.id, now, Status.RUNNING, Status.PREEMPTED, values, EventSpec(gone_reason, epoch)
                )
            elif task.status == Status.RUNNING:
                peer_reason = Reason(
                    "gang_drain", f"gang drain: {reason.message} (task {trigger_id}); stopping"
                )
                values = {
                    "preemption_epoch": epoch,
                    "drain_started_at": now,
                    "refunds": Raw("refunds + 1"),
                }
                changed = self._transition(
                    tx,
                    task.id,
                    now,
                    Status.RUNNING,
                    Status.PREEMPTING,
                    values,
                    EventSpec(peer_reason, epoch),
                )
            elif task.status in (Status.RESERVED, Status.PENDING) and task.id == trigger_id:
                # The trigger never claimed its reservation: that counts as its attempt, or a worker
                # that never claims would have the gang reserved and drained forever.
                values = {**BLOCKED_VALUES, "preemption_epoch": epoch, "attempts": Raw("attempts + 1")}
                changed = self._transition(
                    tx, task.id, now, task.status, Status.BLOCKED, values, EventSpec(reason, epoch)
                )
            elif task.status in (Status.RESERVED, Status.PENDING):
                peer_reason = (
                    reason if task.id == trigger_id else Reason("gang_drain", f"gang drain: {reason.message}")
                )
                changed = self._transition(
                    tx,
                    task.id,
                    now,
                    task.status,
                    Status.BLOCKED,
                    {**BLOCKED_VALUES, "preemption_epoch": epoch},
                    EventSpec(peer_reason, epoch),
                )
            if changed is not None:
                transitioned.append(changed)
                if changed.id == trigger_id:
                    trigger = changed
        if trigger is None:
            trigger = next(task for task in tasks if task.id == trigger_id)
        return Drain(gang_id=gang_id, epoch=epoch, trigger=trigger, transitioned=tuple(transitioned))

    def complete_drains(self, now: float) -> list[DrainCompletion]:
        """Seed 000's completion rule for every gang whose drain has nothing left in flight.

        A gang with a task preempting or preempted and none running or preempting goes back to
        ``blocked`` as a unit, or to ``failed`` when a task is out of retries or a task already ended
        done or failed (those keep their own status). A gang with nothing in flight whose task ended
        done or failed while others wait (a rank finished, then a sibling's reservation expired)
        can never run whole again either: it fails the same way. Idempotent: a completed gang has
        nothing left to complete, so a second pass finds nothing.
        """
        gang_ids = [
            row[0]
            for row in self._read().execute(
                "SELECT DISTINCT gang_id FROM jobs WHERE gang_id IS NOT NULL"
                " AND (status IN ('preempting', 'preempted') OR (status IN ('done', 'failed') AND gang_id IN"
                "  (SELECT gang_id FROM jobs WHERE status IN ('blocked', 'reserved', 'pending'))))"
                " ORDER BY gang_id"
            )
        ]
        completions = []
        for gang_id in gang_ids:
            completion = self.complete_drain(gang_id, now)
            if completion is not None:
                completions.append(completion)
        return completions

    def complete_drain(self, gang_id: str, now: float) -> DrainCompletion | None:
        """Complete one gang's drain if nothing of it is left in flight (else None). Called right
        after the last ack, so a drain ends as soon as its last rank has stopped, not at the next
        reaper pass."""
        with self._transaction() as tx:
            tasks = self._lock_gang(tx, gang_id)
            statuses = {task.status for task in tasks}
            if statuses & {Status.RUNNING, Status.PREEMPTING}:
                return None
            stranded = statuses & {Status.DONE, Status.FAILED} and statuses - TERMINAL
            if Status.PREEMPTED not in statuses and not stranded:
                return None
            return self._complete(tx, gang_id, tasks, now)

    def _complete(self, tx: Transaction, gang_id: str, tasks: list[Job], now: float) -> DrainCompletion:
        exhausted = [task for task in tasks if not task.retries_left]
        ended = [task for task in tasks if task.status in (Status.DONE, Status.FAILED)]
        epoch = max(task.preemption_epoch for task in tasks)
        started = [task.drain_started_at for task in tasks if task.drain_started_at is not None]
        if exhausted or ended:
            culprit = exhausted[0] if exhausted else ended[0]
            why = "is out of retries" if exhausted else f"already ended {culprit.status.value}"
            reason = Reason("gang_failed", f"gang failed: task {culprit.gang_index} ({culprit.id}) {why}")
            outcome, target, values = "failed", Status.FAILED, {"finished_at": now, "drain_started_at": None}
        else:
            reason = Reason(
                "gang_requeued", "gang drained; waiting for the admission cycle to place it again"
            )
            outcome, target, values = "blocked", Status.BLOCKED, dict(BLOCKED_VALUES)
        changed = []
        for task in tasks:
            if task.status in TERMINAL or (task.status == target):
                continue
            job = self._transition(
                tx, task.id, now, task.status, target, dict(values), EventSpec(reason, epoch)
            )
            if job is not None:
                changed.append(job)
        return DrainCompletion(
            gang_id=gang_id,
            outcome=outcome,
            epoch=epoch,
            drain_seconds=now - min(started) if started else None,
            tasks=tuple(changed),
        )

    # --- checkpoints ---------------------------------------------------------------------

    def save_checkpoint(
        self, job_id: str, worker_id: str, attempt: int, epoch: int | None, data: bytes, now: float
    ) -> Job:
        """Store opaque bytes for the job's next attempt, from the worker and attempt that hold it.

        With ``epoch``: only while the job is preempting at that epoch (the stop the server asked
        for). Without: from the current attempt however it is ending (a crash, a rank dying on its
        own when its peer did, done), so only while that attempt has not made its final report:
        the job is still running or preempting with this worker and attempt. One slot per job: a
        save replaces the last one.
        """
        fence = (worker_id, attempt)
        with self._transaction() as tx:
            if epoch is not None:
                job = self._locked_preempting(tx, job_id, fence, epoch)
            else:
                job = self._load_job(tx, job_id, lock=True)
                if (
                    job.worker_id != worker_id
                    or job.attempts != attempt
                    or job.status not in (Status.RUNNING, Status.PREEMPTING)
                ):
                    raise self._explain_conflict(tx, job_id, fence, (Status.RUNNING, Status.PREEMPTING))
            tx.execute("DELETE FROM checkpoints WHERE job_id = ?", (job_id,))
            tx.execute(
                "INSERT INTO checkpoints (job_id, data, size, epoch, saved_at, attempt)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (job_id, data, len(data), job.preemption_epoch if epoch is None else epoch, now, attempt),
            )
            rows = tx.execute(
                f"UPDATE jobs SET has_checkpoint = 1 WHERE id = ? RETURNING {JOB_SELECT}", (job_id,)
            )
            return job_from_row(rows[0])

    def get_checkpoint(self, job_id: str) -> bytes | None:
        if self.get_job(job_id) is None:
            raise errors.NotFound(f"job {job_id} not found")
        rows = self._read().execute("SELECT data FROM checkpoints WHERE job_id = ?", (job_id,))
        return bytes(rows[0][0]) if rows else None

    # --- holds ---------------------------------------------------------------------------

    def replace_holds(self, holds: Sequence[Hold]) -> None:
        """The admission leader's current holds replace the previous ones, in one transaction."""
        with self._transaction() as tx:
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

    def holds_on(self, tx: Transaction, worker_id: str) -> list[Hold]:
        rows = tx.execute(
            "SELECT worker_id, gang_id, gpus, vram_mb, memory_mb, cpus, expected_at FROM holds"
            " WHERE worker_id = ? ORDER BY gang_id",
            (worker_id,),
        )
        return [Hold(row[1], row[0], Resources(row[2], row[3], row[4], row[5]), row[6]) for row in rows]

    def list_holds(self) -> list[Hold]:
        rows = self._read().execute(
            "SELECT worker_id, gang_id, gpus, vram_mb, memory_mb, cpus, expected_at FROM holds"
            " ORDER BY worker_id, gang_id"
        )
        return [Hold(row[1], row[0], Resources(row[2], row[3], row[4], row[5]), row[6]) for row in rows]

    # --- gang reasons ----------------------------------------------------------------------

    def set_waiting_reason(self, gang_id: str, reason: Reason) -> None:
        """Record why a blocked gang was not placed (no status change, so no event row)."""
        with self._transaction() as tx:
            tx.execute(
                "UPDATE jobs SET reason_code = ?, reason_message = ? WHERE gang_id = ? AND status = 'blocked'"
                " AND (reason_code IS NULL OR reason_code <> ? OR reason_message <> ?)",
                (reason.code, reason.message, gang_id, reason.code, reason.message),
            )

    # --- leadership ----------------------------------------------------------------------

    def try_lead(self, loop: str) -> bool:
        """Whether this process runs ``loop`` now. One process per SQLite file: always."""
        return True


def _silent_since_before(task: Job, cutoff: float | None) -> bool:
    if cutoff is None:
        return False
    last_contact = task.last_heartbeat_at or task.started_at
    return last_contact is not None and last_contact < cutoff
