"""The admission loop: load a snapshot, let the core decide, apply each decision through the store.

Every decision is applied by its own compare-and-set transaction, so a decision made on a snapshot
that has moved on (a claim took the capacity, another replica reserved the gang) changes nothing
and is simply made again, correctly, on the next pass.
"""

from __future__ import annotations

import logging

from corral.core import admission
from corral.core.snapshot import Gang, Snapshot
from corral.server import changes
from corral.server.loops.drain import record_completion, record_drain
from corral.server.state import ServerState

logger = logging.getLogger("corral.server.admission")


def admission_tick(state: ServerState) -> None:
    now = state.clock.now()
    inputs = state.store.admission_inputs(now)
    state.gangs_waiting = bool(inputs.gangs)
    snapshot = Snapshot(
        now=now,
        workers=inputs.workers,
        allocations=inputs.allocations,
        gangs=tuple(Gang(gang_id, tasks) for gang_id, tasks in inputs.gangs),
        expected_ends=inputs.expected_ends,
    )
    decisions = admission.decide(snapshot, state.settings.reservation_timeout_s)
    for rollback in decisions.rollbacks:
        started, completion, rolled = changes.roll_back_stale(
            state.store, rollback.gang_id, now, state.settings.reservation_timeout_s
        )
        if started is not None:
            record_drain(state, started)
        if rolled:
            logger.warning(
                "gang reservation rolled back",
                extra={
                    "gang_id": rollback.gang_id,
                    "job_ids": [job.id for job in rolled],
                    "reason": rollback.reason.message,
                },
            )
        if completion is not None:
            record_completion(state, completion)
    reserved_any = False
    for reservation in decisions.reservations:
        placements = [(place.job_id, place.worker_id, place.gpu_indices) for place in reservation.placements]
        reserved = changes.reserve_gang(state.store, reservation.gang_id, placements, now)
        if reserved is None:
            logger.info(
                "gang reservation lost a race; retrying next pass", extra={"gang_id": reservation.gang_id}
            )
            continue
        reserved_any = True
        state.metrics.gangs_reserved.inc()
        logger.info(
            "gang reserved",
            extra={
                "gang_id": reservation.gang_id,
                "gang_size": len(reserved),
                "worker_ids": [job.worker_id for job in reserved],
                "reservation_epoch": reserved[0].reservation_epoch,
            },
        )
    # Compared with the table, not with this replica's memory: holds written by a leader that
    # has since stopped must not outlive it.
    if list(decisions.holds) != state.store.list_holds():
        state.store.replace_holds(decisions.holds)
    tasks_of = {gang.gang_id: gang.tasks for gang in snapshot.gangs}
    for waiting in decisions.waiting:
        # Only where the snapshot shows a blocked task saying something else (the common cycle
        # changes nothing); the core decides again on the locked rows.
        if any(task.reason != waiting.reason for task in tasks_of.get(waiting.gang_id, ())):
            changes.note_waiting(state.store, waiting.gang_id, waiting.reason, now)
    if reserved_any:
        state.signal.notify()
