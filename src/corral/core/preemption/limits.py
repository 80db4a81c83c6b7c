"""Seed 002's third preemption trigger: a pool, or one of its parents, over its ``limits``.

Limits are enforced where work starts (``corral.core.pool_limits``), so a pool goes over them only
when they are lowered below what its subtree runs. Then the pool is preempted back under them, one
cycle at a time, with no preemptor (``over_limits``):

- what a limited pool's subtree holds is counted as ``pool_limits`` counts it, but without the
  jobs already being stopped (they are leaving: counting them would stop more every cycle until
  they have left), and with this cycle's reservations;
- the pools over their limits (GPUs, memory or CPUs summed over the subtree; a per-GPU VRAM limit
  lowered below what a running job uses stops nothing: the job is past it only for a new start)
  are taken deepest first, then by path: a victim a deeper pool gives up counts for its ancestors
  too;
- a pool's victims are the plan's victim units inside its subtree (``units.build_units``: single
  jobs and whole gangs, every protection rule applied: class 10, a ``sensitive`` pool, class 7+
  without checkpoints, near its enforced deadline), never a ``service`` pool's allocation on its
  own (guaranteed) capacity (``Triggers.reason``'s rule), nor one taken for another preemption
  this cycle; in the one victim order (``rules.victim_key``: class, cost, newest first), taken
  until what they hold covers the excess in every resource, then put back in reverse order where
  the rest still covers it (minimal); protected work stays, and the pool stays over its limits by
  what it holds;
- at most ``budget`` victims in all (the cycle's ``max_preemptions_per_cycle`` left): a large
  excess is stopped over a few cycles.

Each pool's victims are one ``Preemption`` with no preemptor (``job_ids`` and ``placements``
empty; ``preemptor`` names the pool as ``pool:<path>``, which the victims carry as
``preempted_for``), reason ``pool_limit``: applied by ``start_preemption`` like any other, the
victims checkpoint (when they do), stop and go back to the queue, where their pool's limits keep
them until it has room.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.core import pool_limits
from corral.core.decisions import Preemption, Victim
from corral.core.preemption.inputs import PlanInputs, pool_kind
from corral.core.preemption.rules import victim_key
from corral.core.preemption.unit import Unit
from corral.domain import pools as pool_rules
from corral.domain.resources import ZERO, Resources
from corral.domain.status import Status

__all__ = [
    "LIMIT_PREEMPTOR_PREFIX",
    "excess",
    "limit_holdings",
    "limited_pool",
    "over_limit_pools",
    "over_limits",
]

#: how a limits preemption names what its victims are stopped for: ``pool:<path>``
LIMIT_PREEMPTOR_PREFIX = "pool:"


def limit_holdings(inputs: PlanInputs) -> pool_limits.Limits:
    """The limited pools and what each one's subtree holds and will go on holding: the reserved
    and running jobs (not those being stopped) and this cycle's reservations."""
    limits = pool_limits.limits_of(inputs.pools)
    if not limits:
        return pool_limits.Limits(limits)
    staying = [job for job in inputs.holding if job.status != Status.PREEMPTING]
    books = pool_limits.Limits.of(limits, pool_limits.own_held(staying))
    for allocation in inputs.extra:
        books.take(inputs.extra_pools.get(allocation.job_id, ""), allocation.resources)
    return books


def excess(held: Resources, limit: Resources) -> Resources | None:
    """What ``held`` runs past ``limit`` in GPUs, memory and CPUs (each at least 0), or None when it
    is within them all. VRAM is a per-GPU limit, never summed: it is not counted here."""
    over = Resources(
        max(0, held.gpus - limit.gpus),
        0,
        max(0, held.memory_mb - limit.memory_mb),
        max(0, held.cpus - limit.cpus),
    )
    return None if over == ZERO else over


def over_limit_pools(books: pool_limits.Limits) -> list[str]:
    """The limited pools whose subtree runs past their limits, deepest first, then by path."""
    over = [path for path, limit in books.limits.items() if excess(books.held.get(path, ZERO), limit)]
    return sorted(over, key=lambda path: (-path.count("/"), path))


