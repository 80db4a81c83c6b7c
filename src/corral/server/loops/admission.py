"""The admission loop: the scheduling cycle (``corral.core.cycle``) on the store: read the snapshot,
let the core decide, apply each decision through the store.

Every decision is applied by its own compare-and-set transaction, so a decision made on a snapshot
that has moved on (a claim took the capacity, another replica reserved the gang) changes nothing
and is simply made again, correctly, on the next pass.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral.core import admission, cycle, topology
from corral.core.admission import CycleMemo
from corral.core.decisions import AdmissionDecisions, Reservation, Rollback, Waiting
from corral.core.preemption import Preemption, PreemptionSettings
from corral.core.preemption.limits import limited_pool
from corral.domain import pools
from corral.domain.clock import Clock
from corral.domain.records import Hold, Job, Reason
from corral.server import changes
from corral.server.collector import collector_paused
from corral.server.executor import Work
from corral.server.loops.drain import record_completion, record_drain
from corral.server.state import ServerState
from corral.store.ports import Store

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
    #: the instant the pass decided at: read after its snapshot (``plan_pass``)
    now: float


@dataclass(frozen=True)
class PlanSettings:
    """What planning a pass reads of the server's settings."""

    reservation_timeout_s: float
    preemption: PreemptionSettings
    pool_defaults: pools.PoolDefaults
    backfill_depth: int = admission.DEFAULT_BACKFILL_DEPTH
    topology_levels: tuple[str, ...] = topology.DEFAULT_LEVELS

    @classmethod
    def of(cls, state: ServerState) -> PlanSettings:
        return cls(
            state.settings.reservation_timeout_s,
            state.preemption_settings(),
            state.pool_defaults,
            state.settings.backfill_depth,
            state.topology_levels,
        )


def note_reservations(state: ServerState, holds: Sequence[Hold]) -> None:
    """The reservations just written (holds with a start), for the metrics: how many gangs and
    jobs have one, and each worker's, for the claims that backfill beside them."""
    planned = [hold for hold in holds if hold.expected_at is not None]
    by_worker: dict[str, list[Hold]] = {}
    for hold in planned:
        by_worker.setdefault(hold.worker_id, []).append(hold)
    state.reservations = by_worker
    state.metrics.backfill_reservations.set(len({hold.gang_id for hold in planned}))


def admission_tick(state: ServerState) -> None:
    """One admission pass: planned in the planner process where the server runs one
    (``offload.StoreProcess``: the pass's Python then never competes with the requests for the
    interpreter), else here; applied here."""
    plan = state.executor.call(
        Work.PLAN, plan_in_process, PlanSettings.of(state), dict(state.last_preemptive), state.clock
    )
    apply_pass(state, plan, plan.now)


def plan_in_process(
    store: Store,
    memory: dict[str, Any],
    settings: PlanSettings,
    last_preemptive: Mapping[str, float],
    clock: Clock,
) -> PassPlan:
    """``plan_pass`` in the planner process (or on the caller's thread: every pass comes this
    way), with the ``CycleMemo`` it keeps there and the cyclic garbage collector paused
    (``collector.collector_paused``)."""
    memo: CycleMemo = memory.setdefault("admission_memo", CycleMemo())
    with collector_paused():
        return plan_pass(store, settings, memo, last_preemptive, clock)


def plan_pass(
    store: Store,
    settings: PlanSettings,
    memo: CycleMemo,
    last_preemptive: Mapping[str, float],
    clock: Clock,
) -> PassPlan:
    """Read the snapshot (``cycle.snapshot_of``) and let the core decide. Writes only the
    fair-share timers (when they change: kept in the store, so a new leader and every replica's
    ``GET /pools`` see them): the decisions are applied by ``apply_pass``.

    The pass decides at ``clock``'s time read *after* its snapshot: a pass waits for the
    planner and reads for a while, and work claimed meanwhile is in what it read. Decided at a
    time taken before, such work started "in the future": its lost work, clamped at zero, made
    every victim look equally free, and a preemption stopped the oldest jobs instead of the
    newest."""
    inputs = store.gangs.admission_inputs()
    reading = cycle.CycleReading(
        workers=inputs.workers,
        allocations=inputs.allocations,
        gangs=inputs.gangs,
        holding=inputs.holding,
        preemptors=inputs.pending,
    )
    previous = store.pools.pool_starvation()
    pools_reading = cycle.PoolsReading(
        pools=pools.resolve(store.pools.pools(), settings.pool_defaults),
        usage=store.pools.pool_usage(),
        starvation=previous,
        defaults=settings.pool_defaults,
    )
    now = clock.now()
    snapshot = cycle.snapshot_of(reading, now, pools_reading, store.gangs.pending_in_pools, last_preemptive)
    if snapshot.fair is not None and snapshot.fair.starvation != previous:
        store.pools.put_pool_starvation(snapshot.fair.starvation)
    decisions = admission.decide(
        snapshot,
        settings.reservation_timeout_s,
        settings.preemption,
        memo,
        settings.backfill_depth,
        settings.topology_levels,
    )
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
        now=now,
    )


