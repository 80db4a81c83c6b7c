"""Why a unit may be taken for a preemptor (seeds 002 and 003): ``priority`` (a lower class),
``reclaim`` (the preemptor's pool is below its guarantee and the unit runs on capacity its own pool
borrows) or ``fair_share`` (the preemptor's pool is starving and the unit's pool may give up the
allocation); and whether work no preemption could take back may be placed on borrowed capacity.
The pools' books (guarantees and fair-share usage) move as the plan places and preempts."""

from __future__ import annotations

from collections.abc import Sequence

from corral.core import borrowing, fairshare
from corral.core.decisions import TaskPlacement
from corral.core.preemption.inputs import PlanInputs, Preemptor, pool_kind
from corral.core.preemption.rules import Trigger
from corral.core.preemption.units import Unit, Units
from corral.core.protection import unreclaimable
from corral.domain.records import Job, Reason
from corral.domain.resources import Resources
from corral.domain.status import Status

__all__ = ["Triggers"]


class Triggers:
    """The pools' side of a plan: the guarantees (``borrowing.Guarantees``) and, while a pool is
    starving, fair share's books (``fairshare.Books``), and the rules that read them."""

    def __init__(self, inputs: PlanInputs, free_gpus: int, units: Units) -> None:
        self.inputs = inputs
        self.settings = inputs.settings
        self.units = units
        guaranteed = {path: pool.guarantee.gpus for path, pool in inputs.pools.items()}
        self.guarantees = borrowing.Guarantees.of(free_gpus, guaranteed, inputs.holding)
        #: the pools' usage as this plan places and preempts (None: no pool is starving)
        self.books: fairshare.Books | None = None
        if inputs.fair is not None and inputs.fair.anyone_starving():
            placed = [
                (inputs.extra_pools.get(allocation.job_id, ""), allocation.resources)
                for allocation in inputs.extra
            ]
            self.books = fairshare.Books(inputs.fair, placed)
            for job in inputs.holding:  # being stopped: counted by their pools, and leaving them
                if job.status == Status.PREEMPTING:
                    self.books.add(job.spec.pool, job.spec.resources, sign=-1)
        #: answers that read only the books, by pool and GPUs in all, until the books next move
        #: (``take``, ``release``): a cycle asks them for hundreds of preemptors of a few shapes
        self._triggers: dict[tuple[str, int, bool], Trigger] = {}
        self._may_borrow_alone: dict[tuple[str, int], bool] = {}

    def of(self, preemptor: Preemptor, aggressive: bool) -> Trigger:
        """What ``preemptor`` may take beyond lower classes (in the aggressive stage or not)."""
        first = preemptor.first
        pool = first.spec.pool
        key = (pool, first.spec.resources.gpus * len(preemptor.tasks), aggressive)
        trigger = self._triggers.get(key)
        if trigger is None:
            beneficiary = self.books.beneficiary(pool, aggressive) if self.books is not None else None
            trigger = Trigger(self.reclaims(first, len(preemptor.tasks)), beneficiary, aggressive)
            self._triggers[key] = trigger
        return trigger

    def reclaims(self, first: Job, size: int) -> bool:
        """P's pool is below its guarantee even with P running: it may reclaim borrowed capacity.
        A guarantee counts up to the pool's fair share only: guarantees that add up to more than
        their parent's share are scaled down by fair share, and reclaiming past that would hand
        the GPUs to a pool that fair share then takes them back from, cycle after cycle."""
        pool = self.inputs.pools.get(first.spec.pool)
        if pool is None or pool.guarantee.gpus <= 0:
            return False
        guaranteed: float = pool.guarantee.gpus
        fair = self.inputs.fair
        share = fair.shares.pools.get(first.spec.pool) if fair is not None else None
        if fair is not None and share is not None:
            guaranteed = min(guaranteed, share.fair[0] * fair.shares.total.gpus * (1 + 1e-9))
        wanted = self.guarantees.held.get(first.spec.pool, 0) + first.spec.resources.gpus * size
        return wanted <= guaranteed

    def reason(self, unit: Unit, first: Job, trigger: Trigger) -> str | None:
        """The trigger under which ``unit`` may be taken for ``first`` ("priority", "reclaim",
        "fair_share"), or None when it may not. A ``service`` pool's allocation on its own
        (guaranteed) capacity is never taken."""
        preemptor_class = first.spec.preemption_class
        if trigger.reclaiming and unit.borrowed and unit.pool != first.spec.pool:
            return "reclaim" if unit.preemption_class <= preemptor_class else None
        if not unit.borrowed and pool_kind(self.inputs, unit.pool) == "service":
            return None
        if unit.preemption_class < preemptor_class:
            return "priority"
        if trigger.beneficiary is not None and unit.preemption_class == preemptor_class:
            return "fair_share" if self.fair_victim(unit, trigger) else None
        return None

    def fair_victim(self, unit: Unit, trigger: Trigger) -> bool:
        """``unit`` is in its pool's preemptible group (or aggressively preemptible, in the
        aggressive stage), and taking it leaves no pool on its way to the beneficiary starving
        or under its threshold (``fairshare.Books.may_take_from``)."""
        group = fairshare.Group
        wanted = group.AGGRESSIVELY_PREEMPTIBLE if trigger.aggressive else group.PREEMPTIBLE
        if self.books is None or trigger.beneficiary is None:
            return False
        if self.units.group_of(unit) < wanted:
            return False
        thresholds = (self.settings.aggressive_satisfaction_threshold, self.settings.satisfaction_threshold)
        return self.books.may_take_from(
            unit.pool, trigger.beneficiary, trigger.aggressive, thresholds, unit.held
        )

    def fair_set_holds(self, chosen: Sequence[Unit], first: Job, trigger: Trigger) -> bool:
        """Every fair-share victim of the set may still be taken once the rest of the set has gone
        too: each unit was a candidate against the books on its own, and two from under one pool
        may leave it below its fair share together."""
        if self.books is None or trigger.beneficiary is None:
            return True
        for unit in chosen:
            if self.reason(unit, first, trigger) != "fair_share":
                continue
            saved = dict(self.books.usage), dict(self.books.own)
            for job in (job for other in chosen if other is not unit for job in other.jobs):
                self.books.add(job.spec.pool, job.spec.resources, sign=-1)
            holds = self.fair_victim(unit, trigger)
            self.books.usage, self.books.own = saved
            if not holds:
                return False
        return True

    def refusal(self, preemptor: Preemptor, victims: Sequence[Unit]) -> Reason | None:
        """Why ``preemptor`` may not be placed once ``victims`` have left: it is unreclaimable
        (``protection.unreclaimable``) and would run on borrowed capacity (``borrowing.may_place``);
        None when it may."""
        first = preemptor.first
        if not unreclaimable(first, pool_kind(self.inputs, first.spec.pool)):
            return None
        if self._may_borrow(preemptor, victims):
            return None
        return borrowing.refusal(first, first.spec.resources.gpus * len(preemptor.tasks))

    def _may_borrow(self, preemptor: Preemptor, victims: Sequence[Unit]) -> bool:
        """``borrowing.may_place`` for a preemptor, on the cluster as it would be once ``victims``
        have left: their GPUs free again and out of their pools' usage."""
        gpus = preemptor.first.spec.resources.gpus * len(preemptor.tasks)
        view = self.guarantees
        if not victims:
            key = (preemptor.first.spec.pool, gpus)
            alone = self._may_borrow_alone.get(key)
            if alone is None:
                alone = self._may_borrow_alone[key] = borrowing.may_place(preemptor.first, gpus, view)
            return alone
        held = dict(view.held)
        freed = 0
        for unit in victims:
            for job in unit.jobs:
                held[job.spec.pool] = held.get(job.spec.pool, 0) - job.spec.resources.gpus
                freed += job.spec.resources.gpus
        view = borrowing.Guarantees(view.free_gpus + freed, view.guaranteed, held)
        return borrowing.may_place(preemptor.first, gpus, view)

    def take(self, placements: Sequence[TaskPlacement], request: Resources, pool: str) -> None:
        """Book the room ``placements`` use to ``pool``."""
        self._moved()
        self.guarantees.take(pool, request.gpus * len(placements))
        if self.books is not None:
            for _ in placements:
                self.books.add(pool, request)

    def release(self, chosen: Sequence[Unit]) -> None:
        """The victims' GPUs come free (they still count for their pools' guarantees until they have
        left) and leave their pools' fair-share usage."""
        self._moved()
        self.guarantees.free_gpus += sum(
            resources.gpus for unit in chosen for resources, _ in unit.frees.values()
        )
        if self.books is not None:
            for unit in chosen:
                for job in unit.jobs:
                    self.books.add(job.spec.pool, job.spec.resources, sign=-1)

    def _moved(self) -> None:
        """The books move: what was kept from them no longer holds."""
        self._triggers.clear()
        self._may_borrow_alone.clear()
