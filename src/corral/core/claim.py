"""The claim's choice: what a worker's claim starts, written once for the store's claim transaction
and the simulator.

1. A task reserved for the worker goes first (its gang waits for it, seed 001); of several, the
   lowest id. A preemptor's reservation starts only once its victims have left: its GPU indices and
   resources are free of every other allocation on the worker.
2. Else the pending single jobs, in queue order (``corral.domain.queue_order``): the first that fits
   the worker's free capacity (``placement.place``: constraints, GPU indices). Capacity held for a
   waiting gang or job (a reservation, ``corral.core.reservations``) is used only by a job whose
   walltime ends before that reservation starts (``placement.holds_in_way``); work without a
   walltime never uses it.
3. A job no preemption could take back (``protection.unreclaimable``, with its pool's kind: a
   sensitive pool's work is never preempted) does not start on borrowed capacity
   (``borrowing.may_place``, on the cluster as the claim reads it): it is passed over and the next
   candidate is tried, as admission refuses a gang of the same kind.
4. A job whose pool, or an ancestor of it, would go past its ``limits`` with the job added
   (``corral.core.pool_limits``) is passed over too (``_LimitsOn``: the answers are kept per pool
   and request for one reading of what the pools hold).

Topology (issue 25, "fragmentation"): the claim is topology-blind on purpose. Best fit by domain
(keep large racks whole) is applied where corral chooses a worker, the gang placement
(``corral.core.topology``) and the planner's victims (``corral.core.preemption.locality``); a claim
is pulled by the worker that polls, which sees only its own allocations, and passing over a fitting
job for a worker of a fuller rack that may poll next would idle GPUs and delay the job with no bound
(that worker's holds, limits or borrowing rule may refuse it). The first fitting job starts.

Pure: the caller hands in the worker, its allocations, the candidates and a function that reads the
cluster's borrowing figures, which is called at most once per choice and only for a candidate that
step 3 concerns (the store reads them inside its transaction; the common claim never does), and a
function that reads what each pool's jobs hold, likewise called at most once per choice and only
for a candidate of a limited pool (step 4).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from corral.core import borrowing, lifecycle, pool_limits, protection
from corral.core.placement import Capacity, Placement, free_capacity, holds_in_way, place, without_holds
from corral.core.snapshot import PoolView
from corral.domain import pools as pool_rules
from corral.domain.pools import BorrowingView
from corral.domain.records import Allocation, Hold, Job, Worker
from corral.domain.resources import Resources
from corral.domain.status import Status
from corral.domain.transitions import Transition

__all__ = ["Claim", "reserved_task"]


class Claim:
    """The claim policy the store's claim and the simulator's call (module docstring).

    ``pools`` are the pools as the scheduler resolved them (``corral.domain.pools.resolve``): the
    claim reads a job's pool kind from them, a path without an entry taking its nearest ancestor's
    kind (the default kind when none has one)."""

    def __init__(self, pools: Mapping[str, PoolView] | None = None) -> None:
        self.pools: Mapping[str, PoolView] = pools if pools is not None else {}
        self._unreclaimable: dict[tuple[str, int, str], bool] = {}
        self._kept: _RuleOn | None = None
        #: the pools with limits (step 4), and the answers on the last usage read
        self.limits = pool_limits.limits_of(self.pools)
        self._paths = pool_limits.Limits(self.limits)  # which limits a pool's jobs count against
        self._kept_limits: _LimitsOn | None = None

    def capacity(self, worker: Worker, allocations: Sequence[Allocation]) -> Capacity:
        return free_capacity(worker, allocations)

    def reserved_task(self, worker: Worker, allocations: Sequence[Allocation]) -> str | None:
        return reserved_task(worker, allocations)

    def start(
        self,
        job: Job,
        worker_id: str,
        gpu_indices: Sequence[int],
        now: float,
        claim_key: str | None = None,
        reservation_epoch: int | None = None,
    ) -> Transition | None:
        return lifecycle.start(job, worker_id, gpu_indices, now, claim_key, reservation_epoch)

    def unreclaimable(self, job: Job) -> bool:
        """Step 3's test: work no preemption could take back, its pool's kind included (kept per
        pool, class and checkpoint mode: a poll may ask it of thousands of candidates)."""
        spec = job.spec
        key = (spec.pool, spec.preemption_class, spec.checkpoint_mode)
        found = self._unreclaimable.get(key)
        if found is None:
            found = self._unreclaimable[key] = protection.unreclaimable(job, self.pool_kind(spec.pool))
        return found

    def pool_kind(self, path: str) -> str:
        """The kind of the pool at ``path``, or of its nearest ancestor with an entry."""
        for candidate in (path, *reversed(pool_rules.ancestors(path))):
            pool = self.pools.get(candidate)
            if pool is not None:
                return pool.kind
        return pool_rules.PoolKind.BATCH

    def choose(
        self,
        worker: Worker,
        capacity: Capacity,
        candidates: Iterable[Job],
        holds: Sequence[Hold],
        now: float,
        borrowing_view: Callable[[], BorrowingView] | None = None,
        pool_held: Callable[[], Mapping[str, Resources]] | None = None,
    ) -> tuple[Job, tuple[int, ...]] | None:
        """Steps 2 to 4: the first candidate, in the order given, that fits and may start; None when
        none does. ``borrowing_view`` None: nothing is borrowed (no guarantees to protect).
        ``pool_held`` reads what each pool's own jobs hold; None: no limit is enforced."""
        # The held-back capacity is computed once, and a candidate is refused on its resources, then
        # on the borrowing rule, before its constraints are checked and a reason is worded: a poll
        # may read thousands.
        room = _RoomBesideHolds(capacity, holds, now)
        rule: _RuleOn | None = None
        within: _LimitsOn | None = None
        for job in candidates:
            usable = room.for_job(job)
            if not usable.free.covers(job.spec.resources):
                continue
            if borrowing_view is not None and self.unreclaimable(job):
                if rule is None:
                    rule = self._rule_on(borrowing_view())
                if not rule.may_borrow(job):
                    continue
            if pool_held is not None and self.limits and self.limited(job.spec.pool):
                if within is None:
                    within = self._limits_on(pool_held())
                if not within.allows(job):
                    continue
            decision = place(job.spec.resources, job.spec.constraints, worker, usable)
            if isinstance(decision, Placement):
                return job, decision.gpu_indices
        return None

    def may_borrow(self, job: Job, view: BorrowingView) -> bool:
        """Step 3 alone: whether ``job``, if no preemption could take it back, may start on the
        cluster ``view`` shows (a caller that keeps its queue in memory asks it before polling)."""
        return not self.unreclaimable(job) or self._rule_on(view).may_borrow(job)

    def limited(self, pool: str) -> bool:
        """Whether a job of ``pool`` counts against some pool's limits (step 4)."""
        return bool(self._paths.above(pool)) if self.limits else False

    def _limits_on(self, held: Mapping[str, Resources]) -> _LimitsOn:
        """Step 4's figures for one reading of what the pools hold, kept while the caller hands in
        the same reading (as ``_rule_on`` keeps the borrowing view)."""
        kept = self._kept_limits
        if kept is not None and kept.held is held:
            return kept
        kept = _LimitsOn(held, pool_limits.Limits.of(self.limits, held))
        self._kept_limits = kept
        return kept

    def _rule_on(self, view: BorrowingView) -> _RuleOn:
        """The rule's figures for ``view``, with its answers on them; kept while the caller hands in
        the same view (the simulator keeps its view until an allocation changes). A store thread
        keeps its own reference: another thread's view replaces the kept one, never changes it."""
        kept = self._kept
        if kept is not None and kept.view is view:
            return kept
        guaranteed = {path: gpus for path, gpus in view.guaranteed.items() if gpus > 0}
        kept = _RuleOn(view, borrowing.Guarantees(view.free_gpus, guaranteed, dict(view.held)))
        self._kept = kept
        return kept