def over_limits(
    inputs: PlanInputs, units: Sequence[Unit], taken: set[str], budget: int
) -> tuple[Preemption, ...]:
    """The limits preemptions of one cycle (module docstring): per pool over its limits, the
    minimal set of its subtree's victim units, in victim order, that brings it back within them.
    ``units``: the plan's victim units; ``taken``: the keys of units already taken this cycle (the
    ones chosen here are added); ``budget``: the most victims in all."""
    books = limit_holdings(inputs)
    if not books.limits or budget <= 0:
        return ()
    over = over_limit_pools(books)
    if not over:
        return ()
    held = dict(books.held)
    ordered = sorted(units, key=victim_key)
    found: list[Preemption] = []
    for path in over:
        limit = books.limits[path]
        missing = excess(held.get(path, ZERO), limit)
        if missing is None or budget <= 0:
            continue  # a deeper pool's victims brought it back already
        candidates = [unit for unit in ordered if _may_take(inputs, unit, path, taken)]
        chosen = _minimal(candidates, missing, budget)
        if not chosen:
            continue
        budget -= len(chosen)
        taken.update(unit.key for unit in chosen)
        for unit in chosen:
            freed = Resources(unit.held.gpus, 0, unit.held.memory_mb, unit.held.cpus)
            for above in books.above(unit.pool):
                held[above] = held.get(above, ZERO).minus(freed)
        found.append(_preemption(inputs, path, chosen))
    return tuple(found)


def _may_take(inputs: PlanInputs, unit: Unit, path: str, taken: set[str]) -> bool:
    """A victim unit of ``path``'s subtree not taken yet this cycle, and not a ``service`` pool's
    allocation on its own (guaranteed) capacity."""
    if unit.key in taken or not pool_rules.is_within(unit.pool, path):
        return False
    return unit.borrowed or pool_kind(inputs, unit.pool) != pool_rules.PoolKind.SERVICE


def _minimal(candidates: Sequence[Unit], missing: Resources, budget: int) -> list[Unit]:
    """Units in the order given until what they hold covers ``missing`` (or the candidates or the
    budget run out), then those put back, last first, that the rest covers without."""
    chosen: list[Unit] = []
    freed = ZERO
    for unit in candidates:
        if _covers(freed, missing) or len(chosen) >= budget:
            break
        chosen.append(unit)
        freed = freed + unit.held
    if not _covers(freed, missing):
        return chosen  # all that may be taken: protected work keeps the pool over its limits
    for unit in reversed(list(chosen)):
        rest = freed.minus(unit.held)
        if _covers(rest, missing):
            chosen.remove(unit)
            freed = rest
    return chosen


def _covers(freed: Resources, missing: Resources) -> bool:
    return freed.gpus >= missing.gpus and freed.memory_mb >= missing.memory_mb and freed.cpus >= missing.cpus


def _preemption(inputs: PlanInputs, path: str, chosen: Sequence[Unit]) -> Preemption:
    checkpointing = any(job.spec.checkpoint_mode != "none" for unit in chosen for job in unit.jobs)
    victims = tuple(
        Victim(unit.key, tuple(job.id for job in unit.jobs), unit.preemption_class, unit.cost, "pool_limit")
        for unit in chosen
    )
    return Preemption(
        preemptor=LIMIT_PREEMPTOR_PREFIX + path,
        job_ids=(),
        placements=(),
        victims=victims,
        worker_ids=(),
        victims_deadline=inputs.now + inputs.settings.victims_leave_within(checkpointing),
    )


def limited_pool(preemptor: str) -> str | None:
    """The pool a limits preemption was for (``pool:<path>``), or None for any other preemptor."""
    if preemptor.startswith(LIMIT_PREEMPTOR_PREFIX):
        return preemptor[len(LIMIT_PREEMPTOR_PREFIX) :]
    return None
