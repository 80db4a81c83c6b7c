"""Victim units (seed 003: a single job, or a whole gang, never sliced): which running work is a
candidate at all, what each unit frees and costs, its fair-share group, and which units a plan has
spent (taken by a preemption, or on a worker in its backoff)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from corral.core import fairshare
from corral.core.preemption.capacity import Free, plus
from corral.core.preemption.inputs import PlanInputs, pool_kind
from corral.core.preemption.rules import borrowed_discount, cost, victim_key
from corral.core.preemption.unit import Unit
from corral.core.protection import why_protected
from corral.core.snapshot import PoolView
from corral.domain.records import Job
from corral.domain.resources import ZERO, Resources
from corral.domain.status import Status

__all__ = ["Unit", "Units", "Victims", "build_units", "started"]


class Victims:
    """The plan's victim units by worker (in comparator order) and each worker's ``reach``: built
    from the inputs alone (and the free GPUs at the start of the plan), once per plan."""

    __slots__ = ("_allocations", "_by_pool", "_grouped", "reach", "units", "units_on")

    def __init__(
        self, inputs: PlanInputs, free: Mapping[str, Free], free_gpus_at_start: Mapping[str, int]
    ) -> None:
        units = self.units = sorted(build_units(inputs, free).values(), key=victim_key)
        #: the pools whose units have their fair-share group set, and every pool's allocations
        #: (``allocations_by_pool``), read on the first group asked
        self._grouped: set[str] = set()
        self._allocations: dict[str, dict[str, tuple[float, Resources]]] | None = None
        #: the units of each pool, listed on the first group asked (not one scan of every unit a pool)
        self._by_pool: dict[str, list[Unit]] | None = None
        self.units_on: dict[str, list[Unit]] = {}
        for unit in units:
            for worker_id in unit.frees:
                self.units_on.setdefault(worker_id, []).append(unit)
        most = inputs.settings.max_victims
        self.reach = {
            worker_id: free_gpus_at_start[worker_id]
            + sum(sorted((unit.frees[worker_id][0].gpus for unit in on), reverse=True)[:most])
            for worker_id, on in self.units_on.items()
        }

    def group_of(self, unit: Unit, inputs: PlanInputs) -> fairshare.Group:
        """``unit``'s fair-share group, its pool's units grouped on the first ask (only a
        fair-share victim's test reads a group, most often of a few pools: the prefix rule is
        each pool's own, so grouping one pool gives what grouping them all would)."""
        if unit.pool not in self._grouped:
            self._grouped.add(unit.pool)
            if self._allocations is None:
                self._allocations = allocations_by_pool(inputs)
            if self._by_pool is None:
                self._by_pool = {}
                for other in self.units:
                    self._by_pool.setdefault(other.pool, []).append(other)
            group_pool(unit.pool, self._by_pool[unit.pool], self._allocations, inputs)
        return unit.group


class Units:
    """The plan's victim units, built on first use (a plan whose preemptors all fit or wait without
    looking for a victim never builds them), and the ones it may no longer take: taken by an earlier
    preemption of the cycle (``used``), or on a worker in its backoff (``blocked``)."""

    def __init__(
        self, inputs: PlanInputs, free: Mapping[str, Free], free_gpus_at_start: Mapping[str, int]
    ) -> None:
        self.inputs = inputs
        self._free = free
        #: the GPUs free on each worker before the plan changed anything (``reach``)
        self._free_gpus_at_start = free_gpus_at_start
        self._victims: Victims | None = None
        self.used: set[str] = set()
        self.blocked: set[str] = set()
        #: workers that had their preemptive placement of the backoff: nothing on them is taken
        self.backoff: set[str] = set()

    def built(self) -> Victims:
        """The victim units, built from the inputs on first use. Nothing they are built from moves
        during the plan (the inputs, the free GPUs at its start), so building them late gives what
        building them first would; the workers blocked so far block their units from then on."""
        victims = self._victims
        if victims is None:
            victims = self._victims = Victims(self.inputs, self._free, self._free_gpus_at_start)
            for worker_id in self.backoff:
                self.blocked.update(unit.key for unit in victims.units_on.get(worker_id, ()))
        return victims

    @property
    def on(self) -> dict[str, list[Unit]]:
        """Every worker's victim units, in comparator order."""
        return self.built().units_on

    @property
    def reach(self) -> dict[str, int]:
        """Per worker with units, the GPUs free plus those of its ``max_victims`` largest units (at
        the start of the plan): no more can come free there in one preemption, whatever the
        preemptor's class."""
        return self.built().reach

    def group_of(self, unit: Unit) -> fairshare.Group:
        """``unit``'s fair-share group (``Victims.group_of``)."""
        return self.built().group_of(unit, self.inputs)

    def block(self, worker_id: str) -> None:
        """The worker had its preemptive placement of the backoff: nothing on it is taken again."""
        self.backoff.add(worker_id)
        if self._victims is not None:  # else ``built`` blocks them
            self.blocked.update(unit.key for unit in self._victims.units_on.get(worker_id, ()))

    def free_to_take(self, unit: Unit) -> bool:
        """Not taken by an earlier preemption, and on no worker in its backoff."""
        return unit.key not in self.used and unit.key not in self.blocked


def build_units(inputs: PlanInputs, free: Mapping[str, Free]) -> dict[str, Unit]:
    """The victim candidates: running single jobs and gangs with every task started or reserved and
    none being stopped, on usable workers, that nothing protects (``protection.why_protected``).
    With a ``memo``, the units of the last plan are reused where their job records are the same
    objects."""
    now, near = inputs.now, inputs.settings.near_completion_s
    gangs: dict[str, list[Job]] = {}
    borrowed = borrowed_jobs(inputs.holding, inputs.pools)
    units: dict[str, Unit] = {}
    # the units of the last plan (``memo``): a unit whose job records are the very same objects
    # keeps what they alone decide (its jobs, class, pool, what it frees and holds); a unit lives
    # for one plan at a time, so its other fields are set anew here
    kept: dict[str, Unit] = inputs.memo.units if inputs.memo is not None else {}
    for job in inputs.holding:
        if job.gang_id is not None:
            gangs.setdefault(job.gang_id, []).append(job)
            continue
        # a single job: the common case, kept cheap (a cycle may see tens of thousands)
        if job.status != Status.RUNNING or job.victims_deadline is not None or job.worker_id not in free:
            continue
        if why_protected(job, pool_kind(inputs, job.spec.pool), now, near):
            continue
        unit = kept.get(job.id)
        if unit is None or unit.jobs[0] is not job:
            unit = Unit(
                key=job.id,
                jobs=(job,),
                preemption_class=job.spec.preemption_class,
                cost=0.0,
                started_at=0.0,
                pool=job.spec.pool,
                frees={job.worker_id or "": (job.spec.resources, job.gpu_indices)},
                borrowed=False,
                held=job.spec.resources,
            )
        # what depends on the time and on the whole snapshot is set anew
        unit.borrowed = job.id in borrowed
        unit.cost = borrowed_discount(cost(job, now), unit.borrowed and _guaranteed(inputs, job.spec.pool))
        unit.started_at = job.started_at if job.started_at is not None else now
        unit.group = fairshare.Group.NON_PREEMPTIBLE
        units[job.id] = unit
    for key, jobs in gangs.items():
        gang = _gang_unit(inputs, key, jobs, free, kept.get(key))
        if gang is not None:
            gang.borrowed = any(job.id in borrowed for job in jobs)
            gang.cost = borrowed_discount(
                sum(cost(job, now) for job in jobs if job.status == Status.RUNNING),
                gang.borrowed and _guaranteed(inputs, gang.pool),
            )
            gang.started_at = max(job.started_at if job.started_at is not None else now for job in jobs)
            gang.group = fairshare.Group.NON_PREEMPTIBLE
            units[key] = gang
    if inputs.memo is not None:
        inputs.memo.units = units
    return units


def _gang_unit(
    inputs: PlanInputs, key: str, jobs: list[Job], free: Mapping[str, Free], kept: Unit | None
) -> Unit | None:
    """A gang's unit (``kept`` where its job records are the same objects), or None when the gang is
    no candidate: partly ended or waiting, being stopped, not started, off a usable worker, or
    protected."""
    first = jobs[0]
    if len(jobs) != first.spec.gang_size:
        return None  # a gang partly ended or partly waiting is not taken apart
    if any(job.status == Status.PREEMPTING or job.victims_deadline is not None for job in jobs):
        return None
    if not any(job.status == Status.RUNNING for job in jobs) or any(
        job.worker_id not in free for job in jobs
    ):
        return None
    now, near, exempt = inputs.now, inputs.settings.near_completion_s, inputs.settings.gang_exempt_s
    if any(why_protected(job, pool_kind(inputs, job.spec.pool), now, near, exempt) for job in jobs):
        return None
    if (
        kept is not None
        and len(kept.jobs) == len(jobs)
        and all(a is b for a, b in zip(kept.jobs, jobs, strict=True))
    ):
        return kept
    frees: dict[str, tuple[Resources, tuple[int, ...]]] = {}
    for job in jobs:
        worker_id = job.worker_id or ""
        resources, indices = frees.get(worker_id, (ZERO, ()))
        frees[worker_id] = (plus(resources, job.spec.resources), indices + job.gpu_indices)
    return Unit(
        key=key,
        jobs=tuple(jobs),
        preemption_class=first.spec.preemption_class,
        cost=0.0,
        started_at=0.0,
        pool=first.spec.pool,
        frees=frees,
        borrowed=False,
        held=sum((job.spec.resources for job in jobs), ZERO),
    )


def _guaranteed(inputs: PlanInputs, path: str) -> bool:
    """The pool has a guarantee (its work beyond it is discounted: ``rules.borrowed_discount``)."""
    pool = inputs.pools.get(path)
    return pool is not None and pool.guarantee.gpus > 0


def borrowed_jobs(holding: Sequence[Job], pools: Mapping[str, PoolView]) -> set[str]:
    """The jobs running on capacity their pool borrows: per pool, its allocations oldest first,
    the ones past its guaranteed GPUs (a pool without a guarantee borrows all it runs)."""
    by_pool: dict[str, list[Job]] = {}
    for job in holding:
        by_pool.setdefault(job.spec.pool, []).append(job)
    borrowed: set[str] = set()
    for path, jobs in by_pool.items():
        pool = pools.get(path)
        guarantee = pool.guarantee.gpus if pool is not None else 0
        used = 0
        for job in sorted(jobs, key=lambda job: (started(job, 0.0), job.id)):
            used += job.spec.resources.gpus
            if used > guarantee:
                borrowed.add(job.id)
    return borrowed


def allocations_by_pool(inputs: PlanInputs) -> dict[str, dict[str, tuple[float, Resources]]]:
    """Every allocation of each pool (units or not: one not preemptible still counts in the
    prefix), a gang as one allocation, by key: since when it holds (a gang: its latest task) and
    what it holds. Jobs being stopped are left out: what stays of the pool is what the prefix
    counts."""
    by_pool: dict[str, dict[str, tuple[float, Resources]]] = {}
    for job in inputs.holding:
        if job.status == Status.PREEMPTING:
            continue
        since = started(job, inputs.now)
        allocations = by_pool.setdefault(job.spec.pool, {})
        if job.gang_id is None:  # a single job: its own allocation
            allocations[job.id] = (since, job.spec.resources)
            continue
        earlier, held = allocations.get(job.gang_id, (since, ZERO))
        allocations[job.gang_id] = (max(earlier, since), held + job.spec.resources)
    return by_pool


def group_pool(
    pool: str,
    units: Sequence[Unit],
    allocations: Mapping[str, Mapping[str, tuple[float, Resources]]],
    inputs: PlanInputs,
) -> None:
    """The fair-share group of each of ``pool``'s units, from every allocation the pool holds."""
    assert inputs.fair is not None
    groups = fairshare.preemptible_units(
        ((key, pool, since, held) for key, (since, held) in allocations.get(pool, {}).items()),
        inputs.fair,
        inputs.settings.aggressive_satisfaction_threshold,
        inputs.settings.satisfaction_threshold,
    )
    for unit in units:
        unit.group = groups.get(unit.key, fairshare.Group.NON_PREEMPTIBLE)


def started(job: Job, otherwise: float) -> float:
    """When ``job`` started, else when it was reserved, else ``otherwise`` (0.0 is a time: the
    simulator's clock starts there)."""
    if job.started_at is not None:
        return job.started_at
    return job.reserved_at if job.reserved_at is not None else otherwise
