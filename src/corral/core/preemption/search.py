"""The victim-set search (seed 003): for one task of a preemptor, a worker's eligible units in
comparator order, taken until the task fits in the worker's free capacity plus what they free,
then put back in reverse order where the task still fits without them (minimal), at most
``max_victims`` units; the best worker sets first (the set's worst class, its cost, its size, the
worker id), and once more over the whole set, so that no unit is stopped that the preemptor does
not need.

Worker sets are computed once per preemptor shape (class, request, constraints, pool when it
reclaims) and only as far as needed: workers in the order of a lower bound of their best set's key,
no further than the preemptor's class allows, at most ``SEARCH_LIMIT`` sets per preemptor. A set
made stale by an earlier preemption of the cycle is recomputed, one on a worker in its backoff
dropped."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from heapq import heappop, heappush
from itertools import count

from corral.core.preemption.capacity import plus, tasks_fitting
from corral.core.preemption.inputs import PlanInputs, Preemptor
from corral.core.preemption.room import Room
from corral.core.preemption.rules import SEARCH_LIMIT, Trigger, victim_key
from corral.core.preemption.triggers import Triggers
from corral.core.preemption.units import Unit, Units
from corral.domain.records import Job, Reason
from corral.domain.resources import ZERO, Resources

__all__ = ["Found", "Search", "Shape", "WorkerSet"]

SetKey = tuple[int, float, int, str]


@dataclass(frozen=True, slots=True)
class WorkerSet:
    worker_id: str
    units: tuple[Unit, ...]
    key: SetKey
    #: the worker's version when the set was computed (``Room.versions``): stale once it moved
    version: int


#: a heap entry: a set's key, a tie-break, the set
Entry = tuple[SetKey, int, WorkerSet]


@dataclass(slots=True)
class Found:
    """What the search found for one preemptor: the units chosen, the tasks still missing room, the
    worker sets it examined, and the shape's sets it popped (``Search.restore``)."""

    chosen: list[Unit]
    missing: int
    examined: int
    popped: list[Entry]
    #: the search stopped at ``SEARCH_LIMIT`` sets with tasks still missing room and sets left to
    #: look at (``search_cut``): a set beyond the limit might have made room
    limited: bool = False


class Shape:
    """The worker victim sets of one preemptor shape, best first, computed lazily: a worker's set
    is computed only once the search's lower bound for it (``Search.bounds``) is below every set
    computed so far, so most workers of a large cluster are never looked at."""

    def __init__(
        self, first: Job, trigger: Trigger, eligible: frozenset[str], domain: tuple[int, ...] | None = None
    ) -> None:
        self.first = first
        self.trigger = trigger
        self.eligible = eligible
        #: the topology domain the search is confined to (``locality``): its workers' bounds only
        self.domain = domain
        self._bounds: list[SetKey] | None = None  # a confined shape's own bounds, once read
        self.next_bound = 0
        self.ready: list[Entry] = []
        #: the smallest preemptor of this shape (in tasks) no victim set was found for
        #: per pool preempted for (a starving pool's may take what another's may not)
        self.failed_sizes: dict[str | None, int] = {}
        #: likewise, the smallest whose search ``SEARCH_LIMIT`` cut short: a larger one of the
        #: shape would be cut short too (room only shrinks), and says ``search_limited``, never
        #: ``no_victim_set`` (a set beyond the cut might have made room)
        self.limited_sizes: dict[str | None, int] = {}

    def best(self, search: Search) -> Entry | None:
        """The best set there is, left at the top of ``ready`` (None when there is none)."""
        gpus = self.first.spec.resources.gpus
        if self.domain is None:
            bounds = search.bounds(gpus)
        else:
            if self._bounds is None:
                self._bounds = search.bounds_in(gpus, self.eligible)
            bounds = self._bounds
        # at or past this class no set can be taken (never within a class, but for a reclaim or
        # for fair share)
        ceiling = self.first.spec.preemption_class + (1 if self.trigger else 0)
        while self.next_bound < len(bounds) and (
            not self.ready or bounds[self.next_bound] < self.ready[0][0]
        ):
            if bounds[self.next_bound][0] >= ceiling:
                self.next_bound = len(bounds)
                break
            worker_id = bounds[self.next_bound][3]
            self.next_bound += 1
            if worker_id not in self.eligible or worker_id in search.units.backoff:
                continue
            if search.units.reach[worker_id] < self.first.spec.resources.gpus:
                continue  # even its largest units, as many as one preemption may take, are too few
            units = search.candidates(worker_id, self.first, self.trigger)
            found = search.worker_set(worker_id, units, self.first.spec.resources) if units else None
            if found is not None:
                heappush(self.ready, (found.key, next(search.sequence), found))
        return self.ready[0] if self.ready else None


