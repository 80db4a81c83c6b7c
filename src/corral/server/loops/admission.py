"""The admission loop: load a snapshot, let the core decide, apply each decision through the store.

Every decision is applied by its own compare-and-set transaction, so a decision made on a snapshot
that has moved on (a claim took the capacity, another replica reserved the gang) changes nothing
and is simply made again, correctly, on the next pass.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from corral.core import admission, fairshare
from corral.core.preemption import Preemption
from corral.core.snapshot import Gang, Snapshot
from corral.domain import pools
from corral.domain.records import Worker
from corral.server import changes
from corral.server.loops.drain import record_completion, record_drain
from corral.server.state import ServerState

logger = logging.getLogger("corral.server.admission")


def admission_tick(state: ServerState) -> None:
    now = state.clock.now()
    inputs = state.store.admission_inputs(now)
    state.gangs_waiting = bool(inputs.gangs)
    resolved = pools.resolve(state.store.pools(), state.pool_defaults)
    fair = fair_share_of(state, resolved, inputs.workers, now)
    pending = inputs.pending
    starving = fair.starving_pools()
    if starving:  # their jobs may preempt within their class, whatever the lowest running class
        known = {job.id for job in pending}
        pending += tuple(job for job in state.store.pending_in_pools(starving) if job.id not in known)
    snapshot = Snapshot(
        now=now,
        workers=inputs.workers,
        allocations=inputs.allocations,
        gangs=tuple(Gang(gang_id, tasks) for gang_id, tasks in inputs.gangs),
        pending=pending,
        expected_ends=inputs.expected_ends,
        holding=inputs.holding,
        pools=resolved,
        last_preemptive=state.last_preemptive,
        fair=fair,
    )
    decisions = admission.decide(
        snapshot, state.settings.reservation_timeout_s, state.preemption_settings(), state.admission_memo
    )
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
        reserved = changes.reserve_gang(state.store, reservation.gang_id, placements, state.clock.now)
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
    for job_id in decisions.single_rollbacks:
        if (
            changes.roll_back_single(state.store, job_id, now, state.settings.reservation_timeout_s)
            is not None
        ):
            logger.warning("reservation rolled back", extra={"job_id": job_id})
            state.signal.notify()
    reserved_any = _apply_preemptions(state, decisions.preemptions, snapshot, now) or reserved_any
    said = {job.id: job.reason for job in snapshot.pending}
    # the core decides again on each locked row
    notes = [(job_id, reason) for job_id, reason in decisions.single_waiting if said.get(job_id) != reason]
    changes.note_singles_waiting(state.store, notes, now)
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


def fair_share_of(
    state: ServerState, resolved: dict[str, pools.Pool], workers: Sequence[Worker], now: float
) -> fairshare.FairShareState:
    """This cycle's fair shares and starvation; the timers are kept in the store (written only when
    they change), so a new leader, and every replica's ``GET /pools``, sees them."""
    own_usage = state.store.pool_usage()
    pools.with_job_pools(resolved, own_usage, state.pool_defaults)
    total = fairshare.cluster_of(workers)
    previous = state.store.pool_starvation()
    fair = fairshare.cycle_state(resolved, own_usage, total, previous, now)
    if fair.starvation != previous:
        state.store.put_pool_starvation(fair.starvation)
    return fair


def _apply_preemptions(
    state: ServerState, preemptions: Sequence[Preemption], snapshot: Snapshot, now: float
) -> bool:
    """Each preemption in its own transaction, all of it or nothing; metrics and the log lines that
    tell who was stopped for whom, and why. True when any preemptor was reserved."""
    jobs = {job.id: job for job in snapshot.holding}
    jobs.update((job.id, job) for job in snapshot.pending)
    jobs.update((task.id, task) for gang in snapshot.gangs for task in gang.tasks)
    started_any = False
    for preemption in preemptions:
        started = changes.preempt(
            state.store, preemption, jobs, state.clock.now, state.settings.checkpoint_timeout_s
        )
        if started is None:
            logger.info(
                "preemption lost a race; planning again next pass", extra={"preemptor": preemption.preemptor}
            )
            continue
        started_any = True
        for worker_id in preemption.worker_ids:
            state.last_preemptive[worker_id] = now
        for victim in preemption.victims:
            state.metrics.preemptions.labels(reason=victim.reason).inc()
            logger.warning(
                "job preempted for another",
                extra={
                    "victim": victim.key,
                    "job_ids": list(victim.job_ids),
                    "preemptor": preemption.preemptor,
                    "reason": victim.reason,
                    "victim_class": victim.preemption_class,
                    "cost_gpu_s": round(victim.cost, 1),
                },
            )
    cutoff = now - state.settings.preemptive_backoff_s
    for worker_id in [worker_id for worker_id, at in state.last_preemptive.items() if at <= cutoff]:
        del state.last_preemptive[worker_id]
    return started_any
