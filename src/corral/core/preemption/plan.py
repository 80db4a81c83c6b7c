"""The cycle's plan (seed 002's stages: preemptive, then aggressively preemptive): the preemptors
in order, each given a preemption, room set aside, or a reason to wait; work refused for borrowing
tried once more at the end."""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.decisions import Preemption, TaskPlacement
from corral.core.preemption.inputs import PlanInputs, Preemptor
from corral.core.preemption.limits import limit_holdings, over_limit_pools
from corral.core.preemption.planner import Planner
from corral.core.preemption.rules import NEVER_PREEMPTED_CLASS, preemptor_key
from corral.domain.records import Reason
from corral.domain.status import Status

__all__ = ["PreemptionPlan", "plan"]


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    preemptions: tuple[Preemption, ...] = ()
    #: preemptors for which no victim set exists this cycle, and why
    waiting: tuple[tuple[str, Reason], ...] = ()
    #: preemptors that fit without anyone stopping, and the free room the plan set aside for them
    #: (the claim or the next cycle places them; no lower preemptor counts on that room)
    fitting: tuple[tuple[str, tuple[TaskPlacement, ...]], ...] = ()
    #: the preemptors given room (by a preemption, or set aside), in the order the plan gave it
    order: tuple[str, ...] = ()


def plan(inputs: PlanInputs) -> PreemptionPlan:
    """The cycle's preemptions (``corral.core.preemption``): first the pools over their limits are
    preempted back under them (``limits.over_limits``, seed 002's third trigger, no preemptor),
    then the preemptors are served; at most ``max_preemptions_per_cycle`` in all (a limits
    preemption counts each of its victims); the preemptors past it are served by the next cycle."""
    over = bool(over_limit_pools(limit_holdings(inputs)))
    if not over and (not inputs.preemptors or _nothing_to_plan(inputs)):
        return PreemptionPlan()
    planner = Planner(inputs)
    budget = inputs.settings.max_preemptions_per_cycle
    enforced = planner.enforce_limits(budget) if over else ()
    budget -= sum(len(preemption.victims) for preemption in enforced)
    if not inputs.preemptors:
        return PreemptionPlan(enforced)
    preemptions: list[Preemption] = []
    waiting: list[tuple[str, Reason]] = []
    refused: list[Preemptor] = []
    user_usage = _user_usage(inputs)
    for preemptor in sorted(inputs.preemptors, key=lambda preemptor: preemptor_key(preemptor, user_usage)):
        if len(preemptions) >= budget:
            break
        found = planner.place(preemptor)
        if isinstance(found, Preemption):
            preemptions.append(found)
        elif isinstance(found, Reason) and found.code == "borrowing_refused":
            refused.append(preemptor)
        elif found is not None:
            waiting.append((preemptor.key, found))
    # Work refused for borrowing is tried once more: the placements since may have used the
    # guarantees it would have taken (the next cycle would place it anyway).
    for preemptor in refused:
        found = planner.place(preemptor) if len(preemptions) < budget else None
        if isinstance(found, Preemption):
            preemptions.append(found)
        elif found is not None:
            waiting.append((preemptor.key, found))
    if planner.books is not None:
        waiting = _aggressive_stage(planner, inputs, waiting, preemptions, budget)
    return PreemptionPlan(
        (*enforced, *preemptions), tuple(waiting), tuple(planner.fitting), tuple(planner.order)
    )


def _aggressive_stage(
    planner: Planner,
    inputs: PlanInputs,
    waiting: list[tuple[str, Reason]],
    preemptions: list[Preemption],
    budget: int,
) -> list[tuple[str, Reason]]:
    """Seed 002's last stage: the work of aggressively starving pools still waiting may also take
    aggressively preemptible allocations. Returns what still waits."""
    books = planner.books
    assert books is not None
    by_key = {preemptor.key: preemptor for preemptor in inputs.preemptors}
    still: list[tuple[str, Reason]] = []
    for key, reason in waiting:
        preemptor = by_key[key]
        found: Preemption | Reason | None = None
        if len(preemptions) < budget and books.beneficiary(preemptor.first.spec.pool, aggressive=True):
            found = planner.place(preemptor, aggressive=True)
        if isinstance(found, Preemption):
            preemptions.append(found)
        else:
            still.append((key, reason))
    return still


def _nothing_to_plan(inputs: PlanInputs) -> bool:
    """No preemptor is above the lowest running class, no pool has a guarantee (no reclaim, no
    borrowing rule) and no victim is stopping (no room coming free): the planner could only say
    nothing, so a cycle skips building it (a simulator runs thousands of such cycles)."""
    if any(pool.guarantee.gpus > 0 for pool in inputs.pools.values()):
        return False
    if inputs.fair is not None and inputs.fair.anyone_starving():
        return False
    lowest = NEVER_PREEMPTED_CLASS
    for job in inputs.holding:
        if job.status == Status.PREEMPTING and job.preempted_for is not None:
            return False
        if job.status == Status.RUNNING:
            lowest = min(lowest, job.spec.preemption_class)
    return all(preemptor.first.spec.preemption_class <= lowest for preemptor in inputs.preemptors)


def _user_usage(inputs: PlanInputs) -> dict[tuple[str, str | None], int]:
    """GPUs held per pool and user, for the pools of mode ``fair_share`` (pools mode #6 of issue 9:
    the least-served user of such a pool goes first)."""
    held: dict[tuple[str, str | None], int] = {}
    for job in inputs.holding:
        pool = inputs.pools.get(job.spec.pool)
        if pool is not None and pool.mode != "fair_share":
            continue
        key = (job.spec.pool, job.spec.user)
        held[key] = held.get(key, 0) + job.spec.resources.gpus
    return held
