"""The cluster's topology and the domain-aware choice of where a gang's ranks go (API.md "Topology").

Workers declare their place with labels whose names ``CORRAL_TOPOLOGY_LEVELS`` lists from the
widest to the narrowest (default ``topology.block,topology.rack``); a host is its own, narrowest,
level. A worker's *path* is its label value at each level (None where it has no such label: then it
is a domain of its own at that level, since nothing says it shares a switch with anyone).

``choose`` answers, for a gang of ``size`` equal tasks and the tasks each worker has room for now,
which workers take how many tasks, in rank order:

1. the narrowest level at which one domain holds the whole gang wins (one host, else one rack, else
   one block), and among the domains of that level that hold it, the best fit: the least room, then
   the parents' least room (a gang fills the fullest rack of the fullest block, keeping large
   domains whole for the next), then the domain's name;
2. inside the domain it picked (or the whole cluster, when no single domain holds it), the gang
   spreads over the fewest children: the roomiest ones whole, the remainder into the child that
   best fits it, recursively by the same rule; over hosts the fullest go first instead (the best
   fit per task of before: a host left whole stays whole for a gang of whole-host tasks);
3. the ranks are numbered in the order the tasks were given out, so consecutive ranks share the
   narrowest domain (a ring all-reduce's neighbours sit together).

With ``required`` the domain picked in step 1 must be at that level or narrower; else ``choose``
gives None and ``closest`` names the domain of that level with the most room.

Pure and cheap: one tree of the workers that have room (not of the whole cluster), built per gang
that fits by count; a cluster with no topology label at all never gets here (the admission keeps
its id-order best fit, so its decisions stay exactly what they were).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from corral.domain.records import Worker

#: ``CORRAL_TOPOLOGY_LEVELS``' default: the widest level first
DEFAULT_LEVELS: tuple[str, ...] = ("topology.block", "topology.rack")

#: a worker's label value at each level, widest first (None: no such label)
Path = tuple[str | None, ...]


def parse_levels(text: str) -> tuple[str, ...]:
    """``CORRAL_TOPOLOGY_LEVELS`` as a tuple, widest first; empty names dropped; a name given twice
    is an error (the order would mean nothing)."""
    levels = tuple(part.strip() for part in text.split(",") if part.strip())
    if len(set(levels)) != len(levels):
        raise ValueError(f"topology levels name a level twice: {text!r}")
    return levels


def path_of(worker: Worker, levels: Sequence[str]) -> Path:
    """The worker's label value at each level, widest first."""
    labels = worker.labels
    return tuple(labels.get(level) for level in levels)


def sort_key(worker: Worker, levels: Sequence[str]) -> tuple[str, ...]:
    """The worker's place in topology order (widest level first; '' for a label it lacks): the
    admission orders workers so, then by id, wherever it breaks ties by worker order (best fit,
    the head of the queue's hold, reservations), so that what it keeps together shares racks."""
    labels = worker.labels
    return tuple(labels.get(level, "") for level in levels)


def labelled(workers: Iterable[Worker], levels: Sequence[str]) -> bool:
    """Whether any worker carries a topology label (else the placement ignores topology)."""
    return any(level in worker.labels for worker in workers for level in levels)


def domain_name(levels: Sequence[str], path: Path, depth: int) -> str:
    """A domain as people read it: ``topology.rack=r07`` (its level's label and value)."""
    return f"{levels[depth]}={path[depth]}"


class Domains:
    """The domains of a cycle's workers (from their paths, built once per cycle), searched per gang
    with the room each worker has for its tasks (``choose``, ``closest``).

    Nodes are numbered: 0 is the whole cluster, then the domains, then one leaf per worker (a
    host, the narrowest level). A gang's rooms are summed up each worker's chain of nodes into a
    flat list: the search then reads the rooms of the few domains it visits, never the tree whole.
    """

    def __init__(self, paths: Sequence[Path]) -> None:
        self.names: list[str] = [""]
        self.depths: list[int] = [0]
        self.parents: list[int] = [-1]
        self.orders: list[int] = [-1]
        self.children: list[list[int]] = [[]]
        #: per worker order, its nodes from the widest domain down to its own leaf (root left out)
        self.chains: list[tuple[int, ...]] = []
        index: dict[tuple[object, ...], int] = {}
        for order, path in enumerate(paths):
            chain = []
            parent = 0
            for depth, value in enumerate(path, start=1):
                name = value if value is not None else f"\0{order}"  # no label: a domain of its own
                key = (parent, name)
                node = index.get(key)
                if node is None:
                    node = index[key] = self._add(name, depth, parent, -1)
                chain.append(node)
                parent = node
            chain.append(self._add("", len(path) + 1, parent, order))
            self.chains.append(tuple(chain))
        for child_list in self.children:
            child_list.sort(key=lambda node: (self.names[node], self.orders[node]))

    def _add(self, name: str, depth: int, parent: int, order: int) -> int:
        node = len(self.names)
        self.names.append(name)
        self.depths.append(depth)
        self.parents.append(parent)
        self.orders.append(order)
        self.children.append([])
        self.children[parent].append(node)
        return node

    def rooms(self, units: Iterable[tuple[int, int]]) -> list[int]:
        """Each node's room: the tasks its workers have room for."""
        rooms = [0] * len(self.names)
        chains = self.chains
        total = 0
        for order, room in units:
            total += room
            for node in chains[order]:
                rooms[node] += room
        rooms[0] = total
        return rooms

    def choose(
        self, units: Iterable[tuple[int, int]], size: int, required: int | None = None
    ) -> list[tuple[int, int]] | None:
        """Where ``size`` tasks go (module docstring): (worker order, tasks) in rank order, or None
        when the workers' room does not hold them (inside one domain of level index ``required``,
        counted from the widest, when it is given)."""
        rooms = self.rooms(units)
        if rooms[0] < size:
            return None
        search = _Search(self, rooms)
        fitting = search.narrowest_fitting(0, size)
        if required is not None and (not fitting or self.depths[fitting[0]] < required + 1):
            return None
        if fitting:
            search.fill(min(fitting, key=search.fit_key), size)
        else:
            search.spread(0, size)
        return search.out

    def closest(self, units: Iterable[tuple[int, int]], level: int) -> tuple[int, int] | None:
        """The domain of level index ``level`` with the most room (its node, its room), the name
        breaking ties; None when no worker has room at all. A worker without the level's label
        is not a domain anyone else may join, so it is left out."""
        rooms = self.rooms(units)
        nodes = {chain[level] for chain in self.chains}
        candidates = [
            (-rooms[node], self.path_name(node), node)
            for node in nodes
            if rooms[node] > 0 and not self.names[node].startswith("\0")
        ]
        if not candidates:
            return None
        room, _, node = min(candidates)
        return node, -room

    def path_name(self, node: int) -> str:
        """The node's path as people read it: ``b1/r07``."""
        names = []
        while node > 0:
            names.append(self.names[node])
            node = self.parents[node]
        return "/".join(reversed(names))

    def workers_in(self, node: int) -> list[int]:
        """The worker orders below ``node``."""
        found: list[int] = []
        stack = [node]
        while stack:
            current = stack.pop()
            if self.orders[current] >= 0:
                found.append(self.orders[current])
            stack.extend(self.children[current])
        return sorted(found)


