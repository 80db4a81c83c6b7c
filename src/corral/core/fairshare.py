"""Hierarchical fair share and starvation (seed 002; ``shared/reference/semantics.md`` B.2-B.5;
DESIGN.md "Preemption: corral's choices"). Pure: pools, usage and the cluster's size in, shares out.

**Shares.** Every quantity is a fraction of the cluster (the usable workers' GPUs, CPUs and memory):
a ``Share`` holds one per resource, and its *dominant* share is the largest. A pool's ``demand`` is
what its jobs hold plus what they wait for; its ``usage`` what they hold.

**Fair share** is the classic water-filling of seed 002's source, on dominant shares, from the root
down: a pool with fair share ``F`` gives each child ``min(u, max(l, x * w))``, with ``x`` chosen so
the children's shares add up to ``F`` (or to all they ask for, when that is less). ``w`` is the
child's weight, ``l`` its guarantee (never more than it asks for; guarantees that add up to more
than ``F`` are scaled down together), ``u`` its demand capped by its limits. So a pool never gets
more than it asks for, and what one child leaves flows to its siblings by weight. A pool that has
both jobs of its own and child pools gives its own jobs a share as if they were one more child of
weight 1 (YTsaurus keeps jobs in leaves only; corral lets a job name any pool).

A pool's fair share is a dominant share; per resource it is its demand's shape scaled to it
(``fair``): a pool is entitled to resources in the proportion it asks for them.

**Below fair share** (B.3, the code's form): usage under ``tolerance x fair`` (capped at demand) on
every resource whose demand the fair share does not cover yet; when it covers all of them, on any.

**Starvation** (B.4): below fair share for ``starvation_timeout_s`` -> starving; for
``aggressive_starvation_timeout_s``, where the pool enables it, aggressively starving; back to normal
resets the timer. A pool at exactly ``tolerance x fair`` is not below: it does not flap.

**Preemptible groups** (B.5, the prefix rule): a leaf's allocations, oldest first; the allocation
whose *preceding* allocations hold less than ``aggressive threshold x fair`` is non-preemptible,
less than ``threshold x fair`` aggressively preemptible, otherwise preemptible. The allocation that
crosses a bound is in the less preemptible group (B.9 5: the default of the source), so taking
preemptible allocations never leaves a leaf below its fair share.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from corral.core.placement import usable
from corral.domain.pools import (
    NOT_STARVING,
    Pool,
    PoolUsage,
    Starvation,
    StarvationState,
    ancestors,
    is_within,
    parent_of,
)
from corral.domain.records import Reason, Worker
from corral.domain.resources import Resources

__all__ = [
    "FairShares",
    "Group",
    "PoolShare",
    "Share",
    "below_fair_share",
    "compute",
    "describe",
    "dominant",
    "explain",
    "preemptible_groups",
    "share_of",
    "starvation",
    "update_starvation",
]

#: the resources fair share divides (VRAM is per GPU: compared, never shared out)
SHARED = ("gpus", "cpus", "memory_mb")
#: one fraction of the cluster per resource of ``SHARED``
Share = tuple[float, float, float]
NOTHING: Share = (0.0, 0.0, 0.0)
#: bisection steps of the water-filling: far below a GPU's share on any real cluster
_STEPS = 60


def share_of(resources: Resources, total: Resources) -> Share:
    """``resources`` as fractions of ``total``, each at most 1 (a limit may be "unlimited")."""
    return (
        min(1.0, resources.gpus / total.gpus) if total.gpus > 0 else 0.0,
        min(1.0, resources.cpus / total.cpus) if total.cpus > 0 else 0.0,
        min(1.0, resources.memory_mb / total.memory_mb) if total.memory_mb > 0 else 0.0,
    )


def dominant(share: Share) -> float:
    return max(share)


def _plus(left: Share, right: Share) -> Share:
    return (left[0] + right[0], left[1] + right[1], left[2] + right[2])


def _scaled(share: Share, factor: float) -> Share:
    return (share[0] * factor, share[1] * factor, share[2] * factor)


@dataclass(frozen=True, slots=True)
class PoolShare:
    """One pool's (or one pool's own jobs') place in the fair share."""

    path: str
    #: the dominant share it is entitled to, 0..1
    fair_share: float
    #: ``fair_share`` per resource (its demand's shape)
    fair: Share
    usage: Share
    #: usage plus what its jobs wait for
    demand: Share
    tolerance: float

    @property
    def satisfaction(self) -> float | None:
        """Usage over fair share (dominant shares); None for a pool that asks for nothing."""
        if self.fair_share <= 0:
            return None
        return dominant(self.usage) / self.fair_share

    @property
    def below(self) -> bool:
        return below_fair_share(self.usage, self.fair, self.demand, self.tolerance)


