"""One preemptor at a time (seed 003): room without anyone stopping first (left to the claim, or
reserved on room victims of earlier cycles are freeing), else a victim set (``search``), checked
against the fair-share and borrowing rules (``triggers``), and committed to the plan's books."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from corral.core import borrowing, fairshare, pool_limits
from corral.core.decisions import Preemption, TaskPlacement, Victim
from corral.core.preemption import rules
from corral.core.preemption.inputs import PlanInputs, Preemptor
from corral.core.preemption.limits import over_limits
from corral.core.preemption.locality import Locality, Option
from corral.core.preemption.room import Room
from corral.core.preemption.rules import NEVER_PREEMPTED_CLASS, PLANNER_CODES, Trigger
from corral.core.preemption.search import Search
from corral.core.preemption.triggers import Triggers
from corral.core.preemption.units import Unit, Units
from corral.domain.records import Reason
from corral.domain.resources import Resources
from corral.domain.status import Status

__all__ = ["Planner"]


class Planner:
    """One cycle's plan: the room (``Room``), the victim units (``Units``), the pools' books
    (``Triggers``) and the search over them (``Search``), and what the plan gave so far."""

    def __init__(self, inputs: PlanInputs) -> None:
        self.inputs = inputs
        self.now = inputs.now
        self.settings = inputs.settings
        self.room = Room(inputs)
        self.units = Units(inputs, self.room.free, self.room.free_gpus_at_start)
        self.triggers = Triggers(inputs, self.room.free_gpus(), self.units)
        self.search = Search(inputs, self.room, self.units, self.triggers)
        for worker_id, at in inputs.last_preemptive.items():
            if at > self.now - inputs.settings.backoff_s:
                self.units.block(worker_id)
        #: below every running job's class, nothing may be taken: such a job just waits for capacity
        self.lowest_class = min(
            (job.spec.preemption_class for job in inputs.holding if job.status == Status.RUNNING),
            default=NEVER_PREEMPTED_CLASS,
        )
        #: the pools' limits and what their subtrees hold, this cycle's reservations counted
        self.limits = _limits_of(inputs)
        #: preemptors that fit without anyone stopping, and the room set aside for them
        self.fitting: list[tuple[str, tuple[TaskPlacement, ...]]] = []
        #: the preemptors given room, in the order the plan gave it
        self.order: list[str] = []
        #: the workers' topology domains (``locality``), built for the first gang that reaches a
        #: victim set; None without topology labels
        self._locality: Locality | None = None
        self._locality_known = False

    def enforce_limits(self, budget: int) -> tuple[Preemption, ...]:
        """The pools over their limits preempted back under them (``limits.over_limits``): their
        victims are this plan's, no preemptor takes them again."""
        enforced = over_limits(self.inputs, self.units.built().units, self.units.used, budget)
        self.search.changed()
        return enforced

    @property
    def books(self) -> fairshare.Books | None:
        """Fair share's books as the plan moves them (None: no pool is starving)."""
        return self.triggers.books

    def place(self, preemptor: Preemptor, aggressive: bool = False) -> Preemption | Reason | None:
        """A preemption for ``preemptor``, or why it waits (None: nothing to say: it fits without
        anyone stopping, or can never fit, or waits for capacity like any job)."""
        spec = preemptor.first.spec
        request, size = spec.resources, len(preemptor.tasks)
        eligible = self.room.eligible_workers(preemptor.first)
        if not eligible:
            return None  # the admission cycle or ``why`` already says it can never fit
        past_limit = self._past_limit(preemptor)
        if past_limit is not None:
            return past_limit
        room = self.room.tasks_on(eligible, request)
        if sum(room.values()) >= size:
            refused = self.triggers.refusal(preemptor, ())
            if refused is not None:
                return refused
            if not self.room.stopping.intersection(room) or self.room.fits_now(preemptor, room):
                # It fits without anyone stopping: the claim or the next cycle places it. The room
                # is set aside in this plan's books, so no lower preemptor counts on it.
                fitting = self.room.placements(preemptor, [], set(room), request) or []
                self._take(fitting, request, spec.pool)
                self.fitting.append((preemptor.key, tuple(fitting)))
                self.order.append(preemptor.key)
                return None
            # It fits once victims of earlier preemptions have left: reserved there, nobody else
            # takes that room, and nobody more is stopped for it.
            nearby = self._nearby(preemptor, room)
            waiting_room = self.room.placements(preemptor, [], nearby, request) if nearby else None
            if waiting_room is not None:
                return self._commit(preemptor, [], waiting_room, Trigger())
        trigger = self.triggers.of(preemptor, aggressive)
        if spec.preemption_class <= self.lowest_class and not trigger:
            # Nothing below it to take from: it waits for capacity like any job. A reason an
            # earlier cycle's plan gave it (its pool was starving then) would mislead now.
            if preemptor.first.reason is not None and preemptor.first.reason.code in PLANNER_CODES:
                return Reason(
                    "queued",
                    "waiting for a worker with free capacity; nothing it may preempt (no lower class"
                    " running, its pool not starving)",
                )
            return None
        shape = self.search.shape(preemptor.first, eligible, trigger)
        failed = shape.failed_sizes.get(trigger.beneficiary)
        if failed is not None and size >= failed:
            # Within a cycle room only shrinks: what failed for this shape fails again.
            return self._no_set(preemptor, eligible, trigger)
        cut = shape.limited_sizes.get(trigger.beneficiary)
        if cut is not None and size >= cut:
            # and what the search cap cut short is cut short again: not known to have no set
            return _search_limited(preemptor)
        # A set found and then refused by the borrowing rule is found and refused again for every
        # preemptor alike (same shape, trigger, size, pool, protection and worth) until the plan
        # takes something: a cycle may hold hundreds of them (protected work of a pool past its
        # guarantee).
        alike = (
            id(shape),
            trigger,
            size,
            spec.pool,
            spec.preemption_class,
            spec.checkpoint_mode,
            spec.walltime_s,
        )
        refused = self.search.refused.get(alike)
        if refused is not None:
            return refused
        found = self.search.find(preemptor, room, shape, trigger)
        if found.limited:
            decided: Preemption | Reason = _search_limited(preemptor)
        else:
            decided = self._finish(
                preemptor, found.chosen, room, found.missing, eligible, trigger, found.examined
            )
            if isinstance(decided, Reason) and decided.code == borrowing.REFUSED:
                self.search.refused[alike] = decided
        self.search.restore(shape, found.popped)
        return decided

    def _finish(
        self,
        preemptor: Preemptor,
        chosen: list[Unit],
        room: Mapping[str, int],
        missing: int,
        eligible: Sequence[str],
        trigger: Trigger,
        examined: int,
    ) -> Preemption | Reason:
        """The set found, made minimal and placed, if the fair-share and borrowing rules allow it.
        With topology labels, a gang's set may give way to one inside a single domain
        (``locality``): each set offered is checked in turn, the first that passes is committed."""
        if missing > 0:
            return self._no_set(preemptor, eligible, trigger, examined)
        found = self._placed(preemptor, chosen, room, eligible)
        if found is None:  # the put-back left less than it counted: cannot happen
            return self._no_set(preemptor, eligible, trigger, examined)
        locality = self.locality()
        if locality is None or len(preemptor.tasks) < 2:
            return self._checked(preemptor, found[0], found[1], eligible, trigger, examined)
        required = self._required_level(preemptor, locality)
        decided: Preemption | Reason | None = None
        for units, placements in locality.options(
            preemptor, found, room, eligible, trigger, required, self._placed
        ):
            decided = self._checked(preemptor, units, placements, eligible, trigger, examined)
            if isinstance(decided, Preemption):
                return decided
        if decided is not None:
            return decided  # the last set offered failed the rules too: its reason
        asked = preemptor.first.spec.topology
        level = asked.level if asked is not None else ""
        return Reason(
            "topology",
            f"needs its {len(preemptor.tasks)} tasks inside one {level}; no set of preemptible"
            f" work inside one {level} would make room",
        )

    def _placed(
        self, preemptor: Preemptor, chosen: list[Unit], room: Mapping[str, int], eligible: Sequence[str]
    ) -> Option | None:
        """``chosen`` made minimal and the tasks placed: on ``room``'s workers and the eligible
        ones the set frees (a gang victim frees workers the preemptor may not use: its
        constraints)."""
        request, size = preemptor.first.spec.resources, len(preemptor.tasks)
        freed = {worker_id for unit in chosen for worker_id in unit.frees}
        workers = (set(room) | freed) & set(eligible)
        chosen = self.search.minimal(chosen, workers, request, size)
        placements = self.room.placements(preemptor, chosen, workers, request)
        return None if placements is None else (chosen, placements)

    def _checked(
        self,
        preemptor: Preemptor,
        chosen: list[Unit],
        placements: list[TaskPlacement],
        eligible: Sequence[str],
        trigger: Trigger,
        examined: int,
    ) -> Preemption | Reason:
        """The fair-share, worth and borrowing rules on a placed set; committed when they allow it."""
        if not self.triggers.fair_set_holds(chosen, preemptor.first, trigger):
            return self._no_set(preemptor, eligible, trigger, examined)
        too_dear = self._too_dear(preemptor, chosen, trigger)
        if too_dear is not None:
            return too_dear
        refused = self.triggers.refusal(preemptor, chosen)
        if refused is not None:
            return refused
        return self._commit(preemptor, chosen, placements, trigger)

    def locality(self) -> Locality | None:
        """The plan's topology domains, built on first use; None when no usable worker carries a
        topology label."""
        if not self._locality_known:
            self._locality_known = True
            levels = self.inputs.topology_levels
            if Locality.applies(levels, self.room):
                self._locality = Locality(levels, self.room, self.units, self.search)
        return self._locality

    def _nearby(self, preemptor: Preemptor, room: Mapping[str, int]) -> set[str] | None:
        """The workers of ``room`` a gang's tasks go to: with topology labels, those the gang
        placement picks on that room (``Locality.nearby``: the narrowest domain, else the fewest),
        else every one of them (placed in id order). None: no domain of the level the gang
        requires holds it there (it looks for victims inside one instead)."""
        locality = self.locality()
        if locality is None or len(preemptor.tasks) < 2:
            return set(room)
        required = self._required_level(preemptor, locality)
        return locality.nearby(room, len(preemptor.tasks), required)

    def _required_level(self, preemptor: Preemptor, locality: Locality) -> int | None:
        """The index (widest first) of the level ``preemptor`` requires, None when it requires none."""
        asked = preemptor.first.spec.topology
        if asked is None or not asked.required or asked.level not in locality.levels:
            return None
        return locality.levels.index(asked.level)

    def _too_dear(self, preemptor: Preemptor, chosen: Sequence[Unit], trigger: Trigger) -> Reason | None:
        """``no_victim_set`` when the priority and fair-share victims of ``chosen`` cost, together,
        at least what ``preemptor`` is worth (``rules.worth_preempting``); None when they may go."""
        worth = rules.value(preemptor)
        if worth is None:
            return None
        first = preemptor.first
        counted = [unit for unit in chosen if self.triggers.reason(unit, first, trigger) != "reclaim"]
        total = sum(unit.cost for unit in counted)
        if rules.worth_preempting(total, worth):
            return None
        return Reason(
            "no_victim_set",
            f"the set of {len(counted)} job(s) or gang(s) that would make room loses {total:.0f} GPU-seconds"
            f" of work, not below the {worth:.0f} GPU-seconds this job is worth (its GPUs times its"
            " walltime_s): preempting it would cost more than it gains",
        )

    def _take(self, placements: Sequence[TaskPlacement], request: Resources, pool: str) -> None:
        """The room these placements use is ``pool``'s, and no one else's this cycle."""
        self.search.changed()
        self.triggers.take(placements, request, pool)
        self.room.take(placements, request)
        if self.limits.limits:
            self.limits.take(pool, _times(request, len(placements)))

    def _past_limit(self, preemptor: Preemptor) -> Reason | None:
        """``pool_limit`` when ``preemptor``'s pool, or an ancestor, would go past its limits with
        it placed (``corral.core.pool_limits``): no victim is taken for it. Its victims would still
        hold their resources while they stop, so stopping work of its own subtree makes no room
        within the limit this cycle."""
        if not self.limits.limits:
            return None
        spec = preemptor.first.spec
        return self.limits.refusal(spec.pool, _times(spec.resources, len(preemptor.tasks)))

    def _commit(
        self,
        preemptor: Preemptor,
        chosen: Sequence[Unit],
        placements: Sequence[TaskPlacement],
        trigger: Trigger,
    ) -> Preemption:
        first = preemptor.first
        victims = tuple(
            Victim(
                unit.key,
                tuple(job.id for job in unit.jobs),
                unit.preemption_class,
                unit.cost,
                self.triggers.reason(unit, first, trigger) or "priority",
            )
            for unit in chosen
        )
        worker_ids = tuple(sorted({worker_id for unit in chosen for worker_id in unit.frees}))
        self.units.used.update(unit.key for unit in chosen)
        self.search.changed()
        self.room.release(chosen)
        self.triggers.release(chosen)
        self._take(placements, first.spec.resources, first.spec.pool)
        for worker_id in worker_ids:
            self.room.touch(worker_id)
            self.units.block(worker_id)
        self.order.append(preemptor.key)
        checkpointing = any(job.spec.checkpoint_mode != "none" for unit in chosen for job in unit.jobs) or (
            not chosen  # placed on room still held by stopping victims: they may be checkpointing
        )
        return Preemption(
            preemptor=preemptor.key,
            job_ids=tuple(task.id for task in preemptor.tasks),
            placements=tuple(placements),
            victims=victims,
            worker_ids=worker_ids,
            victims_deadline=self.now + self.settings.victims_leave_within(checkpointing),
        )

    def _no_set(
        self, preemptor: Preemptor, eligible: Sequence[str], trigger: Trigger, examined: int = 0
    ) -> Reason:
        """Why no victim set makes room for ``preemptor``: its workers are in their backoff (when
        no set was even looked at), or no set of preemptible work would do."""
        first = preemptor.first
        size = len(preemptor.tasks)
        what = f"its {size} tasks" if size > 1 else "it"
        allowed = set(eligible)
        if not examined and any(
            worker_id in allowed
            and any(self.triggers.reason(unit, first, trigger) for unit in self.units.on.get(worker_id, ()))
            for worker_id in self.units.backoff
        ):
            return Reason(
                "preemption_backoff",
                f"no free room for {what}; workers running work it may preempt had a preemptive"
                f" placement in the last {self.settings.backoff_s:g} s (at most one per worker per"
                " backoff): it is tried again next cycle",
            )
        fair = ""
        books = self.triggers.books
        if trigger.beneficiary is not None and books is not None:
            pool = fairshare.describe(trigger.beneficiary, books.state)
            fair = (
                f"; {pool}: it may also take allocations of its own class that other pools run past"
                " their fair share, and none would make room"
            )
        return Reason(
            "no_victim_set",
            f"no free room for {what}, and no set of at most {self.settings.max_victims} preemptible"
            f" jobs or gangs of a class below {first.spec.preemption_class} would make room (class 10,"
            " sensitive pools, jobs near their walltime and class 7+ jobs without checkpoints are"
            f" never preempted){fair}",
        )


