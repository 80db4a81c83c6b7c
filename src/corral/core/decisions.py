"""The output of a scheduling cycle: values the loop applies through the store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from corral.domain.records import Hold, Reason

if TYPE_CHECKING:  # the planner imports this module for TaskPlacement
    from corral.core.preemption import Preemption

__all__ = ["AdmissionDecisions", "Hold", "Reservation", "Rollback", "TaskPlacement", "Waiting"]


@dataclass(frozen=True, slots=True)
class TaskPlacement:
    job_id: str
    worker_id: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Reservation:
    """Reserve every task of a gang at once: placements in ``gang_index`` order."""

    gang_id: str
    placements: tuple[TaskPlacement, ...]


@dataclass(frozen=True, slots=True)
class Rollback:
    """Return a gang's reserved tasks to ``blocked``: a reservation went unclaimed too long."""

    gang_id: str
    job_ids: tuple[str, ...]
    reason: Reason


@dataclass(frozen=True, slots=True)
class Waiting:
    """A gang (or a single job a preemption could not make room for) that was not placed this
    cycle, and why (for ``corral why`` and the dashboard)."""

    gang_id: str
    reason: Reason


@dataclass(frozen=True, slots=True)
class AdmissionDecisions:
    rollbacks: tuple[Rollback, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    holds: tuple[Hold, ...] = ()
    #: gangs (by gang id) and single jobs (by job id) not placed this cycle, and why
    waiting: tuple[Waiting, ...] = ()
    #: the preemption planner's decisions (``corral.core.preemption.Preemption``)
    preemptions: tuple[Preemption, ...] = ()
    #: single jobs whose reservation (a preemptor's) went stale: back to pending
    single_rollbacks: tuple[str, ...] = ()
    #: pending single jobs a preemption could not make room for, and why (job id, reason)
    single_waiting: tuple[tuple[str, Reason], ...] = ()