def below_fair_share(usage: Share, fair: Share, demand: Share, tolerance: float) -> bool:
    """B.3: usage strictly under ``min(tolerance x fair, demand)`` on every resource whose demand
    the fair share does not cover yet (on any resource, when it covers them all)."""
    if dominant(demand) <= 0:
        return False
    bound = tuple(min(fair[index] * tolerance, demand[index]) for index in range(3))
    open_resources = [index for index in range(3) if fair[index] < demand[index]]
    if not open_resources:
        return any(bound[index] > usage[index] for index in range(3))
    return all(bound[index] > usage[index] for index in open_resources)


@dataclass(frozen=True, slots=True)
class FairShares:
    """The cycle's fair shares: ``pools`` by path (each pool's whole subtree), ``own`` the part of
    a pool's own jobs (the same as ``pools`` for a pool without children), ``total`` the cluster."""

    total: Resources
    pools: Mapping[str, PoolShare] = field(default_factory=dict)
    own: Mapping[str, PoolShare] = field(default_factory=dict)

    def share(self, resources: Resources) -> Share:
        return share_of(resources, self.total)


@dataclass(slots=True)
class _Node:
    path: str
    pool: Pool
    #: what the pool's own jobs hold and hold plus wait for
    own_usage: Share
    own_demand: Share
    children: list[_Node] = field(default_factory=list)
    #: the same for its whole subtree (``_sum_up``)
    usage: Share = NOTHING
    demand: Share = NOTHING


def compute(pools: Mapping[str, Pool], own_usage: Mapping[str, PoolUsage], total: Resources) -> FairShares:
    """Every pool's fair share (module docstring). ``pools``: the resolved tree
    (``corral.domain.pools.resolve``); a path ``own_usage`` names that is not there counts as a
    pool with the default settings under its nearest ancestor."""
    paths = set(pools) | {ancestor for path in own_usage for ancestor in [*ancestors(path), path]}
    nodes: dict[str, _Node] = {}
    for path in sorted(paths):
        pool = pools.get(path) or Pool(path=path, parent=parent_of(path))
        usage = own_usage.get(path, PoolUsage())
        held = share_of(usage.held, total)
        nodes[path] = _Node(path, pool, held, _plus(held, share_of(usage.demand, total)))
    roots: list[_Node] = []
    for path, node in nodes.items():
        parent = parent_of(path)
        (nodes[parent].children if parent is not None else roots).append(node)
    for root in roots:
        _sum_up(root)
    subtree: dict[str, PoolShare] = {}
    own: dict[str, PoolShare] = {}
    _distribute(roots, 1.0, total, subtree, own)
    return FairShares(total, subtree, own)


def _sum_up(node: _Node) -> None:
    node.usage, node.demand = node.own_usage, node.own_demand
    for child in node.children:
        _sum_up(child)
        node.usage, node.demand = _plus(node.usage, child.usage), _plus(node.demand, child.demand)


def _within(demand: Share, limits: Share) -> float:
    """The largest dominant share of ``demand``'s shape within ``limits`` on every resource (a
    resource left unlimited is a share of 1 and must not lift the cap of a limited one)."""
    peak = dominant(demand)
    return min([peak, *(peak * limits[index] / demand[index] for index in range(3) if demand[index] > 0)])


