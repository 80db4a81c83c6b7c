"""One scheduling cycle, written once: the snapshot it decides on, and the order in which its
decisions are applied. The server's admission loop and the simulator run the same three steps:

1. ``snapshot_of``: the state a cycle reads (``CycleReading``: one consistent read of the store,
   or the simulator's records) becomes the ``Snapshot``: the allocations' expected ends, this
   cycle's fair shares and starvation timers, the starving pools' pending jobs added to the
   possible preemptors.
2. ``admission.decide``: the decisions, as values.
3. ``apply_cycle``: each decision through a ``CycleEffects`` (the store's compare-and-set
   transactions in the server, the simulator's records in ``corral sim``), in the one order below,
   then the per-worker preemption backoff kept up to date.

Nothing else knows the apply order: a decision type added to ``AdmissionDecisions`` is applied
here, and both callers apply it the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from corral.core import fairshare
from corral.core.decisions import AdmissionDecisions, Reservation, Rollback, Waiting
from corral.core.preemption import Preemption, PreemptionSettings
from corral.core.snapshot import Gang, Snapshot
from corral.domain import pools as pool_rules
from corral.domain.records import Allocation, Hold, Job, Reason, Worker
from corral.domain.status import Status

__all__ = [
    "CycleEffects",
    "CycleReading",
    "CycleSettings",
    "PoolsReading",
    "apply_cycle",
    "expected_ends",
    "pool_defaults",
    "preemption_settings",
    "snapshot_of",
]


class CycleSettings(Protocol):
    """The settings a cycle reads, by the names the server's ``ServerSettings`` and the simulator's
    ``SimSettings`` both give them (``CORRAL_<NAME>``)."""

    @property
    def reservation_timeout_s(self) -> float: ...
    @property
    def max_victims(self) -> int: ...
    @property
    def near_completion_s(self) -> float: ...
    @property
    def gang_preempt_exempt_s(self) -> float: ...
    @property
    def preemptive_backoff_s(self) -> float: ...
    @property
    def checkpoint_timeout_s(self) -> float: ...
    @property
    def max_deferral_s(self) -> float: ...
    @property
    def preempt_timeout_s(self) -> float: ...
    @property
    def max_preemptions_per_cycle(self) -> int: ...
    @property
    def preemption_satisfaction_threshold(self) -> float: ...
    @property
    def aggressive_preemption_satisfaction_threshold(self) -> float: ...
    @property
    def starvation_timeout_s(self) -> float: ...
    @property
    def aggressive_starvation_timeout_s(self) -> float: ...
    @property
    def starvation_tolerance(self) -> float: ...
    @property
    def default_walltime_s(self) -> float | None: ...
    @property
    def max_walltime_s(self) -> float | None: ...
    @property
    def backfill_depth(self) -> int: ...


def preemption_settings(settings: CycleSettings) -> PreemptionSettings:
    """The preemption planner's settings: the one place they are read from the server's or the
    simulator's settings."""
    return PreemptionSettings(
        max_victims=settings.max_victims,
        near_completion_s=settings.near_completion_s,
        gang_exempt_s=settings.gang_preempt_exempt_s,
        backoff_s=settings.preemptive_backoff_s,
        checkpoint_timeout_s=settings.checkpoint_timeout_s,
        max_deferral_s=settings.max_deferral_s,
        preempt_timeout_s=settings.preempt_timeout_s,
        max_preemptions_per_cycle=settings.max_preemptions_per_cycle,
        satisfaction_threshold=settings.preemption_satisfaction_threshold,
        aggressive_satisfaction_threshold=settings.aggressive_preemption_satisfaction_threshold,
    )


def pool_defaults(settings: CycleSettings) -> pool_rules.PoolDefaults:
    """What a pool inherits when neither it nor an ancestor sets a value."""
    return pool_rules.PoolDefaults(
        starvation_timeout_s=settings.starvation_timeout_s,
        aggressive_starvation_timeout_s=settings.aggressive_starvation_timeout_s,
        starvation_tolerance=settings.starvation_tolerance,
        default_walltime_s=settings.default_walltime_s,
        max_walltime_s=settings.max_walltime_s,
    )


@dataclass(frozen=True, slots=True)
class CycleReading:
    """What a cycle reads of the state, in one consistent read.

    ``preemptors``: the pending single jobs that may preempt, in queue order: those of a class at
    least ``domain.queue_order.preemptor_floor`` of the holding jobs, at most
    ``PREEMPTOR_CANDIDATES`` (empty where the preemption planner does not run)."""

    workers: tuple[Worker, ...]
    allocations: tuple[Allocation, ...]
    #: the gangs with a blocked or reserved task, each with every task in ``gang_index`` order
    gangs: tuple[tuple[str, tuple[Job, ...]], ...]
    #: every job holding resources (reserved, running, preempting), whole rows
    holding: tuple[Job, ...]
    preemptors: tuple[Job, ...] = ()


@dataclass(frozen=True, slots=True)
class PoolsReading:
    """What a cycle reads of the pools: the pools as resolved, what each pool's own jobs hold and
    ask for (for fair share), the starvation timers as the last cycle left them, and what a pool
    without a row inherits."""

    pools: dict[str, pool_rules.Pool]
    usage: Mapping[str, pool_rules.PoolUsage]
    starvation: Mapping[str, pool_rules.StarvationState]
    defaults: pool_rules.PoolDefaults


def expected_ends(holding: Iterable[Job], now: float) -> dict[str, float]:
    """When each allocation that declared a walltime is expected to give its room back: its start
    (now, for one reserved and not started) plus its walltime."""
    return {
        job.id: (job.started_at if job.started_at is not None else now) + job.spec.walltime_s
        for job in holding
        if job.spec.walltime_s is not None
    }