def apply_pass(state: ServerState, plan: PassPlan, now: float) -> None:
    """Apply a pass's decisions in the cycle's order (``cycle.apply_cycle``), each through the
    store in its own compare-and-set transaction (``StoreEffects``)."""
    state.gangs_waiting = plan.gangs_waiting
    effects = StoreEffects(state, plan, now)
    applied = cycle.apply_cycle(
        plan.decisions, effects, now, state.last_preemptive, state.settings.preemptive_backoff_s
    )
    state.last_preemptive.clear()
    state.last_preemptive.update(applied.last_preemptive)
    if applied.reserved:
        state.signal.notify()


def record_gang_reserved(
    state: ServerState, reserved: Sequence[Job], victims: Sequence[str] | None = None
) -> None:
    """``gang reserved`` (API.md's drain story) and ``corral_gangs_reserved_total``, for a gang the
    admission cycle reserved or a preemption reserved on its victims' room (``victims``: the jobs
    and gangs it waits for, None when it waits for none)."""
    state.metrics.gangs_reserved.inc()
    fields: dict[str, object] = {
        "gang_id": reserved[0].gang_id,
        "gang_size": len(reserved),
        "worker_ids": [job.worker_id for job in reserved],
        "reservation_epoch": reserved[0].reservation_epoch,
    }
    if victims is not None:
        fields["victims"] = list(victims)
    logger.info("gang reserved", extra=fields)


class StoreEffects:
    """The server's ``cycle.CycleEffects``: each decision through the store (``changes``), with the
    metrics and the log lines that tell who was reserved, rolled back or stopped for whom."""

    def __init__(self, state: ServerState, plan: PassPlan, now: float) -> None:
        self.state, self.plan, self.now = state, plan, now

    def roll_back_gang(self, rollback: Rollback) -> bool:
        state = self.state
        started, completion, rolled = changes.roll_back_stale(
            state.store.jobs,
            rollback.gang_id,
            self.now,
            state.settings.reservation_timeout_s,
            rollback.epoch_of(),
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
        return bool(rolled) or started is not None or completion is not None

    def reserve_gang(self, reservation: Reservation) -> bool:
        state = self.state
        placements = [(place.job_id, place.worker_id, place.gpu_indices) for place in reservation.placements]
        reserved = changes.reserve_gang(state.store.gangs, reservation.gang_id, placements, state.clock.now)
        if reserved is None:
            logger.info(
                "gang reservation lost a race; retrying next pass", extra={"gang_id": reservation.gang_id}
            )
            return False
        record_gang_reserved(state, reserved)
        return True

    def roll_back_single(self, job_id: str, epoch: int | None = None) -> bool:
        state = self.state
        rolled = changes.roll_back_single(
            state.store.jobs, job_id, self.now, state.settings.reservation_timeout_s, epoch
        )
        if rolled is None:
            return False
        logger.warning("reservation rolled back", extra={"job_id": job_id})
        state.signal.notify()
        return True

    def preempt(self, preemption: Preemption) -> bool:
        state = self.state
        started = changes.preempt(
            state.store.gangs,
            preemption,
            self.plan.jobs,
            state.clock.now,
            state.settings.checkpoint_timeout_s,
        )
        if started is None:
            logger.info(
                "preemption lost a race; planning again next pass", extra={"preemptor": preemption.preemptor}
            )
            return False
        if started.reserved and started.reserved[0].gang_id is not None:
            # a gang made room for is reserved as the admission cycle reserves one: told and counted
            # the same way (seed 000's ``gang reserved``), with the victims it waits for
            record_gang_reserved(state, started.reserved, [victim.key for victim in preemption.victims])
        over = limited_pool(preemption.preemptor)
        if over is not None:
            logger.warning(
                "pool over its limits: preempting",
                extra={"pool": over, "victims": [victim.key for victim in preemption.victims]},
            )
        for victim in preemption.victims:
            victim_job = self.plan.jobs.get(victim.job_ids[0]) if victim.job_ids else None
            pool = victim_job.spec.pool if victim_job is not None else ""
            state.metrics.preemptions.labels(reason=victim.reason, pool=pool).inc()
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
        return True

    def note_singles_waiting(self, notes: Sequence[tuple[str, Reason]]) -> None:
        # Only where the snapshot showed another reason; the core decides again on each locked row.
        said = self.plan.said
        changed = [(job_id, reason) for job_id, reason in notes if said.get(job_id) != reason]
        changes.note_singles_waiting(self.state.store.jobs, changed, self.now)

    def replace_holds(self, holds: Sequence[Hold]) -> None:
        # Compared with the table, not with this replica's memory: holds written by a leader that
        # has since stopped must not outlive it.
        store = self.state.store
        if list(holds) != store.gangs.list_holds():
            store.gangs.replace_holds(holds)
        note_reservations(self.state, holds)

    def note_gangs_waiting(self, waiting: Sequence[Waiting]) -> None:
        # Only where the snapshot shows a blocked task saying something else (the common cycle
        # changes nothing); the core decides again on the locked rows.
        for each in waiting:
            if any(reason != each.reason for reason in self.plan.gang_reasons.get(each.gang_id, ())):
                changes.note_waiting(self.state.store.jobs, each.gang_id, each.reason, self.now)