@dataclass(frozen=True, slots=True)
class Claim:
    """One child's terms in the water-filling: its weight, its guarantee and its cap (dominant)."""

    weight: float
    lower: float
    upper: float


def _distribute(
    nodes: Sequence[_Node],
    given: float,
    total: Resources,
    subtree: dict[str, PoolShare],
    own: dict[str, PoolShare],
) -> None:
    """Share ``given`` among ``nodes`` (siblings), then each node's share among its children (and
    its own jobs, as one more child of weight 1)."""
    claims: list[Claim] = []
    for node in nodes:
        upper = dominant(node.demand)
        if node.pool.limits is not None:
            upper = min(upper, _within(node.demand, share_of(node.pool.limits, total)))
        lower = min(dominant(share_of(node.pool.guarantee, total)), upper)
        claims.append(Claim(max(node.pool.weight, 1e-9), lower, upper))
    for node, fair_share in zip(nodes, water_fill(claims, given), strict=True):
        subtree[node.path] = _pool_share(node.path, fair_share, node.usage, node.demand, node.pool)
        if not node.children:
            own[node.path] = subtree[node.path]
            continue
        parts = list(node.children)
        own_jobs = dominant(node.own_demand) > 0
        if own_jobs:  # a leaf of its own jobs beside the children: default settings, weight 1
            parts.append(_Node(node.path, Pool(path=node.path, parent=None), node.own_usage, node.own_demand))
            parts[-1].usage, parts[-1].demand = node.own_usage, node.own_demand
        inner: dict[str, PoolShare] = {}
        _distribute(parts, fair_share, total, inner, own)
        subtree.update((path, share) for path, share in inner.items() if path != node.path)
        own_share = inner[node.path].fair_share if own_jobs else 0.0
        own[node.path] = _pool_share(node.path, own_share, node.own_usage, node.own_demand, node.pool)


def _pool_share(path: str, fair_share: float, usage: Share, demand: Share, pool: Pool) -> PoolShare:
    peak = dominant(demand)
    fair = _scaled(demand, min(1.0, fair_share / peak)) if peak > 0 else NOTHING
    return PoolShare(path, fair_share, fair, usage, demand, pool.starvation_tolerance)


def water_fill(claims: Sequence[Claim], given: float) -> list[float]:
    """``min(upper, max(lower, x * weight))`` per claim, with ``x`` such that they add up to
    ``given``, or to every upper bound when those add up to less. Guarantees adding up to more
    than ``given`` are scaled down together."""
    if not claims:
        return []
    target = min(given, sum(claim.upper for claim in claims))
    lowers = sum(claim.lower for claim in claims)
    if target <= lowers:
        scale = target / lowers if lowers > 0 else 0.0
        return [claim.lower * scale for claim in claims]

    def filled(x: float) -> float:
        return sum(min(claim.upper, max(claim.lower, x * claim.weight)) for claim in claims)

    low, high = 0.0, max(claim.upper / claim.weight for claim in claims)
    for _ in range(_STEPS):
        middle = (low + high) / 2
        if filled(middle) < target:
            low = middle
        else:
            high = middle
    return [min(claim.upper, max(claim.lower, high * claim.weight)) for claim in claims]


# --- starvation ------------------------------------------------------------------------------


def starvation(previous: StarvationState, below: bool, pool: Pool, now: float) -> StarvationState:
    """B.4: the pool's state this cycle, from its last one and whether it is below its fair share."""
    if not below:
        return NOT_STARVING
    if previous.below_since is None:
        return StarvationState(previous.status, now, previous.since)
    waited = now - previous.below_since
    status = previous.status
    if pool.enable_aggressive_starvation and waited >= pool.aggressive_starvation_timeout_s:
        status = Starvation.AGGRESSIVELY_STARVING
    elif waited >= pool.starvation_timeout_s and status == Starvation.NON_STARVING:
        status = Starvation.STARVING
    since = previous.since if status == previous.status else now
    return StarvationState(status, previous.below_since, since)


