"""What the preemption planner keeps from one plan for the next (``PlanInputs.memo``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from corral.core.placement import CapacityKept
from corral.core.preemption.unit import Unit
from corral.domain.records import Job

__all__ = ["PlannerMemo"]


@dataclass(slots=True)
class PlannerMemo:
    """``capacity``: each worker's free capacity at the start of a plan, counted from the jobs it
    runs (``capacity.capacity_at_start``). ``units``: the victim units of the last plan by key: a
    unit whose job records are the very same objects keeps what they alone decide
    (``units.build_units``). The decisions are the same without it."""

    capacity: CapacityKept[Job] = field(default_factory=CapacityKept)
    units: dict[str, Unit] = field(default_factory=dict)
