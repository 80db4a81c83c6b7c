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
   best fits it, recursively by the same rule;
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


def labelled(workers: Iterable[Worker], levels: Sequence[str]) -> bool:
    """Whether any worker carries a topology label (else the placement ignores topology)."""
    return any(level in worker.labels for worker in workers for level in levels)


def domain_name(levels: Sequence[str], path: Path, depth: int) -> str:
    """A domain as people read it: ``topology.rack=r07`` (its level's label and value)."""
    value = path[depth]
    return f"{levels[depth]}={value}"


class _Node:
    """A domain (or a host, a leaf) with the room its workers have for the gang's tasks."""

    __slots__ = ("children", "depth", "index", "name", "order", "parent", "room")

    def __init__(self, name: str, depth: int, parent: _Node | None, order: int = -1) -> None:
        self.name = name
        self.depth = depth  # 0: the whole cluster; 1..levels: the levels; levels + 1: a host
        self.parent = parent
        self.order = order  # the worker's order, for a leaf
        self.room = 0
        self.children: list[_Node] = []
        self.index: dict[str, _Node] = {}

    def fit_key(self) -> tuple[object, ...]:
        """Best fit among domains of one level: least room, then the parents' least room, then
        the name (a leaf: the worker's order, the id tie-break)."""
        rooms: list[int] = []
        node: _Node | None = self
        while node is not None:
            rooms.append(node.room)
            node = node.parent
        return (*rooms, self.name, self.order)


def _tree(units: Iterable[tuple[int, int]], paths: Sequence[Path]) -> _Node:
    """The domains of the workers in ``units`` ((order, tasks it has room for)), with their room."""
    root = _Node("", 0, None)
    for order, room in units:
        node = root
        node.room += room
        for depth, value in enumerate(paths[order], start=1):
            key = value if value is not None else f"\0{order}"  # no label: a domain of its own
            child = node.index.get(key)
            if child is None:
                child = node.index[key] = _Node(key, depth, node)
                node.children.append(child)
            child.room += room
            node = child
        leaf = _Node("", node.depth + 1, node, order)
        leaf.room = room
        node.children.append(leaf)
    return root


def choose(
    units: Iterable[tuple[int, int]], paths: Sequence[Path], size: int, required: int | None = None
) -> list[tuple[int, int]] | None:
    """Where ``size`` tasks go (module docstring): (worker order, tasks) in rank order, or None
    when the workers' room does not hold them (inside one domain of level index ``required``,
    counted from the widest, when it is given)."""
    root = _tree(units, paths)
    if root.room < size:
        return None
    fitting = _narrowest_fitting(root, size)
    if required is not None and (not fitting or fitting[0].depth < required + 1):
        return None
    out: list[tuple[int, int]] = []
    if fitting:
        _fill(min(fitting, key=_Node.fit_key), size, out)
    else:
        _spread(root, size, out)
    return out


def closest(units: Iterable[tuple[int, int]], paths: Sequence[Path], level: int) -> tuple[Path, int] | None:
    """The domain of level index ``level`` with the most room (a path down to it, its room), the
    name breaking ties; None when no worker has room at all."""
    rooms: dict[Path, int] = {}
    for order, room in units:
        path = paths[order]
        if path[level] is None:
            continue
        key = path[: level + 1]
        rooms[key] = rooms.get(key, 0) + room
    if not rooms:
        return None
    best = min(rooms, key=lambda key: (-rooms[key], tuple(value or "" for value in key)))
    return best, rooms[best]


def _narrowest_fitting(node: _Node, size: int) -> list[_Node]:
    """The domains below ``node`` of the narrowest level at which any one holds ``size`` tasks
    (a domain holds them only if its parent does: the search goes down the fitting ones alone)."""
    found: list[_Node] = []
    level = [child for child in node.children if child.room >= size]
    while level:
        found = level
        level = [grandchild for child in level for grandchild in child.children if grandchild.room >= size]
    return found


def _fill(node: _Node, size: int, out: list[tuple[int, int]]) -> None:
    if not node.children:
        out.append((node.order, size))
        return
    fitting = _narrowest_fitting(node, size)
    if fitting:
        _fill(min(fitting, key=_Node.fit_key), size, out)
    else:
        _spread(node, size, out)


def _spread(node: _Node, size: int, out: list[tuple[int, int]]) -> None:
    """``size`` tasks over the fewest children of ``node`` (none of which holds them all): the
    roomiest whole, then the remainder into the child that best fits it."""
    rest = sorted(node.children, key=lambda child: (-child.room, child.name, child.order))
    left = size
    while left > 0:
        fits = [child for child in rest if child.room >= left]
        if fits:
            _fill(min(fits, key=_Node.fit_key), left, out)
            return
        child = rest.pop(0)
        _take_all(child, out)
        left -= child.room


def _take_all(node: _Node, out: list[tuple[int, int]]) -> None:
    if not node.children:
        if node.room > 0:
            out.append((node.order, node.room))
        return
    for child in sorted(node.children, key=lambda child: (child.name, child.order)):
        _take_all(child, out)


def level_index(levels: Sequence[str], level: str) -> int:
    """The index of ``level`` among ``levels`` (widest first); ValueError for an unknown one."""
    return list(levels).index(level)


def group(workers: Iterable[Worker], levels: Sequence[str]) -> Mapping[Path, list[Worker]]:
    """Workers by their path (``corral workers`` shows them so), paths and ids in order."""
    grouped: dict[Path, list[Worker]] = {}
    for worker in sorted(workers, key=lambda worker: worker.id):
        grouped.setdefault(path_of(worker, levels), []).append(worker)
    return dict(sorted(grouped.items(), key=lambda item: tuple(value or "" for value in item[0])))