def update_starvation(
    previous: Mapping[str, StarvationState], shares: FairShares, pools: Mapping[str, Pool], now: float
) -> dict[str, StarvationState]:
    """Every pool's state this cycle; pools that are not below their fair share are left out (they
    are not starving and have no timer running)."""
    states: dict[str, StarvationState] = {}
    for path, share in shares.pools.items():
        pool = pools.get(path) or Pool(path=path, parent=parent_of(path))
        state = starvation(previous.get(path, NOT_STARVING), share.below, pool, now)
        if state != NOT_STARVING:
            states[path] = state
    return states


# --- preemptible groups ----------------------------------------------------------------------


class Group(IntEnum):
    """How freely an allocation of a leaf may be preempted for fair share (B.5)."""

    NON_PREEMPTIBLE = 0
    AGGRESSIVELY_PREEMPTIBLE = 1
    PREEMPTIBLE = 2


def preemptible_groups(
    allocations: Iterable[tuple[str, Resources]],
    leaf: PoolShare,
    total: Resources,
    aggressive_threshold: float,
    threshold: float,
) -> dict[str, Group]:
    """The group of each of a leaf's allocations (key, resources), given oldest first: the prefix
    rule of the module docstring, against ``leaf``'s fair share. The prefix only grows, so the
    groups only go up along the list."""
    open_resources = [index for index in range(3) if leaf.fair[index] < leaf.demand[index]]
    bounds = (
        (Group.NON_PREEMPTIBLE, _scaled(leaf.fair, aggressive_threshold)),
        (Group.AGGRESSIVELY_PREEMPTIBLE, _scaled(leaf.fair, threshold)),
    )
    held = NOTHING
    level = 0
    groups: dict[str, Group] = {}
    for key, resources in allocations:
        while level < len(bounds) and not _under(held, bounds[level][1], open_resources):
            level += 1
        groups[key] = bounds[level][0] if level < len(bounds) else Group.PREEMPTIBLE
        if level < len(bounds):
            held = _plus(held, share_of(resources, total))
    return groups


def _under(held: Share, bound: Share, open_resources: Sequence[int]) -> bool:
    """``held`` strictly under ``bound`` on every resource whose demand the leaf's fair share does
    not cover (``open_resources``; on any, when it covers them all): B.5's
    ``StrictlyDominatesNonBlocked``."""
    if not open_resources:
        return any(bound[index] > held[index] for index in range(3))
    return all(bound[index] > held[index] for index in open_resources)


# --- the planner's view ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FairShareState:
    """What the preemption planner reads of fair share: this cycle's shares, every pool's
    starvation (a pool absent is not starving), and the resolved pools."""

    shares: FairShares
    starvation: Mapping[str, StarvationState]
    pools: Mapping[str, Pool]

    def starving_pools(self) -> list[str]:
        """The pools starving (aggressively or not), in path order."""
        return sorted(
            path for path, state in self.starvation.items() if state.status != Starvation.NON_STARVING
        )

    def anyone_starving(self) -> bool:
        return any(state.status != Starvation.NON_STARVING for state in self.starvation.values())


