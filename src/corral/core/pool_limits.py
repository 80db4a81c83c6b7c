"""Pool limits (API.md "Time limits and reservations"): a pool's ``limits`` cap what its whole
subtree holds at once, not only its fair share.

What a subtree holds is what its jobs hold: reserved, running and preempting jobs (a victim being
stopped still holds its GPUs until it has left), each task's GPUs, memory and CPUs summed. A job,
gang or preemptor of pool ``a/b`` may start only while ``a/b`` and every ancestor with limits
stays within them with its request added (``Limits.exceeded``); else it waits with reason
``pool_limit``. A limit on ``vram_mb`` is per GPU (VRAM is never summed): a job asking more VRAM
per GPU than its pool's limit is past it.

The claim (``corral.core.claim``), the gang admission (``corral.core.admission``) and the
preemption planner (``corral.core.preemption``) apply it, each on its own reading of the usage:
the claim's store transaction reads what each pool holds once per choice, the admission cycle and
the planner count the snapshot's holding jobs and book their own placements (``Limits.take``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from corral.domain.pools import ancestors
from corral.domain.records import Job, Reason
from corral.domain.resources import Resources
from corral.domain.status import HOLDING

__all__ = ["Limits", "explain", "limits_of", "own_held", "refusal"]


def limits_of(pools: Mapping[str, object]) -> dict[str, Resources]:
    """The limits of the pools that set some (``corral.domain.pools.Pool.limits``), by path."""
    found: dict[str, Resources] = {}
    for path, pool in pools.items():
        limits = getattr(pool, "limits", None)
        if isinstance(limits, Resources):
            found[path] = limits
    return found


def own_held(holding: Iterable[Job]) -> dict[str, Resources]:
    """What each pool's own jobs hold (GPUs, memory, CPUs: VRAM per GPU is never summed)."""
    held: dict[str, Resources] = {}
    for job in holding:
        if job.status in HOLDING:
            request = job.spec.resources
            held[job.spec.pool] = held.get(job.spec.pool, Resources()) + Resources(
                request.gpus, 0, request.memory_mb, request.cpus
            )
    return held


@dataclass(slots=True)
class Limits:
    """The limited pools and what each one's subtree holds, moved by ``take`` as a cycle places."""

    limits: Mapping[str, Resources]
    #: per limited pool: what its subtree holds
    held: dict[str, Resources] = field(default_factory=dict)
    #: per job pool: the limited pools on its way to the root, root first (kept: asked per job)
    _above: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, limits: Mapping[str, Resources], own: Mapping[str, Resources]) -> Limits:
        """``own``: what each pool's own jobs hold (``own_held``, or the store's grouped read)."""
        result = cls(dict(limits))
        for pool, resources in own.items():
            result.take(pool, resources)
        return result

    def above(self, pool: str) -> tuple[str, ...]:
        """The pools whose limits a job of ``pool`` counts against: itself and its ancestors with
        limits, root first."""
        found = self._above.get(pool)
        if found is None:
            found = tuple(path for path in [*ancestors(pool), pool] if path in self.limits)
            self._above[pool] = found
        return found

    def exceeded(self, pool: str, request: Resources) -> str | None:
        """The first pool (root first) that ``request`` more of ``pool``'s work would take past its
        limits; None when every one stays within them."""
        for path in self.above(pool):
            after = self.held.get(path, Resources()) + request
            if not self.limits[path].covers(after):
                return path
        return None

    def take(self, pool: str, request: Resources) -> None:
        """Book ``request`` of ``pool``'s work (a placement made since the usage was read)."""
        counted = Resources(request.gpus, 0, request.memory_mb, request.cpus)
        for path in self.above(pool):
            self.held[path] = self.held.get(path, Resources()) + counted

    def refusal(self, pool: str, request: Resources) -> Reason | None:
        """Why ``request`` more of ``pool``'s work may not start now (``refusal``), or None."""
        path = self.exceeded(pool, request)
        if path is None:
            return None
        return refusal(path, self.held.get(path, Resources()), self.limits[path], request)


def refusal(path: str, held: Resources, limit: Resources, request: Resources) -> Reason:
    """The ``pool_limit`` reason: the pool, what its subtree runs and its limit, in the first
    resource the request would take past it."""
    names = (("gpus", "GPUs"), ("memory_mb", "MB of memory"), ("cpus", "CPUs"))
    for name, unit in names:
        if getattr(held, name) + getattr(request, name) > getattr(limit, name):
            runs, cap, asked = getattr(held, name), getattr(limit, name), getattr(request, name)
            return Reason(
                "pool_limit",
                f"pool {path} runs {runs} of its limit {cap} {unit}; this work asks {asked} more:"
                " it waits until the pool's running work ends or its limits are raised",
            )
    return Reason(
        "pool_limit",
        f"pool {path} limits VRAM to {limit.vram_mb} MB per GPU; this work asks {request.vram_mb} MB:"
        " it waits until the pool's limits are raised",
    )


def explain(job: Job, size: int, pools: Mapping[str, object], own: Mapping[str, Resources]) -> Reason | None:
    """``why``'s ``pool_limit`` reason for a waiting job (``size``: its gang's tasks, 1 for a
    single job), or None when its pools' limits let it start. ``own``: what each pool's own jobs
    hold."""
    limits = limits_of(pools)
    if not limits:
        return None
    request = job.spec.resources
    total = Resources(request.gpus * size, request.vram_mb, request.memory_mb * size, request.cpus * size)
    return Limits.of(limits, own).refusal(job.spec.pool, total)
