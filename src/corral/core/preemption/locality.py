"""Where a gang preemptor's victims are taken (issue 25): inside the best topology domain, not
across the cluster.

The victim-set search (``search``) picks the cheapest worker sets wherever they are: a gang placed
on them can span as many racks as it has tasks. Once workers carry topology labels
(``CORRAL_TOPOLOGY_LEVELS``, ``corral.core.topology``), ``Locality.options`` weighs that
cluster-wide set against sets searched inside single domains, the narrowest level first (racks,
then blocks):

1. the cluster-wide set already inside one domain of the narrowest level is kept as it is;
2. else, level by level from the narrowest, the domains that could hold the gang once their
   preemptible work is gone (each worker's free room plus its ``max_victims`` largest units,
   ``Units.reach``) are tried, the roomiest now first (the fewest victims), at most
   ``DOMAINS_TRIED`` of a level: the same search confined to the domain's fewest children that
   could hold the gang together (a gang larger than a rack: a block's fewest racks), then to the
   domain whole. The sets found are offered in that order (the roomiest domain first: the
   fewest victims; the first that passes, not the cheapest of all, keeps a cycle's searches
   few), each only when it spans fewer domains (racks, then blocks) and its worst class is no
   higher than the cluster-wide set's (locality never stops work of a higher class than the
   preemptor needed anyway). The next domain is searched only when the set before it fails the
   fair-share, worth or borrowing rules (``Planner._checked``): a required gang does not wait
   while another domain holds a set that passes them. Its cost
   (the work its victims lose) may be higher, within the worth rule every set meets: a bound of
   twice the cluster-wide set's cost plus a GPU-hour was tried in the simulator and lost on every
   figure of the issue (bench/README.md, ``topology_sim.py``);
3. a gang that ``requires`` a level is never placed across two of its domains: only domains of
   that level or narrower are tried, and a cluster-wide set that spans the level is not offered
   (nor is the class bound of 2 held against a confined set: there is nothing else to take); with
   no confined set the gang waits, reason ``topology``, nobody stopped.

A gang that fits on room victims of earlier preemptions are still freeing takes it by the gang
placement (``nearby``: ``topology.Domains.choose``), not in worker-id order.

Pure and bounded: a few confined searches per gang preemptor that reached a victim set (each over
one domain's workers, with the search's own cap and per-cycle caches), none for a single job, none
without labels (the planner's decisions are then exactly what they were).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet

from corral.core import topology
from corral.core.decisions import TaskPlacement
from corral.core.preemption.inputs import Preemptor
from corral.core.preemption.room import Room
from corral.core.preemption.rules import Trigger
from corral.core.preemption.search import Search
from corral.core.preemption.units import Unit, Units

__all__ = ["DOMAINS_TRIED", "Locality", "Option"]

#: the domains of one level a gang preemptor's confined search tries, at most (the roomiest first)
DOMAINS_TRIED = 4

#: a victim set and where it places the preemptor's tasks
Option = tuple[list[Unit], list[TaskPlacement]]
#: the planner's ``placed``: a found set made minimal and placed on the workers given (or None)
_Placer = Callable[[Preemptor, list[Unit], Mapping[str, int], Sequence[str]], "Option | None"]


class Locality:
    """One plan's topology: the usable workers' domains (``topology.Domains``, built once per plan)
    and the confined searches over them."""

    def __init__(self, levels: Sequence[str], room: Room, units: Units, search: Search) -> None:
        self.levels = tuple(levels)
        self.room = room
        self.units = units
        self.search = search
        self.worker_ids = list(room.free)  # the usable workers, by id
        self.order = {worker_id: index for index, worker_id in enumerate(self.worker_ids)}
        paths = [topology.path_of(room.free[worker_id].worker, self.levels) for worker_id in self.worker_ids]
        self.domains = topology.Domains(paths)
        #: per domain node, its workers' ids (read on the first confined search there)
        self._members_of: dict[int, frozenset[str]] = {}

    @staticmethod
    def applies(levels: Sequence[str], room: Room) -> bool:
        """Whether any usable worker carries a topology label."""
        return bool(levels) and topology.labelled((free.worker for free in room.free.values()), levels)

    def span(self, placements: Sequence[TaskPlacement]) -> tuple[int, ...]:
        """The domains ``placements`` spans at each level, the narrowest first (racks, blocks)."""
        chains = self.domains.chains
        nodes = [chains[self.order[place.worker_id]] for place in placements]
        return tuple(len({chain[depth] for chain in nodes}) for depth in reversed(range(len(self.levels))))

    def options(
        self,
        preemptor: Preemptor,
        found: Option,
        room: Mapping[str, int],
        eligible: Sequence[str],
        trigger: Trigger,
        required: int | None,
        placed: _Placer,
    ) -> Iterator[Option]:
        """The victim sets to try, in order (module docstring): the confined ones that span fewer
        domains, each searched only once the one before has failed the rules, then the
        cluster-wide ``found`` unless it breaks ``required`` (the index of the required level,
        widest first). None at all: nothing may be offered."""
        chosen, placements = found
        narrowest = len(self.levels) - 1
        base_span = self.span(placements)
        # ``span`` counts the narrowest level first: level index i sits at narrowest - i
        base_ok = required is None or base_span[narrowest - required] == 1
        request = preemptor.first.spec.resources
        if (base_span[0] == 1 and base_ok) or request.gpus <= 0:
            if base_ok:
                yield found
            return
        worst = max((unit.preemption_class for unit in chosen), default=-1)
        domains = self.domains
        allowed = frozenset(eligible)
        potential = self._potential(room, eligible, request.gpus)
        could = domains.rooms(potential)
        now = domains.rooms((self.order[worker_id], tasks) for worker_id, tasks in room.items())
        size = len(preemptor.tasks)
        offered: set[frozenset[str]] = set()  # the victim sets offered already (by unit key)
        for level in reversed(range(len(self.levels))):
            if required is not None and level < required:
                break  # wider than the required level: never
            if base_ok and base_span[narrowest - level] == 1:
                break  # the cluster-wide set is inside one domain of this level already
            for region in self._regions(level + 1, potential, could, now, size):
                option = self._confined(preemptor, region, room, allowed, trigger, placed)
                if option is None or (base_ok and not self.span(option[1]) < base_span):
                    continue  # (a set confined to the required level beats one that breaks it)
                units = option[0]
                klass = max((unit.preemption_class for unit in units), default=-1)
                if base_ok and klass > worst:
                    continue  # the cluster-wide set may be taken: no higher class for locality
                keys = frozenset(unit.key for unit in units)
                if keys in offered:
                    continue  # a domain's fewest children found the set the domain whole finds
                offered.add(keys)
                yield option
        if base_ok:
            yield found

    def nearby(self, room: Mapping[str, int], size: int, required: int | None) -> set[str] | None:
        """The workers of ``room`` (tasks each holds) that ``size`` tasks go to by the gang
        placement (``topology.Domains.choose``: the narrowest domain that holds them, else the
        fewest); None when no domain of the ``required`` level holds them."""
        units = [(self.order[worker_id], tasks) for worker_id, tasks in room.items()]
        layout = self.domains.choose(units, size, required)
        if layout is None:
            return None
        return {self.worker_ids[order] for order, _ in layout}

    def _potential(
        self, room: Mapping[str, int], eligible: Sequence[str], gpus: int
    ) -> list[tuple[int, int]]:
        """Per eligible worker (its order), the tasks it could hold once its largest preemptible
        units are gone: an upper bound that only rules domains out."""
        reach, backoff = self.units.reach, self.units.backoff
        found = []
        for worker_id in eligible:
            have = room.get(worker_id, 0)
            if worker_id not in backoff and worker_id in reach:
                have = max(have, reach[worker_id] // gpus)
            if have:
                found.append((self.order[worker_id], have))
        return found

    def _regions(
        self, depth: int, potential: list[tuple[int, int]], could: list[int], now: list[int], size: int
    ) -> list[tuple[int, ...]]:
        """Where to confine the search at ``depth`` (1: the widest level): of the domains there
        that could hold ``size`` tasks, the roomiest now first (then by name), at most
        ``DOMAINS_TRIED``, first each one's fewest children that could hold them together (a gang
        larger than a rack confined to a block's fewest racks), then each domain whole. ``could``
        and ``now``: each node's tasks once its preemptible work is gone, and now."""
        domains = self.domains
        nodes = {domains.chains[order][depth - 1] for order, _ in potential}
        fitting = [node for node in nodes if could[node] >= size]
        fitting.sort(key=lambda node: (-now[node], domains.path_name(node)))
        regions: list[tuple[int, ...]] = []
        for node in fitting[:DOMAINS_TRIED]:
            children = domains.children[node]
            if not children or not domains.children[children[0]]:
                continue  # its children are hosts: the search inside it picks them
            taken: list[int] = []
            total = 0
            for child in sorted(
                children, key=lambda child: (-could[child], -now[child], domains.names[child])
            ):
                if total >= size:
                    break
                taken.append(child)
                total += could[child]
            if len(taken) < len(children):
                regions.append(tuple(sorted(taken)))
        return regions + [(node,) for node in fitting[:DOMAINS_TRIED]]

    def _members(self, region: tuple[int, ...]) -> frozenset[str]:
        """The workers' ids of the domains of ``region``."""
        found: set[str] = set()
        for node in region:
            members = self._members_of.get(node)
            if members is None:
                members = self._members_of[node] = frozenset(
                    self.worker_ids[order] for order in self.domains.workers_in(node)
                )
            found |= members
        return frozenset(found)

    def _confined(
        self,
        preemptor: Preemptor,
        region: tuple[int, ...],
        room: Mapping[str, int],
        eligible: AbstractSet[str],
        trigger: Trigger,
        placed: _Placer,
    ) -> Option | None:
        """The search confined to the workers of ``region`` (domain nodes): its set and
        placements, or None."""
        members = self._members(region)
        inside = sorted(worker_id for worker_id in members if worker_id in eligible)
        room_inside = {worker_id: room[worker_id] for worker_id in inside if worker_id in room}
        shape = self.search.shape(preemptor.first, inside, trigger, domain=region)
        size = len(preemptor.tasks)
        failed = shape.failed_sizes.get(trigger.beneficiary)
        cut = shape.limited_sizes.get(trigger.beneficiary)
        if (failed is not None and size >= failed) or (cut is not None and size >= cut):
            return None
        found = self.search.find(preemptor, room_inside, shape, trigger)
        self.search.restore(shape, found.popped)
        if found.limited or found.missing > 0:
            return None
        return placed(preemptor, found.chosen, room_inside, inside)
