"""Pools: the fair-share tree (seed 002), its settings and how they are inherited. Pure, no I/O.

A pool is a path ``team/project``; ``a/b/c`` implies ``a/b`` and ``a`` (its ancestors), whether or
not they were ever configured. ``default`` is the root-level pool of every job that names none and
always exists. What ``PUT /pools/{path}`` stores is a ``PoolSettings`` (every field optional: None
inherits); what the scheduler reads is the effective ``Pool`` that ``resolve`` computes.

Inheritance (DESIGN.md "Preemption: corral's choices": timers and the aggressive switches are
"inherited down the tree"):

- ``weight``, ``guarantee`` and ``limits`` belong to the pool that sets them and are never
  inherited: a child does not receive its parent's weight, and a guarantee or a limit is shared by
  the subtree, not copied into each child. Unset: weight 1.0, guarantee 0, no limit.
- ``mode``, ``kind``, the starvation timers and tolerance, ``enable_aggressive_starvation``,
  ``allow_aggressive_preemption``, ``default_walltime_s`` and ``max_walltime_s`` are inherited:
  a pool that does not set one takes its parent's effective value, a root pool the server's
  ``PoolDefaults``. This includes ``kind``: a child of a ``sensitive`` pool is sensitive unless it
  sets a kind of its own, so a team cannot lose the protection of its parent by forgetting to
  repeat it.

A resolved pool's ``aggressive_starvation_timeout_s`` is never below its ``starvation_timeout_s``
(a PUT refuses both set that way; one set and the other inherited may cross, and the later of the
two then wins): aggressive starvation is a stage of starvation.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TypeVar

from corral.domain.records import Reason
from corral.domain.resources import Resources

DEFAULT_POOL = "default"
#: a limit on a resource the pool does not limit (``limits={"gpus": 16}`` leaves memory free):
#: larger than any request a job may make (``protocol.models.INT32_MAX``), so comparisons need no
#: special case; shown as null on the wire
UNLIMITED = 2**31 - 1
_PATH = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*")
MAX_PATH_LENGTH = 256
T = TypeVar("T")
PATH_RULE = "a path like team/project (segments of letters, digits, _ . - joined by /; not . or ..)"


class PoolKind(StrEnum):
    """Per-vCluster policy of seed 003 (what the preemption planner may do to a pool's jobs)."""

    BATCH = "batch"
    TRAINING = "training"
    SERVICE = "service"
    SENSITIVE = "sensitive"
    INTERACTIVE = "interactive"


class PoolMode(StrEnum):
    """How a pool orders its own jobs: by fair share among its children, or first come first served."""

    FAIR_SHARE = "fair_share"
    FIFO = "fifo"


def check_path(path: str) -> str:
    """``path`` when it is a pool path; ``ValueError`` otherwise (the one path rule of corral: the
    submit body, the pool routes and the store all go through here)."""
    # "." and ".." would be walked away by every URL normaliser: such a pool could not be addressed
    if not _PATH.fullmatch(path) or {".", ".."} & set(path.split("/")):
        raise ValueError(f"pool must be {PATH_RULE}")
    if len(path) > MAX_PATH_LENGTH:
        raise ValueError(f"pool must be at most {MAX_PATH_LENGTH} characters")
    return path


def parent_of(path: str) -> str | None:
    """``a/b`` -> ``a``; a root-level pool has no parent."""
    head, separator, _ = path.rpartition("/")
    return head if separator else None


def ancestors(path: str) -> list[str]:
    """``a/b/c`` -> ``["a", "a/b"]``: every pool ``path`` implies, root first."""
    parts = path.split("/")
    return ["/".join(parts[:depth]) for depth in range(1, len(parts))]


def tree_order(path: str) -> tuple[str, ...]:
    """Sort key of a depth-first walk: each pool right before its subtree (plain string order
    would put ``team-b`` between ``team`` and ``team/x``)."""
    return tuple(path.split("/"))


def with_ancestors(paths: Iterable[str]) -> list[str]:
    """The paths and every ancestor of one, each once, parents before children (for inserts that
    make the tree explicit, and for walking it top down)."""
    every = {ancestor for path in paths for ancestor in [*ancestors(path), path]}
    return sorted(every, key=lambda path: (path.count("/"), path))


def is_within(path: str, root: str) -> bool:
    """``path`` is ``root`` or one of its descendants."""
    return path == root or path.startswith(root + "/")


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """What one ``PUT /pools/{path}`` stores. Every field None means "inherit / the default"."""

    weight: float | None = None
    guarantee: Resources | None = None
    #: a resource not limited is ``UNLIMITED``; None: no limit at all
    limits: Resources | None = None
    mode: PoolMode | None = None
    kind: PoolKind | None = None
    starvation_timeout_s: float | None = None
    aggressive_starvation_timeout_s: float | None = None
    starvation_tolerance: float | None = None
    enable_aggressive_starvation: bool | None = None
    allow_aggressive_preemption: bool | None = None
    #: the ``walltime_s`` a job of the subtree gets when it sets none, and the most it may set
    default_walltime_s: float | None = None
    max_walltime_s: float | None = None


@dataclass(frozen=True, slots=True)
class PoolDefaults:
    """The values a root pool inherits when it sets none (the server's ``CORRAL_STARVATION_*``
    settings; the rest are the seeds' defaults)."""

    mode: PoolMode = PoolMode.FAIR_SHARE
    kind: PoolKind = PoolKind.BATCH
    starvation_timeout_s: float = 30.0
    aggressive_starvation_timeout_s: float = 120.0
    starvation_tolerance: float = 0.8
    enable_aggressive_starvation: bool = False
    allow_aggressive_preemption: bool = True
    #: ``CORRAL_DEFAULT_WALLTIME_S`` and ``CORRAL_MAX_WALLTIME_S`` (None: no limit, no maximum)
    default_walltime_s: float | None = None
    max_walltime_s: float | None = None


@dataclass(frozen=True, slots=True)
class Pool:
    """A pool as the scheduler reads it: every setting resolved (see the module docstring)."""

    path: str
    parent: str | None
    weight: float = 1.0
    guarantee: Resources = field(default_factory=Resources)
    #: None: unlimited; a resource the limit leaves free is ``UNLIMITED``
    limits: Resources | None = None
    mode: PoolMode = PoolMode.FAIR_SHARE
    kind: PoolKind = PoolKind.BATCH
    starvation_timeout_s: float = 30.0
    aggressive_starvation_timeout_s: float = 120.0
    starvation_tolerance: float = 0.8
    enable_aggressive_starvation: bool = False
    allow_aggressive_preemption: bool = True
    #: the ``walltime_s`` a job that sets none gets, and the most a job may set (None: none)
    default_walltime_s: float | None = None
    max_walltime_s: float | None = None
    #: a row exists for it (False: implied by a descendant, or a job's pool without a row)
    explicit: bool = False


def _own(value: T | None, inherited: T) -> T:
    return inherited if value is None else value


def _inherit(path: str, parent: Pool | PoolDefaults, own: PoolSettings | None, explicit: bool) -> Pool:
    """The effective pool at ``path`` under ``parent`` (a pool, or the defaults for a root)."""
    own = own or PoolSettings()
    starvation = _own(own.starvation_timeout_s, parent.starvation_timeout_s)
    aggressive = _own(own.aggressive_starvation_timeout_s, parent.aggressive_starvation_timeout_s)
    return Pool(
        path=path,
        parent=parent.path if isinstance(parent, Pool) else None,
        weight=_own(own.weight, 1.0),
        guarantee=_own(own.guarantee, Resources()),
        limits=own.limits,
        mode=_own(own.mode, parent.mode),
        kind=_own(own.kind, parent.kind),
        starvation_timeout_s=starvation,
        # a pool that sets only a longer starvation timeout than the aggressive one it inherits
        # becomes aggressively starving when it starts starving, never before
        aggressive_starvation_timeout_s=max(aggressive, starvation),
        starvation_tolerance=_own(own.starvation_tolerance, parent.starvation_tolerance),
        enable_aggressive_starvation=_own(
            own.enable_aggressive_starvation, parent.enable_aggressive_starvation
        ),
        allow_aggressive_preemption=_own(own.allow_aggressive_preemption, parent.allow_aggressive_preemption),
        default_walltime_s=_own(own.default_walltime_s, parent.default_walltime_s),
        max_walltime_s=_own(own.max_walltime_s, parent.max_walltime_s),
        explicit=explicit,
    )


def resolve(stored: Mapping[str, PoolSettings], defaults: PoolDefaults) -> dict[str, Pool]:
    """Every stored pool, every ancestor of one and ``default``, with its settings resolved, in
    ``tree_order`` (each pool right before its subtree).

    1. Collect the paths: the stored ones, their ancestors, ``default``.
    2. Walk them parents first; each pool takes its own settings where set, else its parent's
       effective value (inherited ones), else the fixed default (weight, guarantee, limits).
    """
    paths = with_ancestors([*stored, DEFAULT_POOL])
    pools: dict[str, Pool] = {}
    for path in paths:
        parent_path = parent_of(path)
        parent: Pool | PoolDefaults = pools[parent_path] if parent_path is not None else defaults
        pools[path] = _inherit(path, parent, stored.get(path), explicit=path in stored)
    return dict(sorted(pools.items(), key=lambda item: tree_order(item[0])))


def effective(path: str, pools: Mapping[str, Pool], defaults: PoolDefaults) -> Pool:
    """The pool a job of ``path`` belongs to, also when ``path`` has no row (deleted, or a job from
    before pools were stored): its own entry of ``pools`` (``resolve``'s answer) when there is one,
    else a pool with no settings of its own under its nearest ancestor that is there (``parent``
    names that ancestor), else under the defaults."""
    if path in pools:
        return pools[path]
    for ancestor in reversed(ancestors(path)):
        if ancestor in pools:
            return _inherit(path, pools[ancestor], None, explicit=False)
    return _inherit(path, defaults, None, explicit=False)


def with_job_pools(pools: dict[str, Pool], paths: Iterable[str], defaults: PoolDefaults) -> dict[str, Pool]:
    """``pools`` (``resolve``'s answer) with every one of ``paths`` it lacks (a pool a job not yet
    ended names without a row: deleted under it by a race), under its nearest ancestor there."""
    for path in sorted(set(paths) - pools.keys(), key=tree_order):
        pools[path] = effective(path, pools, defaults)
    return pools


@dataclass(frozen=True, slots=True)
class BorrowingView:
    """What the claim reads of the cluster to keep work no preemption could take back off borrowed
    capacity (``corral.core.claim``): GPUs free on usable workers, each pool's guaranteed GPUs
    (pools with a guarantee only) and the GPUs each pool's jobs hold."""

    free_gpus: int
    guaranteed: Mapping[str, int]
    held: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class PoolUsage:
    """What a pool's non-terminal jobs hold and ask for, each task's resources summed."""

    #: reserved, running and preempting jobs
    held: Resources = field(default_factory=Resources)
    #: pending, blocked and preempted jobs (waiting for capacity)
    demand: Resources = field(default_factory=Resources)
    jobs: int = 0

    def __add__(self, other: PoolUsage) -> PoolUsage:
        return PoolUsage(self.held + other.held, self.demand + other.demand, self.jobs + other.jobs)


def subtree_usage(own: Mapping[str, PoolUsage], paths: Iterable[str]) -> dict[str, PoolUsage]:
    """Each of ``paths`` with the usage of its whole subtree (its own jobs and its descendants'):
    what a parent's fair share, guarantee and limits are measured against."""
    totals = {path: PoolUsage() for path in paths}
    for job_pool, usage in own.items():
        for path in [*ancestors(job_pool), job_pool]:
            if path in totals:
                totals[path] = totals[path] + usage
    return totals


class Starvation(StrEnum):
    NON_STARVING = "non_starving"
    STARVING = "starving"
    AGGRESSIVELY_STARVING = "aggressively_starving"


@dataclass(frozen=True, slots=True)
class StarvationState:
    """A pool's starvation: its status, since when it is below its fair share (the timer), and
    since when it has had its status."""

    status: Starvation = Starvation.NON_STARVING
    below_since: float | None = None
    since: float | None = None


#: a pool with no timer running
NOT_STARVING = StarvationState()


def created_reason(reason: Reason | None, path: str) -> Reason:
    """A submitted job's reason, saying its pool did not exist and was created with defaults."""
    note = f"pool '{path}' created with defaults"
    if reason is None:
        return Reason("queued", note)
    return replace(reason, message=f"{reason.message}; {note}")
