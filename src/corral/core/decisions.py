"""The output of a scheduling cycle: values the loop applies through the store."""

from __future__ import annotations

from dataclasses import dataclass

from corral.domain.records import Hold, Reason

__all__ = [
    "AdmissionDecisions",
    "Hold",
    "Preemption",
    "Reservation",
    "Rollback",
    "TaskPlacement",
    "Victim",
    "Waiting",
]


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
    #: the ``reservation_epoch`` of each of ``job_ids`` as the cycle read it: the rollback undoes
    #: that reservation only, not one made since (``drain.reserved_under``); empty: not compared
    epochs: tuple[int, ...] = ()

    def epoch_of(self) -> dict[str, int]:
        """The epochs by job id (``drain.stale_reservation``'s ``epochs``)."""
        return dict(zip(self.job_ids, self.epochs, strict=False))


@dataclass(frozen=True, slots=True)
class Waiting:
    """A gang (or a single job a preemption could not make room for) that was not placed this
    cycle, and why (for ``corral why`` and the dashboard)."""

    gang_id: str
    reason: Reason


@dataclass(frozen=True, slots=True)
class Victim:
    """One unit to stop: a single job (``key`` its id) or a whole gang (``key`` its gang id), the
    jobs it stops (its running and reserved tasks), its class, its cost, and the trigger."""

    key: str
    job_ids: tuple[str, ...]
    preemption_class: int
    cost: float
    reason: str  # "priority", "reclaim", "fair_share" or "pool_limit"


@dataclass(frozen=True, slots=True)
class Preemption:
    """Stop ``victims`` so that ``preemptor`` runs on ``placements`` (one per task): the preemption
    planner's decision (``corral.core.preemption``). With no ``job_ids`` (and no placements), a
    pool over its limits (``preemptor`` ``pool:<path>``) is brought back under them: the victims
    stop, nothing is reserved (``corral.core.preemption.limits``)."""

    preemptor: str
    job_ids: tuple[str, ...]
    placements: tuple[TaskPlacement, ...]
    victims: tuple[Victim, ...]
    #: the victims' workers: each had its one preemptive placement of the backoff
    worker_ids: tuple[str, ...]
    #: P's reservation does not expire before this: the victims have left by then
    victims_deadline: float


@dataclass(frozen=True, slots=True)
class AdmissionDecisions:
    rollbacks: tuple[Rollback, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    holds: tuple[Hold, ...] = ()
    #: gangs (by gang id) and single jobs (by job id) not placed this cycle, and why
    waiting: tuple[Waiting, ...] = ()
    #: the preemption planner's decisions
    preemptions: tuple[Preemption, ...] = ()
    #: single jobs whose reservation (a preemptor's) went stale: back to pending
    single_rollbacks: tuple[str, ...] = ()
    #: the ``reservation_epoch`` of each of ``single_rollbacks`` as the cycle read it (empty: not
    #: compared): a job reserved again since is not rolled back (``drain.reserved_under``)
    single_rollback_epochs: tuple[int, ...] = ()
    #: pending single jobs a preemption could not make room for, and why (job id, reason)
    single_waiting: tuple[tuple[str, Reason], ...] = ()