@dataclass(slots=True)
class _RuleOn:
    """``borrowing.may_place`` on one view of the cluster: its answer depends only on the job's
    pool and GPUs, so it is kept by those."""

    view: BorrowingView
    guarantees: borrowing.Guarantees
    answers: dict[tuple[str, int], bool] = field(default_factory=dict)

    def may_borrow(self, job: Job) -> bool:
        key = (job.spec.pool, job.spec.resources.gpus)
        answer = self.answers.get(key)
        if answer is None:
            answer = self.answers[key] = borrowing.may_place(job, job.spec.resources.gpus, self.guarantees)
        return answer


@dataclass(slots=True)
class _LimitsOn:
    """``pool_limits.Limits`` on one reading of what the pools hold: its answer depends only on
    the job's pool and request, so it is kept by those."""

    held: Mapping[str, Resources]
    limits: pool_limits.Limits
    answers: dict[tuple[str, Resources], bool] = field(default_factory=dict)

    def allows(self, job: Job) -> bool:
        key = (job.spec.pool, job.spec.resources)
        answer = self.answers.get(key)
        if answer is None:
            answer = self.answers[key] = self.limits.exceeded(*key) is None
        return answer


class _RoomBesideHolds:
    """The capacity a candidate may use beside the holds on the worker (``placement.holds_in_way``):
    work without a walltime never uses held room; other work uses the room of the holds (the
    reservations) that start after it ends. Counted once per set of holds in the way: a poll may
    read thousands of candidates."""

    __slots__ = ("_capacity", "_holders", "_holds", "_kept", "_no_walltime", "_now")

    def __init__(self, capacity: Capacity, holds: Sequence[Hold], now: float) -> None:
        self._capacity = capacity
        self._holds = holds
        self._now = now
        self._kept: dict[tuple[int, ...], Capacity] = {}
        self._holders = {hold.gang_id for hold in holds}
        self._no_walltime = without_holds(capacity, holds) if holds else capacity

    def for_job(self, job: Job) -> Capacity:
        holds = self._holds
        if not holds:
            return self._capacity
        if not may_use_held_room(job, self._holders):
            return self._no_walltime
        in_way = holds_in_way(job, holds, self._now)
        key = tuple(id(hold) for hold in in_way)
        found = self._kept.get(key)
        if found is None:
            found = self._kept[key] = without_holds(self._capacity, in_way) if in_way else self._capacity
        return found


def may_use_held_room(job: Job, holders: AbstractSet[str]) -> bool:
    """Whether ``job`` may use a worker's held room at all (``holders``: the ids the holds are for):
    work with a walltime (where a reservation starts after it ends), a gang's task, or the holder
    itself. Work without a walltime never does."""
    return job.spec.walltime_s is not None or job.gang_id is not None or job.id in holders


def reserved_task(worker: Worker, allocations: Sequence[Allocation]) -> str | None:
    """Step 1: the task reserved on the worker that its claim starts first, or None."""
    for allocation in sorted(allocations, key=lambda allocation: allocation.job_id):
        if allocation.status == Status.RESERVED and _room_left_for(allocation, worker, allocations):
            return allocation.job_id
    return None


def _room_left_for(reserved: Allocation, worker: Worker, allocations: Sequence[Allocation]) -> bool:
    others = [allocation for allocation in allocations if allocation.job_id != reserved.job_id]
    capacity = free_capacity(worker, others)
    return capacity.free.covers(reserved.resources) and set(reserved.gpu_indices) <= set(
        capacity.free_gpu_indices
    )