def _limits_of(inputs: PlanInputs) -> pool_limits.Limits:
    """The pools' limits and what each limited subtree holds: the holding jobs and the cycle's
    reservations (``PlanInputs.extra``, booked to their pools)."""
    limits = pool_limits.limits_of(inputs.pools)
    if not limits:
        return pool_limits.Limits(limits)
    books = pool_limits.Limits.of(limits, pool_limits.own_held(inputs.holding))
    for allocation in inputs.extra:
        books.take(inputs.extra_pools.get(allocation.job_id, ""), allocation.resources)
    return books


def _times(request: Resources, count: int) -> Resources:
    return Resources(request.gpus * count, request.vram_mb, request.memory_mb * count, request.cpus * count)


def _search_limited(preemptor: Preemptor) -> Reason:
    """``search_limited``: the search's cap (``rules.SEARCH_LIMIT`` worker sets per preemptor) cut
    it short before a set made room; the next cycle searches again."""
    size = len(preemptor.tasks)
    what = f"its {size} tasks" if size > 1 else "it"
    return Reason(
        "search_limited",
        f"no free room for {what}; the victim search looked at {rules.SEARCH_LIMIT} worker sets (its"
        " limit per job and cycle, which keeps a cycle's time bounded) without making room: a set"
        " beyond them might, and the next cycle searches again",
    )