def snapshot_of(
    reading: CycleReading,
    now: float,
    pools: PoolsReading,
    pending_in_pools: Callable[[Sequence[str]], Iterable[Job]],
    last_preemptive: Mapping[str, float],
    fair_share: bool = True,
) -> Snapshot:
    """Step 1 (module docstring). ``fair_share`` False: fair share is not planned (the simulator's
    baselines without preemption; the pools still feed admission's borrowing rule).
    ``pending_in_pools`` reads the pending single jobs of the starving pools' subtrees, in queue
    order, at most ``PREEMPTOR_CANDIDATES``: they may preempt for fair share whatever the lowest
    running class. The new starvation timers are the snapshot's ``fair.starvation``: the caller
    keeps them for the next cycle."""
    resolved = pool_rules.with_job_pools(pools.pools, pools.usage, pools.defaults)
    fair: fairshare.FairShareState | None = None
    preemptors = reading.preemptors
    if fair_share:
        total = fairshare.cluster_of(reading.workers)
        fair = fairshare.cycle_state(resolved, pools.usage, total, pools.starvation, now)
        starving = fair.starving_pools()
        if starving:
            known = {job.id for job in preemptors}
            preemptors += tuple(job for job in pending_in_pools(starving) if job.id not in known)
    preemptors += sensitive_preemptors(resolved, reading.holding, preemptors, pending_in_pools)
    return Snapshot(
        now=now,
        workers=reading.workers,
        allocations=reading.allocations,
        gangs=tuple(Gang(gang_id, tasks) for gang_id, tasks in reading.gangs),
        pending=preemptors,
        expected_ends=expected_ends(reading.holding, now),
        holding=reading.holding,
        pools=resolved,
        last_preemptive=last_preemptive,
        fair=fair,
    )


def sensitive_preemptors(
    pools: Mapping[str, pool_rules.Pool],
    holding: Iterable[Job],
    known: Iterable[Job],
    pending_in_pools: Callable[[Sequence[str]], Iterable[Job]],
) -> tuple[Job, ...]:
    """The pending single jobs of the ``sensitive`` pools not yet among ``known``: they preempt as
    class 10 whatever class they declare (``preemption.rules.preempting_class``), so the store's
    read of the preemptors by class may have left them out. Read only while something runs."""
    roots = [
        path
        for path, pool in pools.items()
        if pool.kind == pool_rules.PoolKind.SENSITIVE
        and not any(
            pools[parent].kind == pool_rules.PoolKind.SENSITIVE
            for parent in pool_rules.ancestors(path)
            if parent in pools
        )
    ]
    if not roots or not any(job.status == Status.RUNNING for job in holding):
        return ()
    seen = {job.id for job in known}
    return tuple(job for job in pending_in_pools(roots) if job.id not in seen)


class CycleEffects(Protocol):
    """How a cycle's decisions change the state: one method per kind of decision. Each applies its
    decision whole or not at all and says whether it did (a decision made on a snapshot that has
    since moved on changes nothing; the next cycle decides again)."""

    def roll_back_gang(self, rollback: Rollback) -> bool: ...

    def reserve_gang(self, reservation: Reservation) -> bool: ...

    def roll_back_single(self, job_id: str, epoch: int | None = None) -> bool:
        """A preemptor's stale reservation back to pending, unless it was reserved again since
        under another ``reservation_epoch`` than ``epoch`` (None: not compared)."""
        ...

    def preempt(self, preemption: Preemption) -> bool: ...

    def note_singles_waiting(self, notes: Sequence[tuple[str, Reason]]) -> None:
        """Why each pending single job a preemption could not make room for waits."""
        ...

    def replace_holds(self, holds: Sequence[Hold]) -> None:
        """The capacity held for waiting gangs, in place of the last cycle's."""
        ...

    def note_gangs_waiting(self, waiting: Sequence[Waiting]) -> None:
        """Why each gang not placed this cycle waits."""
        ...


@dataclass(frozen=True, slots=True)
class CycleApplied:
    """What applying a cycle did: whether any decision changed the state, whether it reserved any
    room (claims may now find work), and the per-worker preemption backoff afterwards."""

    changed: bool
    reserved: bool
    last_preemptive: dict[str, float]


def apply_cycle(
    decisions: AdmissionDecisions,
    effects: CycleEffects,
    now: float,
    last_preemptive: Mapping[str, float],
    backoff_s: float,
) -> CycleApplied:
    """Step 3: the one apply order.

    1. stale gang reservations rolled back (their room is free for what follows);
    2. gangs reserved;
    3. stale single reservations (a preemptor's) rolled back;
    4. preemptions started, each worker placed on starting its backoff;
    5. why the single jobs wait, the holds for waiting gangs, why the gangs wait.
    Backoffs older than ``backoff_s`` are dropped."""
    changed = reserved = False
    for rollback in decisions.rollbacks:
        changed |= effects.roll_back_gang(rollback)
    for reservation in decisions.reservations:
        done = effects.reserve_gang(reservation)
        changed |= done
        reserved |= done
    epochs = decisions.single_rollback_epochs
    for index, job_id in enumerate(decisions.single_rollbacks):
        changed |= effects.roll_back_single(job_id, epochs[index] if index < len(epochs) else None)
    backoff = dict(last_preemptive)
    for preemption in decisions.preemptions:
        if effects.preempt(preemption):
            changed = reserved = True
            for worker_id in preemption.worker_ids:
                backoff[worker_id] = now
    cutoff = now - backoff_s
    backoff = {worker_id: at for worker_id, at in backoff.items() if at > cutoff}
    effects.note_singles_waiting(decisions.single_waiting)
    effects.replace_holds(decisions.holds)
    effects.note_gangs_waiting(decisions.waiting)
    return CycleApplied(changed, reserved, backoff)
