"""A victim unit (seed 003: a single job, or a whole gang, never sliced): what it frees, costs and
holds. Which running work becomes one is ``units.build_units``."""

from __future__ import annotations

from dataclasses import dataclass

from corral.core import fairshare
from corral.domain.records import Job
from corral.domain.resources import ZERO, Resources

__all__ = ["Unit"]


@dataclass(slots=True, eq=False)
class Unit:
    """Compared by identity: a unit is one running job or gang of one plan (its fields hold every
    job of it, far too much to compare field by field where the search asks ``unit in chosen``)."""

    key: str
    jobs: tuple[Job, ...]
    preemption_class: int
    cost: float
    started_at: float
    pool: str
    #: worker id -> what the unit frees there (resources, GPU indices)
    frees: dict[str, tuple[Resources, tuple[int, ...]]]
    borrowed: bool
    #: what its jobs hold, all together
    held: Resources = ZERO
    #: its group for fair share (``fairshare.preemptible_units``)
    group: fairshare.Group = fairshare.Group.NON_PREEMPTIBLE
