"""The admission loop: load a snapshot, let the core decide, apply each decision through the store.

Every decision is applied by its own compare-and-set transaction, so a decision made on a snapshot
that has moved on (a claim took the capacity, another replica reserved the gang) changes nothing
and is simply made again, correctly, on the next pass.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral.core import admission, fairshare
from corral.core.decisions import AdmissionDecisions
from corral.core.placement import CycleMemo
from corral.core.preemption import Preemption, PreemptionSettings
from corral.core.snapshot import Gang, Snapshot
from corral.domain import pools
from corral.domain.records import Job, Reason, Worker
from corral.server import changes
from corral.server.executor import Work
from corral.server.loops.drain import record_completion, record_drain
from corral.server.state import ServerState
from corral.store import Store

logger = logging.getLogger("corral.server.admission")


@dataclass(frozen=True)
class PassPlan:
    """What one admission pass decided, with what applying it needs of the snapshot it read: a
    value, so the pass may be planned in another process (``offload``) and applied here."""

    decisions: AdmissionDecisions
    #: whether a gang waits (blocked or reserved tasks): ``ServerState.gangs_waiting``
    gangs_waiting: bool
    #: the reason each pending single job the decisions name showed in the snapshot
    said: dict[str, Reason | None]
    #: the reasons the tasks of each waiting gang showed in the snapshot
    gang_reasons: dict[str, tuple[Reason | None, ...]]
    #: the records of the jobs the preemptions name (which of them are gangs)
    jobs: dict[str, Job]


@dataclass(frozen=True)
class PlanSettings:
    """What planning a pass reads of the server's settings."""

    reservation_timeout_s: float
    preemption: PreemptionSettings
    pool_defaults: pools.PoolDefaults

    @classmethod
    def of(cls, state: ServerState) -> PlanSettings:
        return cls(state.settings.reservation_timeout_s, state.preemption_settings(), state.pool_defaults)


def admission_tick(state: ServerState) -> None:
    """One admission pass: planned in the planner process where the server runs one
    (``offload.StoreProcess``: the pass's Python then never competes with the requests for the
    interpreter), else here; applied here."""
    now = state.clock.now()
    plan = state.executor.call(
        Work.PLAN, plan_in_process, PlanSettings.of(state), dict(state.last_preemptive), now
    )
    apply_pass(state, plan, now)


def plan_in_process(
    store: Store,
    memory: dict[str, Any],
    settings: PlanSettings,
    last_preemptive: Mapping[str, float],
    now: float,
) -> PassPlan:
    """``plan_pass`` in the planner process, with the ``CycleMemo`` it keeps there."""
    memo: CycleMemo = memory.setdefault("admission_memo", CycleMemo())
    return plan_pass(store, settings, memo, last_preemptive, now)


def plan_pass(
    store: Store,
    settings: PlanSettings,
    memo: CycleMemo,
    last_preemptive: Mapping[str, float],
    now: float,
) -> PassPlan:
    """Read the snapshot and let the core decide. Writes only the fair-share timers (when they
    change): the decisions are applied by ``apply_pass``."""
    inputs = store.admission_inputs(now)
    resolved = pools.resolve(store.pools(), settings.pool_defaults)
    fair = fair_share_of(store, settings.pool_defaults, resolved, inputs.workers, now)
    pending = inputs.pending
    starving = fair.starving_pools()
    if starving:  # their jobs may preempt within their class, whatever the lowest running class
        known = {job.id for job in pending}
        pending += tuple(job for job in store.pending_in_pools(starving) if job.id not in known)
    snapshot = Snapshot(
        now=now,
        workers=inputs.workers,
        allocations=inputs.allocations,
        gangs=tuple(Gang(gang_id, tasks) for gang_id, tasks in inputs.gangs),
        pending=pending,
        expected_ends=inputs.expected_ends,
        holding=inputs.holding,
        pools=resolved,
        last_preemptive=last_preemptive,
        fair=fair,
    )
    decisions = admission.decide(snapshot, settings.reservation_timeout_s, settings.preemption, memo)
    noted = {job_id for job_id, _ in decisions.single_waiting}
    waiting_gangs = {waiting.gang_id for waiting in decisions.waiting}
    named = {
        *(job_id for preemption in decisions.preemptions for job_id in preemption.job_ids),
        *(
            job_id
            for preemption in decisions.preemptions
            for victim in preemption.victims
            for job_id in victim.job_ids
        ),
    }
    jobs = {job.id: job for job in snapshot.holding if job.id in named}
    jobs.update((job.id, job) for job in snapshot.pending if job.id in named)
    jobs.update((task.id, task) for gang in snapshot.gangs for task in gang.tasks if task.id in named)
    return PassPlan(
        decisions=decisions,
        gangs_waiting=bool(inputs.gangs),
        said={job.id: job.reason for job in snapshot.pending if job.id in noted},
        gang_reasons={
            gang.gang_id: tuple(task.reason for task in gang.tasks)
            for gang in snapshot.gangs
            if gang.gang_id in waiting_gangs
        },
        jobs=jobs,
    )


def apply_pass(state: ServerState, plan: PassPlan, now: float) -> None:
    """Apply a pass's decisions through the store, each in its own compare-and-set transaction."""
    state.gangs_waiting = plan.gangs_waiting
    decisions = plan.decisions
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
    reserved_any = _apply_preemptions(state, decisions.preemptions, plan.jobs, now) or reserved_any
    # the core decides again on each locked row
    notes = [
        (job_id, reason) for job_id, reason in decisions.single_waiting if plan.said.get(job_id) != reason
    ]
    changes.note_singles_waiting(state.store, notes, now)
    # Compared with the table, not with this replica's memory: holds written by a leader that
    # has since stopped must not outlive it.
    if list(decisions.holds) != state.store.list_holds():
        state.store.replace_holds(decisions.holds)
    for waiting in decisions.waiting:
        # Only where the snapshot shows a blocked task saying something else (the common cycle
        # changes nothing); the core decides again on the locked rows.
        if any(reason != waiting.reason for reason in plan.gang_reasons.get(waiting.gang_id, ())):
            changes.note_waiting(state.store, waiting.gang_id, waiting.reason, now)
    if reserved_any:
        state.signal.notify()


def fair_share_of(
    store: Store,
    defaults: pools.PoolDefaults,
    resolved: dict[str, pools.Pool],
    workers: Sequence[Worker],
    now: float,
) -> fairshare.FairShareState:
    """This cycle's fair shares and starvation; the timers are kept in the store (written only when
    they change), so a new leader, and every replica's ``GET /pools``, sees them."""
    own_usage = store.pool_usage()
    pools.with_job_pools(resolved, own_usage, defaults)
    total = fairshare.cluster_of(workers)
    previous = store.pool_starvation()
    fair = fairshare.cycle_state(resolved, own_usage, total, previous, now)
    if fair.starvation != previous:
        store.put_pool_starvation(fair.starvation)
    return fair


def _apply_preemptions(
    state: ServerState, preemptions: Sequence[Preemption], jobs: Mapping[str, Job], now: float
) -> bool:
    """Each preemption in its own transaction, all of it or nothing; metrics and the log lines that
    tell who was stopped for whom, and why. True when any preemptor was reserved."""
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