class Search:
    """One plan's victim-set search. A worker or unit used by an earlier preemptor of the cycle is
    skipped, never recomputed (it is in its backoff for the rest of the cycle anyway)."""

    def __init__(self, inputs: PlanInputs, room: Room, units: Units, triggers: Triggers) -> None:
        self.settings = inputs.settings
        self.room = room
        self.units = units
        self.triggers = triggers
        self.sequence = count()  # heap tie-break
        self._shapes: dict[tuple[object, ...], Shape] = {}
        self._bounds: dict[int, list[SetKey]] = {}
        self._bound_of: dict[int, dict[str, SetKey]] = {}  # ``bounds`` by worker (``bounds_in``)
        #: ``candidates`` answers until the plan next takes room or victims (``changed``)
        self._candidates: dict[tuple[str, int, str, Trigger], tuple[Unit, ...]] = {}
        #: the borrowing rule's refusals of a set found, by the preemptors alike
        #: (``Planner.place``), until the plan next takes room or victims
        self.refused: dict[tuple[object, ...], Reason] = {}
        #: per worker, its units largest there first (``fewest_victims``); the units do not move
        #: during a plan, only whether each may be taken
        self._largest_first: dict[str, list[Unit]] = {}

    def changed(self) -> None:
        """The plan took room or victims: what may be taken, and from whom, may differ now."""
        self._candidates.clear()
        self.refused.clear()

    def shape(
        self, first: Job, eligible: Sequence[str], trigger: Trigger, domain: tuple[int, ...] | None = None
    ) -> Shape:
        """The victim sets of a preemptor shape (class, request, constraints, pool when it
        reclaims, whether it may take for fair share), shared by every preemptor of the shape in
        the cycle and computed lazily. Preemptors of different starving pools share one shape:
        which pools' allocations each may take differs a little (never from inside its own
        subtree), so a set is checked against the preemptor's own trigger when it is taken, and
        computed again for it when it does not pass. ``domain``: the search confined to one
        topology domain's workers (``locality``), ``eligible`` then being those workers."""
        spec = first.spec
        key = (
            spec.preemption_class,
            spec.resources,
            spec.constraints.gpu_model,
            tuple(sorted(spec.constraints.labels.items())),
            spec.pool if trigger.reclaiming else None,
            trigger.beneficiary is not None,
            trigger.aggressive,
            domain,
        )
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = Shape(first, trigger, frozenset(eligible), domain)
        return shape

    def find(self, preemptor: Preemptor, room: dict[str, int], shape: Shape, trigger: Trigger) -> Found:
        """Units to take so that every task of ``preemptor`` has room, beyond the ``room`` it has:
        the best set first, from the sets of its shape. A worker that gave one task may give the
        next: its set for one task more, counting what the chosen units free there, waits in
        ``local``. Records a failure in the shape (within a cycle room only shrinks)."""
        first = preemptor.first
        request, size = first.spec.resources, len(preemptor.tasks)
        failed = shape.failed_sizes.get(trigger.beneficiary)
        chosen: list[Unit] = []
        missing = size - sum(room.values())
        local: list[Entry] = []
        popped: list[Entry] = []
        examined = 0
        capped = False  # a set was passed over, or the search stopped, for the victim cap alone
        while missing > 0 and len(chosen) < self.settings.max_victims and examined < SEARCH_LIMIT:
            best = shape.best(self)
            from_local = bool(local) and (best is None or local[0] < best)
            if not from_local and best is None:
                break
            entry = heappop(local if from_local else shape.ready)
            worker_set = entry[2]
            worker_id = worker_set.worker_id
            if not from_local:
                if worker_id in self.units.backoff:
                    continue  # for the rest of the cycle
                if worker_set.version != self.room.versions.get(worker_id, 0) or (
                    trigger.beneficiary is not None
                    and not all(self.triggers.reason(unit, first, trigger) for unit in worker_set.units)
                ):
                    # stale: the worker changed, or a fair-share preemption since moved the
                    # pools' usage so that a unit of the set may not be taken any more
                    units = self.candidates(worker_id, first, trigger)
                    fresh = self.worker_set(worker_id, units, request) if units else None
                    if fresh is not None:
                        heappush(shape.ready, (fresh.key, next(self.sequence), fresh))
                    continue
                popped.append(entry)
                examined += 1
                if any(worker_id in unit.frees for unit in chosen):
                    self._push_next(local, worker_id, first, trigger, chosen)
                    continue
            new = [unit for unit in worker_set.units if unit not in chosen]
            if len(chosen) + len(new) > self.settings.max_victims:
                capped = True
                continue
            chosen.extend(new)
            # counted over every worker the chosen units free: a gang victim frees several
            missing = size - self.room.tasks_with(chosen, set(room), request, shape.eligible)
            if missing > 0:
                self._push_next(local, worker_id, first, trigger, chosen)
        if missing > 0 and (capped or len(chosen) >= self.settings.max_victims):
            fewest = self.fewest_victims(preemptor, room, shape, trigger)
            if fewest is not None:
                chosen, missing = fewest, 0
        # sets left are looked for only when the cap was reached (it may compute a few more)
        limited = search_cut(missing, examined) and (bool(local) or shape.best(self) is not None)
        if limited:
            cut = shape.limited_sizes.get(trigger.beneficiary)
            shape.limited_sizes[trigger.beneficiary] = min(size, cut or size)
        elif missing > 0:
            shape.failed_sizes[trigger.beneficiary] = min(size, failed or size)
        return Found(chosen, missing, examined, popped, limited)

    def fewest_victims(
        self, preemptor: Preemptor, room: dict[str, int], shape: Shape, trigger: Trigger
    ) -> list[Unit] | None:
        """A set within ``max_victims`` where the cheapest-first search ran out of its cap: the
        cheapest sets can be many small units (two 1-GPU jobs for a 2-GPU task) where fewer larger
        ones make room for more tasks. Unit by unit, the one that adds the most tasks (the lowest
        class first, then the comparator's order), as far as ``max_victims`` units; None when no
        set of them makes room for every task. Only a worker's largest units are tried (no more
        of them can go in one preemption).

        A unit changes the count only on the workers it frees, so each is weighed by what it adds
        there (``Room.tasks_with`` counts the same sum whole), and the offers are read a class at a
        time: the lowest class where some unit adds a task holds the choice (a cluster offers
        thousands of units; membership is by key, never by comparing the units' fields)."""
        first = preemptor.first
        request, size = first.spec.resources, len(preemptor.tasks)
        most = self.settings.max_victims
        workers = set(room)
        offered: list[Unit] = []
        seen: set[str] = set()
        on = self.units.on
        may_take, reason = self.units.free_to_take, self.triggers.reason
        for worker_id in sorted(shape.eligible):
            if worker_id in self.units.backoff or worker_id not in on:
                continue
            largest = self._largest_first.get(worker_id)
            if largest is None:
                largest = self._largest_first[worker_id] = sorted(
                    on[worker_id], key=lambda unit: (-unit.frees[worker_id][0].gpus, victim_key(unit))
                )
            taken = 0  # the worker's ``most`` largest units it may take (``candidates``' filter)
            for unit in largest:
                if not (may_take(unit) and reason(unit, first, trigger)):
                    continue
                if unit.key not in seen:
                    seen.add(unit.key)
                    offered.append(unit)
                taken += 1
                if taken == most:
                    break
        offered.sort(key=lambda unit: unit.preemption_class)  # stable: the offers' order within a class
        eligible = shape.eligible
        counted = set(workers)  # the workers ``tasks_with`` counts: ``workers`` and the eligible freed
        freed: dict[str, Resources] = {}  # what the chosen units free on each counted worker
        free = self.room.free
        chosen: list[Unit] = []
        chosen_keys: set[str] = set()
        have = self.room.tasks_with(chosen, workers, request, eligible)
        #: each offer's gain, kept until a unit chosen frees one of the same workers
        gains: dict[str, int] = {}
        sharing: dict[str, list[Unit]] = {}
        for unit in offered:
            for worker_id in unit.frees:
                sharing.setdefault(worker_id, []).append(unit)

        def gain(unit: Unit) -> int:
            added = gains.get(unit.key)
            if added is not None:
                return added
            added = 0
            for worker_id, (resources, _) in unit.frees.items():
                known = worker_id in counted
                if not known and worker_id not in eligible:
                    continue
                base = free[worker_id].capacity.free
                if worker_id in freed:
                    base = plus(base, freed[worker_id])
                added += tasks_fitting(plus(base, resources), request)
                if known:
                    added -= tasks_fitting(base, request)
            gains[unit.key] = added
            return added

        while len(chosen) < most:
            best: tuple[tuple[object, ...], Unit, int] | None = None
            at = 0
            while at < len(offered) and best is None:  # one class at a time, lowest first
                klass = offered[at].preemption_class
                while at < len(offered) and offered[at].preemption_class == klass:
                    unit = offered[at]
                    at += 1
                    if unit.key in chosen_keys:
                        continue
                    added = gain(unit)
                    if added <= 0:
                        continue
                    rank = (unit.preemption_class, -added, victim_key(unit))
                    if best is None or rank < best[0]:
                        best = (rank, unit, have + added)
            if best is None:
                return None
            unit = best[1]
            chosen.append(unit)
            chosen_keys.add(unit.key)
            for worker_id, (resources, _) in unit.frees.items():
                if worker_id in counted or worker_id in eligible:
                    counted.add(worker_id)
                    freed[worker_id] = plus(freed[worker_id], resources) if worker_id in freed else resources
                for other in sharing.get(worker_id, ()):
                    gains.pop(other.key, None)
            have = best[2]
            if have >= size:
                return chosen
        return None

    def restore(self, shape: Shape, popped: Sequence[Entry]) -> None:
        """The sets ``find`` popped are still good for the next preemptor of the shape, unless spent."""
        for entry in popped:
            if entry[2].worker_id not in self.units.backoff:
                heappush(shape.ready, entry)

    def _push_next(
        self, local: list[Entry], worker_id: str, first: Job, trigger: Trigger, chosen: Sequence[Unit]
    ) -> None:
        relative = self.next_set(worker_id, first, trigger, chosen)
        if relative is not None:
            heappush(local, (relative.key, next(self.sequence), relative))

    def bounds(self, gpus: int) -> list[SetKey]:
        """Every worker with units, by a lower bound of the key of any victim set there for a task
        of ``gpus`` GPUs: the class of the unit at which its units, lowest class first, free enough
        GPUs (a set must reach that class). Sets are computed in this order, and no further than
        the preemptor's own class allows, so most workers of a large cluster are never looked at."""
        found = self._bounds.get(gpus)
        if found is None:
            found = []
            free = self.room.free
            for worker_id, units in self.units.on.items():
                need = gpus - free[worker_id].capacity.free.gpus
                reached = units[0]
                for unit in units:
                    need -= unit.frees[worker_id][0].gpus
                    reached = unit
                    if need <= 0:
                        break
                # the set holds a unit of that class, the cheapest of which comes first
                cheapest = next(unit for unit in units if unit.preemption_class == reached.preemption_class)
                found.append((reached.preemption_class, cheapest.cost, 1, worker_id))
            found.sort()
            self._bounds[gpus] = found
        return found

    def bounds_in(self, gpus: int, workers: frozenset[str]) -> list[SetKey]:
        """``bounds`` of ``workers`` alone (a search confined to a topology domain): looked up per
        worker, not filtered out of every worker's."""
        index = self._bound_of.get(gpus)
        if index is None:
            index = self._bound_of[gpus] = {bound[3]: bound for bound in self.bounds(gpus)}
        return sorted(index[worker_id] for worker_id in workers if worker_id in index)

    def next_set(
        self, worker_id: str, first: Job, trigger: Trigger, chosen: Sequence[Unit]
    ) -> WorkerSet | None:
        """The set on ``worker_id`` for one task more than it holds once ``chosen`` has gone."""
        units = [unit for unit in self.candidates(worker_id, first, trigger) if unit not in chosen]
        if not units:
            return None
        freed = ZERO
        for unit in chosen:
            if worker_id in unit.frees:
                freed = plus(freed, unit.frees[worker_id][0])
        return self.worker_set(worker_id, units, first.spec.resources, freed)

    def candidates(self, worker_id: str, first: Job, trigger: Trigger) -> tuple[Unit, ...]:
        """The units on ``worker_id`` that ``first`` may take now, in comparator order. Which may be
        taken depends on the preemptor's class and pool and its trigger alone (``Triggers.reason``),
        and changes only when the plan takes something, so the answer is kept until then: a cycle's
        preemptors ask again and again."""
        key = (worker_id, first.spec.preemption_class, first.spec.pool, trigger)
        found = self._candidates.get(key)
        if found is None:
            found = self._candidates[key] = tuple(
                unit
                for unit in self.units.on.get(worker_id, ())
                if self.units.free_to_take(unit) and self.triggers.reason(unit, first, trigger)
            )
        return found

    def worker_set(
        self, worker_id: str, units: Sequence[Unit], request: Resources, freed_already: Resources = ZERO
    ) -> WorkerSet | None:
        """The minimal set of ``units`` (in comparator order) whose going makes room for one more
        task on ``worker_id`` than its free capacity (plus ``freed_already``) holds, or None."""
        free = plus(self.room.free[worker_id].capacity.free, freed_already)
        have = tasks_fitting(free, request)
        taken: list[Unit] = []
        freed = free
        for unit in units:
            taken.append(unit)
            freed = plus(freed, unit.frees[worker_id][0])
            if tasks_fitting(freed, request) > have:
                break
        else:
            return None
        for unit in reversed(taken[:-1]):  # put back what the task does not need
            without = plus(freed, unit.frees[worker_id][0], subtract=True)
            if tasks_fitting(without, request) > have:
                taken.remove(unit)
                freed = without
        if len(taken) > self.settings.max_victims:
            return None
        key = (
            max(unit.preemption_class for unit in taken),
            sum(unit.cost for unit in taken),
            len(taken),
            worker_id,
        )
        return WorkerSet(worker_id, tuple(taken), key, self.room.versions.get(worker_id, 0))

    def minimal(self, chosen: list[Unit], workers: set[str], request: Resources, size: int) -> list[Unit]:
        """Across the whole set, drop every unit P's tasks fit without (most expensive first);
        ``workers``: the ones P may use."""
        kept = sorted(chosen, key=victim_key)
        for unit in reversed(list(kept)):
            trial = [other for other in kept if other is not unit]
            if self.room.tasks_with(trial, workers, request, workers) >= size:
                kept = trial
        return kept


def search_cut(missing: int, examined: int) -> bool:
    """Whether the ``SEARCH_LIMIT`` stopped a preemptor's search: tasks still missing room after it
    examined that many worker sets (``search_limited``, when sets were left to look at)."""
    return missing > 0 and examined >= SEARCH_LIMIT