class Books:
    """One plan's running account of the pools' usage. The preemptions and placements of a cycle
    move usage from the victims' pools to the preemptors' as they are decided, so one cycle never
    takes more for a pool than brings it to its fair share, nor leaves a victim's pool below the
    share that protects it: applying a plan and planning again takes nothing more."""

    def __init__(self, state: FairShareState, placed: Iterable[tuple[str, Resources]] = ()) -> None:
        self.state = state
        self.usage = {path: share.usage for path, share in state.shares.pools.items()}
        #: the same for each pool's own jobs (``FairShares.own``)
        self.own = {path: share.usage for path, share in state.shares.own.items()}
        #: ``may_take_from``'s answers since the usage last moved
        self._allowed: dict[tuple[str, str, bool, Resources | None], bool] = {}
        for pool, resources in placed:
            self.add(pool, resources)

    def add(self, pool: str, resources: Resources, sign: int = 1) -> None:
        """``resources`` start (``sign`` 1) or stop (-1) in ``pool``: its usage and its ancestors'."""
        moved = _scaled(share_of(resources, self.state.shares.total), sign)
        self._allowed.clear()
        for path in [*ancestors(pool), pool]:
            if path in self.usage:
                self.usage[path] = _plus(self.usage[path], moved)
        if pool in self.own:
            self.own[pool] = _plus(self.own[pool], moved)

    def below(self, path: str) -> bool:
        share = self.state.shares.pools.get(path)
        if share is None:
            return False
        return below_fair_share(self.usage[path], share.fair, share.demand, share.tolerance)

    def beneficiary(self, pool: str, aggressive: bool) -> str | None:
        """The pool a job of ``pool`` would preempt for: the lowest of ``pool`` and its ancestors
        that is starving (aggressively, for the aggressive stage) and still below its fair share
        with this cycle's placements counted; None when there is none."""
        for path in reversed([*ancestors(pool), pool]):
            status = self.state.starvation.get(path, NOT_STARVING).status
            wanted = (
                status == Starvation.AGGRESSIVELY_STARVING
                if aggressive
                else status != Starvation.NON_STARVING
            )
            if wanted and self.below(path):
                return path
        return None

    def may_take_from(
        self,
        victim_pool: str,
        beneficiary: str,
        aggressive: bool,
        thresholds: tuple[float, float],
        taking: Resources | None = None,
    ) -> bool:
        """Whether an allocation of ``victim_pool`` (``taking``: its resources) may be preempted for
        ``beneficiary``: no pool on the way up from it to their common ancestor is starving or is
        left under its satisfaction threshold once it has gone (``thresholds``: aggressive,
        regular; the aggressive one where the stage is and the pool allows aggressive preemption),
        nor are the victim pool's own jobs (also when the move stays inside that pool: from its
        own jobs to a child). Taking from inside the beneficiary would not help it. The answers
        are kept until the usage moves (many units of one pool are judged in a cycle)."""
        key = (victim_pool, beneficiary, aggressive, taking)
        allowed = self._allowed.get(key)
        if allowed is None:
            allowed = self._allowed[key] = self._may_take_from(
                victim_pool, beneficiary, aggressive, thresholds, taking
            )
        return allowed

    def _may_take_from(
        self,
        victim_pool: str,
        beneficiary: str,
        aggressive: bool,
        thresholds: tuple[float, float],
        taking: Resources | None,
    ) -> bool:
        if is_within(victim_pool, beneficiary):
            return False
        gone = _scaled(share_of(taking or Resources(), self.state.shares.total), -1)
        own = self.state.shares.own.get(victim_pool)
        if own is not None and own.fair_share > 0 and victim_pool in self.own:
            bound = self._bound(victim_pool, aggressive, thresholds)
            if dominant(_plus(self.own[victim_pool], gone)) < bound * own.fair_share * (1 - _EPSILON):
                return False
        for path in reversed([*ancestors(victim_pool), victim_pool]):
            if is_within(beneficiary, path):
                break  # the common ancestor: the move stays inside it
            if self.state.starvation.get(path, NOT_STARVING).status != Starvation.NON_STARVING:
                return False
            share = self.state.shares.pools.get(path)
            if share is None or share.fair_share <= 0:
                continue
            bound = self._bound(path, aggressive, thresholds)
            if dominant(_plus(self.usage[path], gone)) < bound * share.fair_share * (1 - _EPSILON):
                return False
        return True

    def _bound(self, path: str, aggressive: bool, thresholds: tuple[float, float]) -> float:
        """The satisfaction threshold that protects ``path``: the aggressive one where the stage is
        and the pool allows aggressive preemption."""
        pool = self.state.pools.get(path)
        allows = pool is None or pool.allow_aggressive_preemption
        return thresholds[0] if aggressive and allows else thresholds[1]


