"""Work no preemption could take back is not placed on borrowed capacity (seed 003).

A job is *unreclaimable* when the preemption planner may never stop it for another
(``corral.core.protection.unreclaimable``: the protection rules that do not depend on time).
Capacity is *borrowed* when a pool runs beyond its guarantee: another pool's guarantee is then what
a reclaim would take back, and an unreclaimable job there would hold it for good.

The rule (``may_place``): an unreclaimable job starts only while its own pool stays within its
guarantee, or while the GPUs left free after it still cover every other pool's unused guarantee.
Without guarantees configured nothing is borrowed and nothing is refused. Guarantees count GPUs, per
pool path (a parent's guarantee does not yet cover its children's jobs: hierarchical fair share
does that). The admission cycle applies it to gangs and to the planner's preemptors; the claim to
single jobs, through its ``ClaimPlacement`` policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from corral.domain.records import Job, Reason
from corral.domain.status import HOLDING

__all__ = ["Guarantees", "may_place", "refusal"]


@dataclass(slots=True)
class Guarantees:
    """The cluster as the rule needs it: GPUs free on usable workers, GPUs held per pool, and each
    pool's guaranteed GPUs (only pools with a guarantee)."""

    free_gpus: int
    guaranteed: Mapping[str, int]
    held: dict[str, int] = field(default_factory=dict)
    #: the guaranteed GPUs their pools' jobs do not hold, summed over the pools (kept by ``take``):
    #: ``may_place`` costs the same whatever the number of pools
    unused: int = field(init=False)

    def __post_init__(self) -> None:
        self.unused = sum(self.unused_of(path) for path in self.guaranteed)

    def unused_of(self, pool: str) -> int:
        return max(0, self.guaranteed.get(pool, 0) - self.held.get(pool, 0))

    @classmethod
    def of(cls, free_gpus: int, guaranteed: Mapping[str, int], holding: Iterable[Job]) -> Guarantees:
        held: dict[str, int] = {}
        for job in holding:
            if job.status in HOLDING:
                held[job.spec.pool] = held.get(job.spec.pool, 0) + job.spec.resources.gpus
        return cls(free_gpus, {path: gpus for path, gpus in guaranteed.items() if gpus > 0}, held)

    def take(self, pool: str, gpus: int) -> None:
        """Book a placement made since (the rest of a cycle sees it)."""
        before = self.unused_of(pool)
        self.held[pool] = self.held.get(pool, 0) + gpus
        self.free_gpus -= gpus
        self.unused += self.unused_of(pool) - before


def may_place(job: Job, gpus: int, guarantees: Guarantees) -> bool:
    """Whether an unreclaimable job asking ``gpus`` GPUs in all may start now (module docstring)."""
    if not guarantees.guaranteed or gpus == 0:
        return True
    pool = job.spec.pool
    own = guarantees.guaranteed.get(pool, 0)
    if guarantees.held.get(pool, 0) + gpus <= own:
        return True
    others_unused = guarantees.unused - guarantees.unused_of(pool)
    return guarantees.free_gpus - gpus >= others_unused


REFUSED = "borrowing_refused"
"""The reason code of ``refusal``."""


def refusal(job: Job, gpus: int) -> Reason:
    return Reason(
        REFUSED,
        f"it cannot be preempted (class {job.spec.preemption_class}, checkpoint"
        f" {job.spec.checkpoint_mode}) and its {gpus} GPU(s) would be borrowed: beyond its pool's"
        " guarantee, on capacity other pools are guaranteed and not using; it waits until its pool"
        " is within its guarantee or the cluster has room beyond the others' guarantees",
    )
