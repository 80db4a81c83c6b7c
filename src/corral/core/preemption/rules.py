"""The planner's rules that depend on no search state (seed 003, DESIGN.md "Preemption: corral's
choices"): what stopping a victim costs (``cost``), the one victim comparator (``victim_key``), the
order preemptors are served in (``preemptor_key``), and what a preemptor may take beyond lower
classes (``Trigger``). Which work is never a victim is ``corral.core.protection``'s rule."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from corral.core.preemption.inputs import Preemptor
from corral.core.protection import HIGH_CLASS, NEVER_PREEMPTED_CLASS
from corral.domain.records import Job

__all__ = [
    "BORROWED_DISCOUNT",
    "DEFAULT_CHECKPOINT_S",
    "HIGH_CLASS",
    "LATE_FRACTION",
    "LATE_PENALTY",
    "NEVER_PREEMPTED_CLASS",
    "PLANNER_CODES",
    "SEARCH_LIMIT",
    "Trigger",
    "VictimKey",
    "as_preemptor",
    "borrowed_discount",
    "cost",
    "preempting_class",
    "preemptor_key",
    "value",
    "victim_key",
    "worth_preempting",
]

#: the reasons the plan gives a waiting preemptor (``Planner.no_set``, ``borrowing.refusal``,
#: ``pool_limits.refusal``)
PLANNER_CODES = frozenset(
    {"no_victim_set", "preemption_backoff", "borrowing_refused", "pool_limit", "search_limited"}
)
#: worker victim sets one preemptor looks at, at most: the search is greedy (cheapest sets first)
#: and bounded, so a cycle's time does not grow with the cluster for work that cannot be placed
SEARCH_LIMIT = 64
#: expected checkpoint time of a job that has not checkpointed under corral yet, by mode
DEFAULT_CHECKPOINT_S = {"auto": 300.0, "manual": 600.0}
#: once this fraction of a declared walltime is used, stopping the job gets steeply dearer
LATE_FRACTION = 0.9
#: the penalty's steepness: at 100% of the walltime the job costs this many walltimes more
LATE_PENALTY = 10.0


def cost(job: Job, now: float) -> float:
    """GPU-seconds lost by stopping ``job`` now: for a job that checkpoints, its GPUs times its
    expected checkpoint time (the median of its past checkpoint phases, else the mode's default);
    otherwise its GPUs times the time since its last checkpoint (or its start); plus a penalty that
    grows steeply once ``LATE_FRACTION`` of a declared walltime is used."""
    gpus = job.spec.resources.gpus
    started = job.started_at if job.started_at is not None else now
    if job.spec.checkpoint_mode in DEFAULT_CHECKPOINT_S:
        past = job.checkpoint_durations
        lost = statistics.median(past) if past else DEFAULT_CHECKPOINT_S[job.spec.checkpoint_mode]
    else:
        since = max(started, job.last_checkpoint_at if job.last_checkpoint_at is not None else started)
        lost = max(0.0, now - since)
    total = gpus * lost
    walltime = job.spec.walltime_s
    if walltime:
        used = (now - started) / walltime
        if used > LATE_FRACTION:
            total += gpus * walltime * LATE_PENALTY * (used - LATE_FRACTION) / (1 - LATE_FRACTION)
    return total


#: what a victim running beyond its pool's guarantee costs, as a fraction of its cost (seed 003's
#: burst factor: burst allocations above their share are the first preemption candidates)
BORROWED_DISCOUNT = 0.5


def borrowed_discount(victim_cost: float, bursting: bool) -> float:
    """A victim's cost with seed 003's borrowed-capacity discount: ``BORROWED_DISCOUNT`` times its
    cost when it runs on capacity its pool borrows beyond a guarantee it has (``bursting``), so
    such work goes first among equals; its cost otherwise. A pool without a guarantee has no
    share to burst beyond: its work is not discounted."""
    return victim_cost * BORROWED_DISCOUNT if bursting else victim_cost


def preempting_class(job: Job, pool_kind: str | None) -> int:
    """The class ``job`` preempts as: seed 003's "sensitive claims are class 10", so the work of
    a ``sensitive`` pool preempts as class 10 whatever class it declares (it may take any class
    below 10); any other job as its own class."""
    return NEVER_PREEMPTED_CLASS if pool_kind == "sensitive" else job.spec.preemption_class


def as_preemptor(job: Job, pool_kind: str | None) -> Job:
    """``job`` as the planner reads it when it waits (``preempting_class``): the same record, its
    class raised to 10 in a sensitive pool. Only the plan reads the copy; what is applied names
    the job by id."""
    raised = preempting_class(job, pool_kind)
    if raised == job.spec.preemption_class:
        return job
    return replace(job, spec=replace(job.spec, preemption_class=raised))


def value(preemptor: Preemptor) -> float | None:
    """Seed 003's "estimated value" of a waiting job, in the victims' unit (GPU-seconds): the GPUs
    of all its tasks times its ``walltime_s``, the work it would do within its limit. None when
    it is not known (no walltime) or not in that unit (no GPU): no cap then."""
    spec = preemptor.first.spec
    gpus = spec.resources.gpus * len(preemptor.tasks)
    if not spec.walltime_s or gpus <= 0:
        return None
    return gpus * spec.walltime_s


def worth_preempting(victims_cost: float, preemptor_value: float | None) -> bool:
    """Seed 003's multi-victim constraint: the total cost of the victims taken for priority or fair
    share must be below the waiting job's value (``value``; None: not known, no cap). Reclaimed
    victims are not counted: a pool takes back its guarantee whatever it costs the borrower."""
    return preemptor_value is None or victims_cost < preemptor_value


class Ranked(Protocol):
    """What the victim comparator reads of a unit (``corral.core.preemption.units.Unit``)."""

    @property
    def key(self) -> str: ...
    @property
    def preemption_class(self) -> int: ...
    @property
    def cost(self) -> float: ...
    @property
    def started_at(self) -> float: ...


VictimKey = tuple[int, float, float, str]


def victim_key(unit: Ranked) -> VictimKey:
    """The one victim comparator: class ascending, cost ascending, newest first, id."""
    return (unit.preemption_class, unit.cost, -unit.started_at, unit.key)


def preemptor_key(
    preemptor: Preemptor, user_usage: Mapping[tuple[str, str | None], int] | None = None
) -> tuple[int, int, int, int, float, str]:
    """The order preemptors are served in: class, then priority, highest first; front-of-queue
    re-queues first; then, in a pool of mode ``fair_share``, the user holding the fewest GPUs in
    that pool first (``user_usage``: GPUs held by pool and user; a ``fifo`` pool leaves it out);
    then submission time and id."""
    first = preemptor.first
    usage = 0
    if user_usage is not None:
        usage = user_usage.get((first.spec.pool, first.spec.user), 0)
    return (
        -first.spec.preemption_class,
        -first.spec.priority,
        0 if first.queue_front else 1,
        usage,
        first.submitted_at,
        preemptor.key,
    )


@dataclass(frozen=True, slots=True)
class Trigger:
    """What a preemptor may take beyond lower classes: borrowed capacity (``reclaiming``: its pool
    is below its guarantee), and a fair share (``beneficiary``: the starving pool it preempts for,
    ``aggressive`` in the aggressive stage)."""

    reclaiming: bool = False
    beneficiary: str | None = None
    aggressive: bool = False

    def __bool__(self) -> bool:
        """It may take within its own class."""
        return self.reclaiming or self.beneficiary is not None