#: shares are floats: a pool at its threshold to the last bit is at it
_EPSILON = 1e-9


def preemptible_units(
    units: Iterable[tuple[str, str, float, Resources]],
    state: FairShareState,
    aggressive_threshold: float,
    threshold: float,
) -> dict[str, Group]:
    """Every allocation's group: ``units`` are (key, pool, started at, resources), a gang as one
    unit. Per pool's own jobs, oldest first (then by key), the prefix rule against the own part's
    fair share; where the pool does not allow aggressive preemption, its aggressively preemptible
    allocations are non-preemptible."""
    by_pool: dict[str, list[tuple[float, str, Resources]]] = {}
    for key, pool, started_at, resources in units:
        by_pool.setdefault(pool, []).append((started_at, key, resources))
    groups: dict[str, Group] = {}
    for pool, allocations in by_pool.items():
        leaf = state.shares.own.get(pool)
        if leaf is None:
            continue
        ordered = [(key, resources) for _, key, resources in sorted(allocations)]
        found = preemptible_groups(ordered, leaf, state.shares.total, aggressive_threshold, threshold)
        settings = state.pools.get(pool)
        if settings is not None and not settings.allow_aggressive_preemption:
            found = {
                key: Group.NON_PREEMPTIBLE if group == Group.AGGRESSIVELY_PREEMPTIBLE else group
                for key, group in found.items()
            }
        groups.update(found)
    return groups


def describe(path: str, state: FairShareState, now: float | None = None) -> str:
    """A pool's share, usage and starvation timer, in words (``why``, the planner's reasons)."""
    share = state.shares.pools.get(path)
    if share is None:
        return f"pool {path} has no fair share yet"
    starving = state.starvation.get(path, NOT_STARVING)
    total = state.shares.total
    words = (
        f"pool {path}: fair share {share.fair_share:.1%} of the cluster ({share.fair[0] * total.gpus:.1f}"
        f" GPUs), using {dominant(share.usage):.1%} ({share.usage[0] * total.gpus:.0f} GPUs)"
    )
    if starving.below_since is None:
        return words + ", not below its fair share"
    pool = state.pools.get(path) or Pool(path=path, parent=parent_of(path))
    below = f"below {share.tolerance:g} x its fair share since t={starving.below_since:.0f}"
    if now is not None:
        below = f"below {share.tolerance:g} x its fair share for {now - starving.below_since:.0f} s"
    if starving.status == Starvation.NON_STARVING:
        return f"{words}, {below} (starving after {pool.starvation_timeout_s:g} s)"
    return f"{words}, {starving.status.value.replace('_', ' ')}, {below}"


def explain(pool: str, state: FairShareState, now: float) -> Reason | None:
    """Why fair share has (not yet) come to a waiting job's help: its pool's (or the lowest
    ancestor's) timer and share; None when no pool on its path is below its fair share."""
    for path in reversed([*ancestors(pool), pool]):
        if state.starvation.get(path, NOT_STARVING).below_since is not None:
            return Reason("fair_share", describe(path, state, now))
    return None


def cluster_of(workers: Iterable[Worker]) -> Resources:
    """What fair share divides: the resources of the workers work may be placed on."""
    total = Resources()
    for worker in workers:
        if usable(worker):
            total = total + worker.resources
    return total


def cycle_state(
    pools: Mapping[str, Pool],
    own_usage: Mapping[str, PoolUsage],
    total: Resources,
    previous: Mapping[str, StarvationState],
    now: float,
) -> FairShareState:
    """One cycle's fair share: the shares on the cluster's ``total`` (its usable workers), and each
    pool's starvation moved on from ``previous`` (the last cycle's) to ``now``."""
    shares = compute(pools, own_usage, total)
    return FairShareState(shares, update_starvation(previous, shares, pools, now), pools)