class _Search:
    """One gang's search over ``Domains`` with its rooms; the tasks given out gather in ``out``."""

    def __init__(self, domains: Domains, rooms: list[int]) -> None:
        self.domains = domains
        self.rooms = rooms
        self.out: list[tuple[int, int]] = []

    def fit_key(self, node: int) -> tuple[object, ...]:
        """Best fit among domains of one level: least room, then the parents' least room (fill
        the fullest rack of the fullest block), then the name (a leaf: the worker's order)."""
        domains, rooms = self.domains, self.rooms
        chain = []
        current = node
        while current >= 0:
            chain.append(rooms[current])
            current = domains.parents[current]
        return (*chain, domains.names[node], domains.orders[node])

    def narrowest_fitting(self, node: int, size: int) -> list[int]:
        """The nodes below ``node`` of the narrowest level at which any one holds ``size`` tasks
        (a domain holds them only if its parent does: the search goes down the fitting ones)."""
        rooms, children = self.rooms, self.domains.children
        found: list[int] = []
        level = [child for child in children[node] if rooms[child] >= size]
        while level:
            found = level
            level = [
                grandchild for child in level for grandchild in children[child] if rooms[grandchild] >= size
            ]
        return found

    def fill(self, node: int, size: int) -> None:
        domains = self.domains
        if not domains.children[node]:
            self.out.append((domains.orders[node], size))
            return
        fitting = self.narrowest_fitting(node, size)
        if fitting:
            self.fill(min(fitting, key=self.fit_key), size)
        else:
            self.spread(node, size)

    def spread(self, node: int, size: int) -> None:
        """``size`` tasks over the children of ``node`` (none of which holds them all): domains the
        roomiest first (the fewest of them), hosts the fullest first, each taken whole until the
        remainder fits one child, which is then the one that best fits it."""
        rooms, domains = self.rooms, self.domains
        children = [child for child in domains.children[node] if rooms[child] > 0]
        # hosts: the fullest first (the best fit per task of before), so whole hosts stay whole
        # for the gangs that need them; domains: the roomiest first (the fewest of them)
        hosts = bool(children) and not domains.children[children[0]]
        sign = 1 if hosts else -1
        rest = sorted(
            children, key=lambda child: (sign * rooms[child], domains.names[child], domains.orders[child])
        )
        left = size
        while left > 0:
            fits = [child for child in rest if rooms[child] >= left]
            if fits:
                self.fill(min(fits, key=self.fit_key), left)
                return
            child = rest.pop(0)
            self.take_all(child)
            left -= rooms[child]

    def take_all(self, node: int) -> None:
        domains, rooms = self.domains, self.rooms
        if rooms[node] <= 0:
            return
        if not domains.children[node]:
            self.out.append((domains.orders[node], rooms[node]))
            return
        for child in domains.children[node]:
            self.take_all(child)


def level_index(levels: Sequence[str], level: str) -> int:
    """The index of ``level`` among ``levels`` (widest first); ValueError for an unknown one."""
    return list(levels).index(level)


def group(workers: Iterable[Worker], levels: Sequence[str]) -> Mapping[Path, list[Worker]]:
    """Workers by their path (``corral workers`` shows them so), paths and ids in order."""
    grouped: dict[Path, list[Worker]] = {}
    for worker in sorted(workers, key=lambda worker: worker.id):
        grouped.setdefault(path_of(worker, levels), []).append(worker)
    return dict(sorted(grouped.items(), key=lambda item: tuple(value or "" for value in item[0])))
