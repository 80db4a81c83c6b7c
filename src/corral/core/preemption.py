"""The preemption planner (seed 003, with DESIGN.md's "Preemption: corral's choices"): which running
work to stop so that higher work that cannot be placed can run, and nothing more.

``plan(inputs)`` is pure: the cycle's snapshot in (after the regular placement of the admission
cycle), decisions out. It runs inside the admission cycle, over the whole cluster at once, not per
heartbeat, so it sees every candidate victim and every waiting preemptor together.

**Preemptors**, in order (class highest first, then priority, then the queue order): the blocked
gangs the regular placement could not place, and the pending single jobs that fit no worker's free
capacity. A preemptor that fits somewhere without anyone stopping is left to the claim or to the
next cycle: preemption is a last resort.

**Victims** come in units: a single job, or a whole gang (every task it has running or reserved;
a gang is never sliced). A unit may be taken from preemptor P (class N, pool Q) when:

- ``priority``: its class is < N; or ``reclaim``: Q is below its guarantee with P's request added,
  and the unit runs on capacity its own pool borrows (beyond its pool's guarantee), class <= N;
- it is not class 10, not in a ``sensitive`` pool, not a ``service`` pool's allocation on the pool's
  own (guaranteed) capacity, not ``checkpoint: none`` with class >= 7, not within
  ``near_completion_s`` of its declared walltime, not already being stopped;
- its worker is usable and had no preemptive placement within ``backoff_s`` (nor earlier this
  cycle): at most one preemptive placement per worker per backoff.

**The cost** of a unit, in GPU-seconds lost (``cost``): for a job that checkpoints, its GPUs times
its expected checkpoint time (the median of its past checkpoint phases, else 300 s for ``auto`` and
600 s for ``manual``); otherwise its GPUs times the time since its last checkpoint (or its start);
plus a penalty that grows steeply once 90% of a declared walltime is used. One comparator orders the
units (``victim_key``): class ascending, cost ascending, newest first, id.

**The victim set** of a worker for one task of P: that worker's eligible units in comparator order,
taken until the task fits in the worker's free capacity plus what they free, then put back in
reverse order where the task still fits without them (minimal), at most ``max_victims`` units. P's
tasks are placed first on free capacity, then on the best worker sets (the set's worst class, its
cost, its size, the worker id); a gang preemptor gets room for every task or nobody is touched, and
in all at most ``max_victims`` units. The units are put back once more over the whole set, so no
unit is stopped that P does not need. If no set exists, P waits and its reason says why.

**Speed.** Worker sets are computed once per preemptor shape (class, request, constraints) and only
as far as needed: workers in the order of a lower bound of their best set's key, no further than
the preemptor's class allows, at most ``SEARCH_LIMIT`` sets per preemptor (``bench/admission.py``:
2,000 busy workers, 600 preemptors).

**Room already coming free.** Victims of earlier cycles still stopping hold room that is theirs no
more: a preemptor that fits there is reserved on it without a new victim. A preemptor that fits on
free room is left to the claim (single jobs) or the next cycle, its room set aside in the plan's
books so that no lower preemptor counts on it. Work no preemption could take back is refused room
on borrowed capacity (``corral.core.borrowing``), and tried once more at the end of the plan.

The loop applies each ``Preemption`` in one transaction (``start_preemption``): the victims go
``preempting`` (each with the job or gang it is stopped for, and, when it checkpoints, its checkpoint
phase), and P is reserved on the capacity they hold, with ``victims_deadline``: the claim starts it
once they have left, and its reservation does not expire before then. No lower job slips in while
the victims stop: the worker's books count both the victims and P's reservation.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from heapq import heappop, heappush
from itertools import count

from corral.core import borrowing, drain, fairshare
from corral.core.decisions import TaskPlacement
from corral.core.placement import Capacity, CycleMemo, free_capacity, matches_constraints
from corral.core.snapshot import PoolView
from corral.domain.records import Allocation, Job, Reason, Worker
from corral.domain.resources import ZERO, Resources
from corral.domain.status import Status
from corral.domain.transitions import Plan, Transition, move

__all__ = [
    "NEVER_PREEMPTED_CLASS",
    "PlanInputs",
    "Preemption",
    "PreemptionPlan",
    "PreemptionSettings",
    "PreemptionStarted",
    "Preemptor",
    "Victim",
    "cost",
    "non_preemptible",
    "plan",
    "preemptor_key",
    "start_preemption",
    "victim_key",
]

#: the reasons the plan gives a waiting preemptor (``_no_set``, ``borrowing.refusal``)
_PLANNER_CODES = frozenset({"no_victim_set", "preemption_backoff", "borrowing_refused"})
#: worker victim sets one preemptor looks at, at most: the search is greedy (cheapest sets first)
#: and bounded, so a cycle's time does not grow with the cluster for work that cannot be placed
SEARCH_LIMIT = 64
#: class 10 is never preempted (seed 003)
NEVER_PREEMPTED_CLASS = 10
#: ``checkpoint: none`` at or above this class cannot be preempted (all progress would be lost)
HIGH_CLASS = 7
#: expected checkpoint time of a job that has not checkpointed under corral yet, by mode
DEFAULT_CHECKPOINT_S = {"auto": 300.0, "manual": 600.0}
#: once this fraction of a declared walltime is used, stopping the job gets steeply dearer
LATE_FRACTION = 0.9
#: the penalty's steepness: at 100% of the walltime the job costs this many walltimes more
LATE_PENALTY = 10.0


@dataclass(frozen=True, slots=True)
class PreemptionSettings:
    max_victims: int = 3
    near_completion_s: float = 300.0
    backoff_s: float = 5.0
    #: how long the victims may take to leave: a checkpoint phase (its timeout, the 50% extension,
    #: the deferrals) and then the stop, which is force-drained after ``preempt_timeout_s``
    checkpoint_timeout_s: float = 600.0
    max_deferral_s: float = 300.0
    preempt_timeout_s: float = 45.0
    #: preemptions one cycle decides, at most: a cluster rebalancing at once is spread over a few
    #: cycles (each cycle's time grows with its preemptions), not stopped in one storm
    max_preemptions_per_cycle: int = 128
    #: fair share's prefix rule (``corral.core.fairshare.preemptible_groups``)
    satisfaction_threshold: float = 1.0
    aggressive_satisfaction_threshold: float = 0.2

    def victims_leave_within(self, checkpointing: bool) -> float:
        """The longest the victims of one preemption can hold their capacity."""
        phase = self.checkpoint_timeout_s * 1.5 + self.max_deferral_s if checkpointing else 0.0
        return phase + self.preempt_timeout_s


@dataclass(frozen=True, slots=True)
class Preemptor:
    """Work waiting to be placed: a pending single job (``key`` its id) or a blocked gang (``key``
    its gang id, ``tasks`` in ``gang_index`` order)."""

    key: str
    tasks: tuple[Job, ...]

    @property
    def first(self) -> Job:
        return self.tasks[0]


@dataclass(frozen=True, slots=True)
class Victim:
    """One unit to stop: a single job (``key`` its id) or a whole gang (``key`` its gang id), the
    jobs it stops (its running and reserved tasks), its class, its cost, and the trigger."""

    key: str
    job_ids: tuple[str, ...]
    preemption_class: int
    cost: float
    reason: str  # "priority", "reclaim" or "fair_share"


@dataclass(frozen=True, slots=True)
class Preemption:
    """Stop ``victims`` so that ``preemptor`` runs on ``placements`` (one per task)."""

    preemptor: str
    job_ids: tuple[str, ...]
    placements: tuple[TaskPlacement, ...]
    victims: tuple[Victim, ...]
    #: the victims' workers: each had its one preemptive placement of the backoff
    worker_ids: tuple[str, ...]
    #: P's reservation does not expire before this: the victims have left by then
    victims_deadline: float


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    preemptions: tuple[Preemption, ...] = ()
    #: preemptors for which no victim set exists this cycle, and why
    waiting: tuple[tuple[str, Reason], ...] = ()
    #: preemptors that fit without anyone stopping, and the free room the plan set aside for them
    #: (the claim or the next cycle places them; no lower preemptor counts on that room)
    fitting: tuple[tuple[str, tuple[TaskPlacement, ...]], ...] = ()
    #: the preemptors given room (by a preemption, or set aside), in the order the plan gave it
    order: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PlanInputs:
    """The planner's snapshot. ``holding``: every job holding resources (reserved, running,
    preempting), with this cycle's new reservations as ``extra`` allocations; ``pools`` by path
    (a path not there: kind ``batch``, no guarantee); ``last_preemptive``: worker id -> when it
    last had a preemptive placement (the backoff)."""

    now: float
    workers: tuple[Worker, ...]
    holding: tuple[Job, ...]
    preemptors: tuple[Preemptor, ...]
    settings: PreemptionSettings = field(default_factory=PreemptionSettings)
    pools: Mapping[str, PoolView] = field(default_factory=dict)
    extra: tuple[Allocation, ...] = ()
    last_preemptive: Mapping[str, float] = field(default_factory=dict)
    #: the cycle's fair shares and starvation (None: no fair-share trigger)
    fair: fairshare.FairShareState | None = None
    #: the pool of each ``extra`` allocation's job, by job id (their usage counts for fair share)
    extra_pools: Mapping[str, str] = field(default_factory=dict)
    #: the workers' free capacity from earlier plans (``placement.CycleMemo``; None: counted)
    memo: CycleMemo | None = None


# --- the rules -------------------------------------------------------------------------------


def cost(job: Job, now: float) -> float:
    """GPU-seconds lost by stopping ``job`` now (module docstring)."""
    gpus = job.spec.resources.gpus
    started = job.started_at if job.started_at is not None else now
    if job.spec.checkpoint_mode in DEFAULT_CHECKPOINT_S:
        past = job.checkpoint_durations
        lost = statistics.median(past) if past else DEFAULT_CHECKPOINT_S[job.spec.checkpoint_mode]
    else:
        since = max(started, job.last_checkpoint_at if job.last_checkpoint_at is not None else started)
        lost = max(0.0, now - since)
    total = gpus * lost
    walltime = job.spec.walltime_s
    if walltime:
        used = (now - started) / walltime
        if used > LATE_FRACTION:
            total += gpus * walltime * LATE_PENALTY * (used - LATE_FRACTION) / (1 - LATE_FRACTION)
    return total


def non_preemptible(job: Job, now: float, near_completion_s: float, pool: PoolView | None) -> str | None:
    """Why ``job`` may never be a victim, or None when it may be (the class and borrowing tests
    depend on the preemptor and are made apart)."""
    if job.spec.preemption_class >= NEVER_PREEMPTED_CLASS:
        return "class 10 is never preempted"
    if pool is not None and pool.kind == "sensitive":
        return "a sensitive pool's work is never preempted"
    if job.spec.checkpoint_mode == "none" and job.spec.preemption_class >= HIGH_CLASS:
        return "class 7 and above without checkpoints is not preemptible"
    walltime = job.spec.walltime_s
    started = job.started_at
    if walltime is not None and started is not None and started + walltime - now < near_completion_s:
        return f"within {near_completion_s:g} s of its walltime"
    return None


VictimKey = tuple[int, float, float, str]


def victim_key(unit: _Unit) -> VictimKey:
    """The one victim comparator: class ascending, cost ascending, newest first, id."""
    return (unit.preemption_class, unit.cost, -unit.started_at, unit.key)


# --- the plan --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Trigger:
    """What a preemptor may take beyond lower classes: borrowed capacity (``reclaiming``: its pool
    is below its guarantee), and a fair share (``beneficiary``: the starving pool it preempts for,
    ``aggressive`` in the aggressive stage)."""

    reclaiming: bool = False
    beneficiary: str | None = None
    aggressive: bool = False

    def __bool__(self) -> bool:
        """It may take within its own class."""
        return self.reclaiming or self.beneficiary is not None


@dataclass(slots=True)
class _Unit:
    key: str
    jobs: tuple[Job, ...]
    preemption_class: int
    cost: float
    started_at: float
    pool: str
    #: worker id -> what the unit frees there (resources, GPU indices)
    frees: dict[str, tuple[Resources, tuple[int, ...]]]
    borrowed: bool
    #: what its jobs hold, all together
    held: Resources = ZERO
    #: its group for fair share (``fairshare.preemptible_units``)
    group: fairshare.Group = fairshare.Group.NON_PREEMPTIBLE


@dataclass(slots=True)
class _Free:
    """A worker's free capacity during the plan (reservations of earlier preemptions taken out)."""

    worker: Worker
    capacity: Capacity


def plan(inputs: PlanInputs) -> PreemptionPlan:
    """The cycle's preemptions (module docstring): at most ``max_preemptions_per_cycle``; the
    preemptors past it are served by the next cycle."""
    if not inputs.preemptors or _nothing_to_plan(inputs):
        return PreemptionPlan()
    planner = _Planner(inputs)
    budget = inputs.settings.max_preemptions_per_cycle
    preemptions: list[Preemption] = []
    waiting: list[tuple[str, Reason]] = []
    refused: list[Preemptor] = []
    user_usage = _user_usage(inputs)
    for preemptor in sorted(inputs.preemptors, key=lambda preemptor: preemptor_key(preemptor, user_usage)):
        if len(preemptions) >= budget:
            break
        found = planner.place(preemptor)
        if isinstance(found, Preemption):
            preemptions.append(found)
        elif isinstance(found, Reason) and found.code == "borrowing_refused":
            refused.append(preemptor)
        elif found is not None:
            waiting.append((preemptor.key, found))
    # Work refused for borrowing is tried once more: the placements since may have used the
    # guarantees it would have taken (the next cycle would place it anyway).
    for preemptor in refused:
        found = planner.place(preemptor) if len(preemptions) < budget else None
        if isinstance(found, Preemption):
            preemptions.append(found)
        elif found is not None:
            waiting.append((preemptor.key, found))
    if planner.books is not None:
        waiting = _aggressive_stage(planner, inputs, waiting, preemptions, budget)
    return PreemptionPlan(tuple(preemptions), tuple(waiting), tuple(planner.fitting), tuple(planner.order))


def _aggressive_stage(
    planner: _Planner,
    inputs: PlanInputs,
    waiting: list[tuple[str, Reason]],
    preemptions: list[Preemption],
    budget: int,
) -> list[tuple[str, Reason]]:
    """Seed 002's last stage: the work of aggressively starving pools still waiting may also take
    aggressively preemptible allocations. Returns what still waits."""
    assert planner.books is not None
    by_key = {preemptor.key: preemptor for preemptor in inputs.preemptors}
    still: list[tuple[str, Reason]] = []
    for key, reason in waiting:
        preemptor = by_key[key]
        found: Preemption | Reason | None = None
        if len(preemptions) < budget and planner.books.beneficiary(
            preemptor.first.spec.pool, aggressive=True
        ):
            found = planner.place(preemptor, aggressive=True)
        if isinstance(found, Preemption):
            preemptions.append(found)
        else:
            still.append((key, reason))
    return still


def _nothing_to_plan(inputs: PlanInputs) -> bool:
    """No preemptor is above the lowest running class, no pool has a guarantee (no reclaim, no
    borrowing rule) and no victim is stopping (no room coming free): the planner could only say
    nothing, so a cycle skips building it (a simulator runs thousands of such cycles)."""
    if any(pool.guarantee.gpus > 0 for pool in inputs.pools.values()):
        return False
    if inputs.fair is not None and inputs.fair.anyone_starving():
        return False
    lowest = NEVER_PREEMPTED_CLASS
    for job in inputs.holding:
        if job.status == Status.PREEMPTING and job.preempted_for is not None:
            return False
        if job.status == Status.RUNNING:
            lowest = min(lowest, job.spec.preemption_class)
    return all(preemptor.first.spec.preemption_class <= lowest for preemptor in inputs.preemptors)


def preemptor_key(
    preemptor: Preemptor, user_usage: Mapping[tuple[str, str | None], int] | None = None
) -> tuple[int, int, int, int, float, str]:
    """The order preemptors are served in: class, then priority, highest first; front-of-queue
    re-queues first; then, in a pool of mode ``fair_share``, the user holding the fewest GPUs in
    that pool first (``user_usage``: GPUs held by pool and user; a ``fifo`` pool leaves it out);
    then submission time and id."""
    first = preemptor.first
    usage = 0
    if user_usage is not None:
        usage = user_usage.get((first.spec.pool, first.spec.user), 0)
    return (
        -first.spec.preemption_class,
        -first.spec.priority,
        0 if first.queue_front else 1,
        usage,
        first.submitted_at,
        preemptor.key,
    )


def _user_usage(inputs: PlanInputs) -> dict[tuple[str, str | None], int]:
    """GPUs held per pool and user, for the pools of mode ``fair_share`` (pools mode #6 of issue 9:
    the least-served user of such a pool goes first)."""
    held: dict[tuple[str, str | None], int] = {}
    for job in inputs.holding:
        pool = inputs.pools.get(job.spec.pool)
        if pool is not None and pool.mode != "fair_share":
            continue
        key = (job.spec.pool, job.spec.user)
        held[key] = held.get(key, 0) + job.spec.resources.gpus
    return held


class _Planner:
    """One cycle's search. Worker victim sets are computed once per preemptor shape (class, request,
    constraints, pool when it reclaims) and reused: a worker or unit used by an earlier preemptor of
    the cycle is skipped, never recomputed (it is in its backoff for the rest of the cycle anyway)."""

    def __init__(self, inputs: PlanInputs) -> None:
        self.inputs = inputs
        self.now = inputs.now
        self.settings = inputs.settings
        usable = [w for w in inputs.workers if w.status == "active" and w.flagged_dead_at is None]
        by_worker: dict[str, list[Job]] = {worker.id: [] for worker in usable}
        #: workers where earlier preemptions' victims are still stopping: their room is not free
        #: yet (a preemptor placed there is reserved, and waits for them)
        self.stopping: set[str] = set()
        for job in inputs.holding:
            if job.worker_id not in by_worker:
                continue
            if job.status == Status.PREEMPTING and job.preempted_for is not None:
                self.stopping.add(job.worker_id or "")
                continue  # a victim stopping: its room is as good as free, and nobody else's
            by_worker[job.worker_id].append(job)
        extra: dict[str, list[Allocation]] = {}
        for allocation in inputs.extra:
            if allocation.worker_id in by_worker:
                extra.setdefault(allocation.worker_id, []).append(allocation)
        self.free = {
            worker.id: _Free(
                worker,
                _capacity_at_start(worker, by_worker[worker.id], extra.get(worker.id, ()), inputs.memo),
            )
            for worker in sorted(usable, key=lambda w: w.id)
        }
        #: workers with a free GPU: the only ones where a GPU task may fit without a victim
        self.gpu_room = {worker_id for worker_id, free in self.free.items() if free.capacity.free.gpus > 0}
        #: per worker, bumped whenever this cycle's preemptions change it: a set computed at an
        #: older version is stale
        self.versions: dict[str, int] = {}
        self.sequence = count()  # heap tie-break
        self.used_units: set[str] = set()
        #: units on a worker in its backoff
        self.blocked_units: set[str] = set()
        #: the victim units by worker, built on first use (``_Victims``): a plan whose preemptors
        #: all fit or wait without looking for a victim never builds them
        self._victims: _Victims | None = None
        #: the workers ``_touch`` changed, in order, and ``_room``'s answers kept up to date from it
        self._touched: list[str] = []
        self._rooms: dict[tuple[int, Resources], _RoomEntry] = {}
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
        self.backoff: set[str] = set()
        for worker_id, at in inputs.last_preemptive.items():
            if at > self.now - inputs.settings.backoff_s:
                self._block(worker_id)
        #: below every running job's class, nothing may be taken: such a job just waits for capacity
        self.lowest_class = min(
            (job.spec.preemption_class for job in inputs.holding if job.status == Status.RUNNING),
            default=NEVER_PREEMPTED_CLASS,
        )
        self.fitting: list[tuple[str, tuple[TaskPlacement, ...]]] = []
        self.order: list[str] = []
        free_gpus = sum(free.capacity.free.gpus for free in self.free.values())
        guaranteed = {path: pool.guarantee.gpus for path, pool in inputs.pools.items()}
        self.guarantees = borrowing.Guarantees.of(free_gpus, guaranteed, inputs.holding)
        self._eligible: dict[tuple[object, ...], list[str]] = {}
        self._shapes: dict[tuple[object, ...], _Shape] = {}
        #: the GPUs free on each worker before the plan changed anything (``reach``)
        self._free_gpus_at_start = {
            worker_id: free.capacity.free.gpus for worker_id, free in self.free.items()
        }
        self._bounds: dict[int, list[tuple[int, float, int, str]]] = {}

    @property
    def units_on(self) -> dict[str, list[_Unit]]:
        """Every worker's victim units, in comparator order (``_Victims``)."""
        return self._built().units_on

    @property
    def reach(self) -> dict[str, int]:
        """Per worker with units, the GPUs free plus those of its ``max_victims`` largest units (at
        the start of the plan): no more can come free there in one preemption, whatever the
        preemptor's class."""
        return self._built().reach

    def _built(self) -> _Victims:
        """The victim units, built from the inputs on first use. Nothing they are built from moves
        during the plan (the inputs, the free GPUs at its start), so building them late gives what
        building them first would; the workers blocked so far block their units from then on."""
        victims = self._victims
        if victims is None:
            victims = self._victims = _Victims(self.inputs, self.free, self._free_gpus_at_start)
            for worker_id in self.backoff:
                self.blocked_units.update(unit.key for unit in victims.units_on.get(worker_id, ()))
        return victims

    # -- one preemptor ---------------------------------------------------------------------

    def place(self, preemptor: Preemptor, aggressive: bool = False) -> Preemption | Reason | None:
        spec = preemptor.first.spec
        request, size = spec.resources, len(preemptor.tasks)
        eligible = self._eligible_workers(preemptor.first)
        if not eligible:
            return None  # the admission cycle or ``why`` already says it can never fit
        pool = self.inputs.pools.get(spec.pool)
        locked_in = borrowing.unreclaimable(preemptor.first, pool is not None and pool.kind == "sensitive")
        room = self._room(eligible, request)
        if locked_in and sum(room.values()) >= size and not self._may_borrow(preemptor, ()):
            return borrowing.refusal(preemptor.first, request.gpus * size)
        if sum(room.values()) >= size:
            if not self.stopping.intersection(room) or self._fits_now(preemptor, room):
                # It fits without anyone stopping: the claim or the next cycle places it. The room
                # is set aside in this plan's books, so no lower preemptor counts on it.
                fitting = self._placements(preemptor, [], set(room), request) or []
                self._take_room(fitting, request, spec.pool)
                self.fitting.append((preemptor.key, tuple(fitting)))
                self.order.append(preemptor.key)
                return None
            # It fits once victims of earlier preemptions have left: reserved there, nobody else
            # takes that room, and nobody more is stopped for it.
            waiting_room = self._placements(preemptor, [], set(room), request)
            if waiting_room is not None:
                return self._commit(preemptor, [], waiting_room, _Trigger())
        beneficiary = self.books.beneficiary(spec.pool, aggressive) if self.books is not None else None
        trigger = _Trigger(self._reclaims(preemptor.first, size), beneficiary, aggressive)
        if spec.preemption_class <= self.lowest_class and not trigger:
            # Nothing below it to take from: it waits for capacity like any job. A reason an
            # earlier cycle's plan gave it (its pool was starving then) would mislead now.
            if preemptor.first.reason is not None and preemptor.first.reason.code in _PLANNER_CODES:
                return Reason(
                    "queued",
                    "waiting for a worker with free capacity; nothing it may preempt (no lower class"
                    " running, its pool not starving)",
                )
            return None
        shape = self._shape(preemptor.first, eligible, trigger)
        failed = shape.failed_sizes.get(trigger.beneficiary)
        if failed is not None and size >= failed:
            # Within a cycle room only shrinks: what failed for this shape fails again.
            return self._no_set(preemptor, eligible, trigger)
        chosen: list[_Unit] = []
        missing = size - sum(room.values())
        # Best set first, from the sets of this preemptor's shape (shared by every preemptor of the
        # shape: a set made stale by an earlier preemption is recomputed, one on a worker in its
        # backoff dropped). A worker that gave one task may give the next: its set for one task
        # more, counting what the chosen units free there, waits in ``local``.
        local: list[_Entry] = []
        popped: list[_Entry] = []
        examined = 0
        while missing > 0 and len(chosen) < self.settings.max_victims and examined < SEARCH_LIMIT:
            best = shape.best(self)
            from_local = bool(local) and (best is None or local[0] < best)
            if not from_local and best is None:
                break
            entry = heappop(local if from_local else shape.ready)
            worker_set = entry[2]
            worker_id = worker_set.worker_id
            if not from_local:
                if worker_id in self.backoff:
                    continue  # for the rest of the cycle
                if worker_set.version != self.versions.get(worker_id, 0) or (
                    trigger.beneficiary is not None
                    and not all(self._reason(unit, preemptor.first, trigger) for unit in worker_set.units)
                ):
                    # stale: the worker changed, or a fair-share preemption since moved the
                    # pools' usage so that a unit of the set may not be taken any more
                    units = self._candidates(worker_id, preemptor.first, trigger)
                    fresh = self._worker_set(worker_id, units, request) if units else None
                    if fresh is not None:
                        heappush(shape.ready, (fresh.key, next(self.sequence), fresh))
                    continue
                popped.append(entry)
                examined += 1
                if any(worker_id in unit.frees for unit in chosen):
                    relative = self._next_set(worker_id, preemptor.first, trigger, chosen)
                    if relative is not None:
                        heappush(local, (relative.key, next(self.sequence), relative))
                    continue
            new = [unit for unit in worker_set.units if unit not in chosen]
            if len(chosen) + len(new) > self.settings.max_victims:
                continue
            chosen.extend(new)
            # counted over every worker the chosen units free: a gang victim frees several
            missing = size - self._tasks_with(chosen, set(room), request)
            if missing > 0:
                relative = self._next_set(worker_id, preemptor.first, trigger, chosen)
                if relative is not None:
                    heappush(local, (relative.key, next(self.sequence), relative))
        if missing > 0:
            shape.failed_sizes[trigger.beneficiary] = min(size, failed or size)
        found = self._finish(preemptor, chosen, room, missing, eligible, trigger, examined)
        for entry in popped:  # still good for the next preemptor of this shape, unless spent
            if entry[2].worker_id not in self.backoff:
                heappush(shape.ready, entry)
        return found

    def _finish(
        self,
        preemptor: Preemptor,
        chosen: list[_Unit],
        room: Mapping[str, int],
        missing: int,
        eligible: Sequence[str],
        trigger: _Trigger,
        examined: int,
    ) -> Preemption | Reason:
        request, size = preemptor.first.spec.resources, len(preemptor.tasks)
        if missing > 0:
            return self._no_set(preemptor, eligible, trigger, examined)
        workers = set(room) | {worker_id for unit in chosen for worker_id in unit.frees}
        chosen = self._put_back(chosen, workers, request, size)
        placements = self._placements(preemptor, chosen, workers, request)
        if placements is None:  # the put-back left less than it counted: cannot happen
            return self._no_set(preemptor, eligible, trigger, examined)
        first = preemptor.first
        if not self._fair_set_holds(chosen, first, trigger):
            return self._no_set(preemptor, eligible, trigger, examined)
        pool = self.inputs.pools.get(first.spec.pool)
        sensitive = pool is not None and pool.kind == "sensitive"
        if borrowing.unreclaimable(first, sensitive) and not self._may_borrow(preemptor, chosen):
            return borrowing.refusal(first, request.gpus * size)
        return self._commit(preemptor, chosen, placements, trigger)

    def _fair_set_holds(self, chosen: Sequence[_Unit], first: Job, trigger: _Trigger) -> bool:
        """Every fair-share victim of the set may still be taken once the rest of the set has gone
        too: each unit was a candidate against the books on its own, and two from under one pool
        may leave it below its fair share together."""
        if self.books is None or trigger.beneficiary is None:
            return True
        for unit in chosen:
            if self._reason(unit, first, trigger) != "fair_share":
                continue
            saved = dict(self.books.usage), dict(self.books.own)
            for job in (job for other in chosen if other is not unit for job in other.jobs):
                self.books.add(job.spec.pool, job.spec.resources, sign=-1)
            holds = self._fair_victim(unit, trigger)
            self.books.usage, self.books.own = saved
            if not holds:
                return False
        return True

    def _may_borrow(self, preemptor: Preemptor, victims: Sequence[_Unit]) -> bool:
        """``borrowing.may_place`` for a preemptor, on the cluster as it would be once ``victims``
        have left: their GPUs free again and out of their pools' usage."""
        gpus = preemptor.first.spec.resources.gpus * len(preemptor.tasks)
        view = self.guarantees
        if victims:
            held = dict(view.held)
            freed = 0
            for unit in victims:
                for job in unit.jobs:
                    held[job.spec.pool] = held.get(job.spec.pool, 0) - job.spec.resources.gpus
                    freed += job.spec.resources.gpus
            view = borrowing.Guarantees(view.free_gpus + freed, view.guaranteed, held)
        return borrowing.may_place(preemptor.first, gpus, view)

    def _take_room(self, placements: Sequence[TaskPlacement], request: Resources, pool: str) -> None:
        """The room these placements use is no one else's this cycle."""
        self.guarantees.take(pool, request.gpus * len(placements))
        if self.books is not None:
            for _ in placements:
                self.books.add(pool, request)
        for placement in placements:
            free = self.free[placement.worker_id]
            taken = set(placement.gpu_indices)
            free.capacity = Capacity(
                _plus(free.capacity.free, request, subtract=True),
                tuple(index for index in free.capacity.free_gpu_indices if index not in taken),
            )
            self._touch(placement.worker_id)

    def _block(self, worker_id: str) -> None:
        """The worker had its preemptive placement of the backoff: nothing on it is taken again."""
        self.backoff.add(worker_id)
        if self._victims is not None:  # else ``_built`` blocks them
            self.blocked_units.update(unit.key for unit in self._victims.units_on.get(worker_id, ()))

    def _touch(self, worker_id: str) -> None:
        self.versions[worker_id] = self.versions.get(worker_id, 0) + 1
        self._touched.append(worker_id)
        if self.free[worker_id].capacity.free.gpus > 0:
            self.gpu_room.add(worker_id)
        else:
            self.gpu_room.discard(worker_id)

    def _fits_now(self, preemptor: Preemptor, room: Mapping[str, int]) -> bool:
        """Whether the tasks fit on ``room``'s workers counting the stopping victims as still there."""
        request = preemptor.first.spec.resources
        tasks = 0
        for worker_id in room:
            free = self.free[worker_id]
            if worker_id in self.stopping:
                capacity = free.capacity.free
                for job in self.inputs.holding:
                    if job.worker_id == worker_id and job.status == Status.PREEMPTING and job.preempted_for:
                        capacity = _plus(capacity, job.spec.resources, subtract=True)
                tasks += _tasks_fitting(capacity, request)
            else:
                tasks += room[worker_id]
        return tasks >= len(preemptor.tasks)

    def _eligible_workers(self, first: Job) -> list[str]:
        """The usable workers matching the job's constraints and VRAM (cached per shape)."""
        spec = first.spec
        key = (
            spec.constraints.gpu_model,
            tuple(sorted(spec.constraints.labels.items())),
            spec.resources.vram_mb if spec.resources.gpus else 0,
        )
        found = self._eligible.get(key)
        if found is None:
            found = self._eligible[key] = [
                worker_id
                for worker_id, free in self.free.items()
                if matches_constraints(free.worker, spec.constraints) is None
                and (spec.resources.gpus == 0 or spec.resources.vram_mb <= free.worker.resources.vram_mb)
            ]
        return found

    def _room(self, eligible: Sequence[str], request: Resources) -> dict[str, int]:
        """Tasks of ``request`` each eligible worker holds now, where it holds any.

        Kept per (eligible workers, request) and brought up to date from the workers ``_touch``
        changed since (every change of a worker's free capacity touches it), instead of counted
        again over the cluster for every preemptor. The dict returned is the cache's: read it
        before the next call, never change it."""
        key = (id(eligible), request)
        entry = self._rooms.get(key)
        if entry is None:
            entry = self._rooms[key] = _RoomEntry(
                eligible, set(eligible), self._room_counted(eligible, request), len(self._touched)
            )
            return entry.room
        touched = self._touched
        if entry.seen < len(touched):
            room, allowed, free = entry.room, entry.allowed, self.free
            for worker_id in set(touched[entry.seen :]):
                if worker_id in allowed:
                    tasks = _tasks_fitting(free[worker_id].capacity.free, request)
                    if tasks:
                        room[worker_id] = tasks
                    else:
                        room.pop(worker_id, None)
            entry.seen = len(touched)
        return entry.room

    def _room_counted(self, eligible: Sequence[str], request: Resources) -> dict[str, int]:
        """``_room`` counted over the cluster as it is now (its first answer; the tests' reference)."""
        if request.gpus > 0:
            allowed = set(eligible)
            pool: Iterable[str] = (worker_id for worker_id in self.gpu_room if worker_id in allowed)
        else:
            pool = eligible
        room = {}
        for worker_id in pool:
            count = _tasks_fitting(self.free[worker_id].capacity.free, request)
            if count:
                room[worker_id] = count
        return room

    def _reclaims(self, first: Job, size: int) -> bool:
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

    def _reason(self, unit: _Unit, first: Job, trigger: _Trigger) -> str | None:
        """The trigger under which ``unit`` may be taken for ``first`` ("priority", "reclaim",
        "fair_share"), or None when it may not."""
        preemptor_class = first.spec.preemption_class
        if trigger.reclaiming and unit.borrowed and unit.pool != first.spec.pool:
            return "reclaim" if unit.preemption_class <= preemptor_class else None
        pool = self.inputs.pools.get(unit.pool)
        if pool is not None and pool.kind == "service" and not unit.borrowed:
            return None
        if unit.preemption_class < preemptor_class:
            return "priority"
        if trigger.beneficiary is not None and unit.preemption_class == preemptor_class:
            return "fair_share" if self._fair_victim(unit, trigger) else None
        return None

    def _fair_victim(self, unit: _Unit, trigger: _Trigger) -> bool:
        """``unit`` is in its pool's preemptible group (or aggressively preemptible, in the
        aggressive stage), and taking it leaves no pool on its way to the beneficiary starving
        or under its threshold (``fairshare.Books.may_take_from``)."""
        group = fairshare.Group
        wanted = group.AGGRESSIVELY_PREEMPTIBLE if trigger.aggressive else group.PREEMPTIBLE
        if self.books is None or trigger.beneficiary is None:
            return False
        self._built().group(self.inputs)
        if unit.group < wanted:
            return False
        thresholds = (self.settings.aggressive_satisfaction_threshold, self.settings.satisfaction_threshold)
        return self.books.may_take_from(
            unit.pool, trigger.beneficiary, trigger.aggressive, thresholds, unit.held
        )

    def bounds(self, gpus: int) -> list[tuple[int, float, int, str]]:
        """Every worker with units, by a lower bound of the key of any victim set there for a task
        of ``gpus`` GPUs: the class of the unit at which its units, lowest class first, free enough
        GPUs (a set must reach that class). Sets are computed in this order, and no further than
        the preemptor's own class allows, so most workers of a large cluster are never looked at."""
        found = self._bounds.get(gpus)
        if found is None:
            found = []
            for worker_id, units in self.units_on.items():
                need = gpus - self.free[worker_id].capacity.free.gpus
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

    def _shape(self, first: Job, eligible: Sequence[str], trigger: _Trigger) -> _Shape:
        """The victim sets of a preemptor shape (class, request, constraints, pool when it
        reclaims, whether it may take for fair share), shared by every preemptor of the shape in
        the cycle and computed lazily. Preemptors of different starving pools share one shape:
        which pools' allocations each may take differs a little (never from inside its own
        subtree), so a set is checked against the preemptor's own trigger when it is taken, and
        computed again for it when it does not pass."""
        spec = first.spec
        key = (
            spec.preemption_class,
            spec.resources,
            spec.constraints.gpu_model,
            tuple(sorted(spec.constraints.labels.items())),
            spec.pool if trigger.reclaiming else None,
            trigger.beneficiary is not None,
            trigger.aggressive,
        )
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = _Shape(first, trigger, frozenset(eligible))
        return shape

    def _next_set(
        self, worker_id: str, first: Job, trigger: _Trigger, chosen: Sequence[_Unit]
    ) -> _WorkerSet | None:
        """The set on ``worker_id`` for one task more than it holds once ``chosen`` has gone."""
        units = [unit for unit in self._candidates(worker_id, first, trigger) if unit not in chosen]
        if not units:
            return None
        freed = ZERO
        for unit in chosen:
            if worker_id in unit.frees:
                freed = _plus(freed, unit.frees[worker_id][0])
        return self._worker_set(worker_id, units, first.spec.resources, freed)

    def _candidates(self, worker_id: str, first: Job, trigger: _Trigger) -> list[_Unit]:
        """The units on ``worker_id`` that ``first`` may take now, in comparator order."""
        return [
            unit
            for unit in self.units_on.get(worker_id, ())
            if self._free_to_take(unit) and self._reason(unit, first, trigger)
        ]

    def _free_to_take(self, unit: _Unit) -> bool:
        """Not taken by an earlier preemption, and on no worker in its backoff."""
        return unit.key not in self.used_units and unit.key not in self.blocked_units

    def _worker_set(
        self, worker_id: str, units: Sequence[_Unit], request: Resources, freed_already: Resources = ZERO
    ) -> _WorkerSet | None:
        """The minimal set of ``units`` (in comparator order) whose going makes room for one more
        task on ``worker_id`` than its free capacity (plus ``freed_already``) holds, or None."""
        free = _plus(self.free[worker_id].capacity.free, freed_already)
        have = _tasks_fitting(free, request)
        taken: list[_Unit] = []
        freed = free
        for unit in units:
            taken.append(unit)
            freed = _plus(freed, unit.frees[worker_id][0])
            if _tasks_fitting(freed, request) > have:
                break
        else:
            return None
        for unit in reversed(taken[:-1]):  # put back what the task does not need
            without = _plus(freed, unit.frees[worker_id][0], subtract=True)
            if _tasks_fitting(without, request) > have:
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
        version = self.versions.get(worker_id, 0)
        return _WorkerSet(worker_id, tuple(taken), key, version)

    def _put_back(self, chosen: list[_Unit], workers: set[str], request: Resources, size: int) -> list[_Unit]:
        """Across the whole set, drop every unit P's tasks fit without (most expensive first)."""
        kept = sorted(chosen, key=victim_key)
        for unit in reversed(list(kept)):
            trial = [other for other in kept if other is not unit]
            if self._tasks_with(trial, workers, request) >= size:
                kept = trial
        return kept

    def _tasks_with(self, chosen: Sequence[_Unit], workers: set[str], request: Resources) -> int:
        """Tasks of ``request`` that fit on ``workers`` and the workers ``chosen`` frees, once it has."""
        capacity = self._freed_capacity(chosen, workers | {w for unit in chosen for w in unit.frees})
        return sum(_tasks_fitting(free, request) for free, _ in capacity.values())

    def _freed_capacity(
        self, chosen: Sequence[_Unit], workers: set[str]
    ) -> dict[str, tuple[Resources, tuple[int, ...]]]:
        capacity = {
            worker_id: (self.free[worker_id].capacity.free, self.free[worker_id].capacity.free_gpu_indices)
            for worker_id in sorted(workers)
        }
        for unit in chosen:
            for worker_id, (resources, indices) in unit.frees.items():
                have, have_indices = capacity[worker_id]
                capacity[worker_id] = (
                    _plus(have, resources),
                    tuple(sorted(set(have_indices) | set(indices))),
                )
        return capacity

    def _placements(
        self, preemptor: Preemptor, chosen: Sequence[_Unit], workers: set[str], request: Resources
    ) -> list[TaskPlacement] | None:
        """Each task on a worker: free capacity plus what the chosen units free, the workers the
        victims free first (so the freed room is what P uses), then by id."""
        capacity = self._freed_capacity(chosen, workers)
        freed_workers = {worker_id for unit in chosen for worker_id in unit.frees}
        order = sorted(capacity, key=lambda worker_id: (worker_id not in freed_workers, worker_id))
        placements: list[TaskPlacement] = []
        tasks = iter(preemptor.tasks)
        task = next(tasks, None)
        for worker_id in order:
            free, indices = capacity[worker_id]
            while task is not None and _tasks_fitting(free, request) >= 1:
                placements.append(TaskPlacement(task.id, worker_id, tuple(indices[: request.gpus])))
                indices = indices[request.gpus :]
                free = _plus(free, request, subtract=True)
                task = next(tasks, None)
                if request == Resources():
                    break  # a task asking for nothing: one per worker
        return placements if task is None else None

    def _commit(
        self,
        preemptor: Preemptor,
        chosen: Sequence[_Unit],
        placements: Sequence[TaskPlacement],
        trigger: _Trigger,
    ) -> Preemption:
        first = preemptor.first
        victims = tuple(
            Victim(
                unit.key,
                tuple(job.id for job in unit.jobs),
                unit.preemption_class,
                unit.cost,
                self._reason(unit, first, trigger) or "priority",
            )
            for unit in chosen
        )
        worker_ids = tuple(sorted({worker_id for unit in chosen for worker_id in unit.frees}))
        request = first.spec.resources
        for unit in chosen:
            self.used_units.add(unit.key)
            for worker_id, (resources, indices) in unit.frees.items():
                free = self.free[worker_id]
                free.capacity = Capacity(
                    _plus(free.capacity.free, resources),
                    tuple(sorted(set(free.capacity.free_gpu_indices) | set(indices))),
                )
        # the victims' GPUs come free (they still count for their pools until they have left)
        self.guarantees.free_gpus += sum(
            resources.gpus for unit in chosen for resources, _ in unit.frees.values()
        )
        if self.books is not None:
            for unit in chosen:
                for job in unit.jobs:
                    self.books.add(job.spec.pool, job.spec.resources, sign=-1)
        self._take_room(placements, request, first.spec.pool)
        for worker_id in worker_ids:
            self._touch(worker_id)
            self._block(worker_id)
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
        self, preemptor: Preemptor, eligible: Sequence[str], trigger: _Trigger, examined: int = 0
    ) -> Reason:
        first = preemptor.first
        size = len(preemptor.tasks)
        what = f"its {size} tasks" if size > 1 else "it"
        allowed = set(eligible)
        if not examined and any(
            worker_id in allowed
            and any(self._reason(unit, first, trigger) for unit in self.units_on.get(worker_id, ()))
            for worker_id in self.backoff
        ):
            return Reason(
                "preemption_backoff",
                f"no free room for {what}; workers running work it may preempt had a preemptive"
                f" placement in the last {self.settings.backoff_s:g} s (at most one per worker per"
                " backoff): it is tried again next cycle",
            )
        fair = ""
        if trigger.beneficiary is not None and self.books is not None:
            pool = fairshare.describe(trigger.beneficiary, self.books.state)
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


@dataclass(frozen=True, slots=True)
class _WorkerSet:
    worker_id: str
    units: tuple[_Unit, ...]
    key: tuple[int, float, int, str]
    #: the worker's version when the set was computed (``_Planner.versions``): stale once it moved
    version: int


#: a heap entry: a set's key, a tie-break, the set
_Entry = tuple[tuple[int, float, int, str], int, _WorkerSet]


class _Shape:
    """The worker victim sets of one preemptor shape, best first, computed lazily: a worker's set
    is computed only once the planner's lower bound for it (``_Planner.bounds``) is below every set
    computed so far, so most workers of a large cluster are never looked at."""

    def __init__(self, first: Job, trigger: _Trigger, eligible: frozenset[str]) -> None:
        self.first = first
        self.trigger = trigger
        self.eligible = eligible
        self.next_bound = 0
        self.ready: list[_Entry] = []
        #: the smallest preemptor of this shape (in tasks) no victim set was found for
        #: per pool preempted for (a starving pool's may take what another's may not)
        self.failed_sizes: dict[str | None, int] = {}

    def best(self, planner: _Planner) -> tuple[tuple[int, float, int, str], int, _WorkerSet] | None:
        """The best set there is, left at the top of ``ready`` (None when there is none)."""
        bounds = planner.bounds(self.first.spec.resources.gpus)
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
            if worker_id not in self.eligible or worker_id in planner.backoff:
                continue
            if planner.reach[worker_id] < self.first.spec.resources.gpus:
                continue  # even its largest units, as many as one preemption may take, are too few
            units = planner._candidates(worker_id, self.first, self.trigger)
            found = planner._worker_set(worker_id, units, self.first.spec.resources) if units else None
            if found is not None:
                heappush(self.ready, (found.key, next(planner.sequence), found))
        return self.ready[0] if self.ready else None


# --- units, capacity arithmetic ---------------------------------------------------------------


@dataclass(slots=True)
class _RoomEntry:
    """``_Planner._room``'s answer for one (eligible workers, request), as of ``seen`` touches."""

    eligible: Sequence[str]  # kept alive: the cache is keyed by its id
    allowed: set[str]
    room: dict[str, int]
    seen: int


class _Victims:
    """The plan's victim units by worker (in comparator order) and each worker's ``reach``: built
    from the inputs alone (and the free GPUs at the start of the plan), once per plan."""

    __slots__ = ("_grouped", "reach", "units", "units_on")

    def __init__(
        self, inputs: PlanInputs, free: Mapping[str, _Free], free_gpus_at_start: Mapping[str, int]
    ) -> None:
        units = self.units = sorted(_units(inputs, free).values(), key=victim_key)
        self._grouped = False
        self.units_on: dict[str, list[_Unit]] = {}
        for unit in units:
            for worker_id in unit.frees:
                self.units_on.setdefault(worker_id, []).append(unit)
        most = inputs.settings.max_victims
        self.reach = {
            worker_id: free_gpus_at_start[worker_id]
            + sum(sorted((unit.frees[worker_id][0].gpus for unit in on), reverse=True)[:most])
            for worker_id, on in self.units_on.items()
        }

    def group(self, inputs: PlanInputs) -> None:
        """Each unit's fair-share group (``_group_units``), set on first use: only a fair-share
        victim's test reads it, and it depends on the inputs alone."""
        if not self._grouped:
            self._grouped = True
            _group_units(self.units, inputs)


def _units(inputs: PlanInputs, free: Mapping[str, _Free]) -> dict[str, _Unit]:
    """The victim candidates: running single jobs and gangs with every task started or reserved and
    none being stopped, on usable workers, that nothing protects (``non_preemptible``). With a
    ``memo``, the units of the last plan are reused where their job records are the same objects."""
    now, near = inputs.now, inputs.settings.near_completion_s
    pools = inputs.pools
    gangs: dict[str, list[Job]] = {}
    borrowed = _borrowed(inputs.holding, pools)
    units: dict[str, _Unit] = {}
    # the units of the last plan (``memo``): a unit whose job records are the very same objects
    # keeps what they alone decide (its jobs, class, pool, what it frees and holds); a unit lives
    # for one plan at a time, so its other fields are set anew here
    kept: dict[str, _Unit] = inputs.memo.kept("units") if inputs.memo is not None else {}
    for job in inputs.holding:
        if job.gang_id is not None:
            gangs.setdefault(job.gang_id, []).append(job)
            continue
        # a single job: the common case, kept cheap (a cycle may see tens of thousands)
        if job.status != Status.RUNNING or job.victims_deadline is not None or job.worker_id not in free:
            continue
        if non_preemptible(job, now, near, pools.get(job.spec.pool)):
            continue
        unit = kept.get(job.id)
        if unit is None or unit.jobs[0] is not job:
            unit = _Unit(
                key=job.id,
                jobs=(job,),
                preemption_class=job.spec.preemption_class,
                cost=0.0,
                started_at=0.0,
                pool=job.spec.pool,
                frees={job.worker_id or "": (job.spec.resources, job.gpu_indices)},
                borrowed=False,
                held=job.spec.resources,
            )
        # what depends on the time and on the whole snapshot is set anew
        unit.cost = cost(job, now)
        unit.started_at = job.started_at if job.started_at is not None else now
        unit.borrowed = job.id in borrowed
        unit.group = fairshare.Group.NON_PREEMPTIBLE
        units[job.id] = unit
    for key, jobs in gangs.items():
        first = jobs[0]
        if len(jobs) != first.spec.gang_size:
            continue  # a gang partly ended or partly waiting is not taken apart
        if any(job.status == Status.PREEMPTING or job.victims_deadline is not None for job in jobs):
            continue
        if not any(job.status == Status.RUNNING for job in jobs) or any(
            job.worker_id not in free for job in jobs
        ):
            continue
        if any(non_preemptible(job, now, near, pools.get(job.spec.pool)) for job in jobs):
            continue
        unit = kept.get(key)
        if (
            unit is None
            or len(unit.jobs) != len(jobs)
            or any(a is not b for a, b in zip(unit.jobs, jobs, strict=True))
        ):
            frees: dict[str, tuple[Resources, tuple[int, ...]]] = {}
            for job in jobs:
                worker_id = job.worker_id or ""
                resources, indices = frees.get(worker_id, (ZERO, ()))
                frees[worker_id] = (_plus(resources, job.spec.resources), indices + job.gpu_indices)
            unit = _Unit(
                key=key,
                jobs=tuple(jobs),
                preemption_class=first.spec.preemption_class,
                cost=0.0,
                started_at=0.0,
                pool=first.spec.pool,
                frees=frees,
                borrowed=False,
                held=sum((job.spec.resources for job in jobs), ZERO),
            )
        unit.cost = sum(cost(job, now) for job in jobs if job.status == Status.RUNNING)
        unit.started_at = max(job.started_at if job.started_at is not None else now for job in jobs)
        unit.borrowed = any(job.id in borrowed for job in jobs)
        unit.group = fairshare.Group.NON_PREEMPTIBLE
        units[key] = unit
    if inputs.memo is not None:
        inputs.memo.keep("units", units)
    return units


def _borrowed(holding: Sequence[Job], pools: Mapping[str, PoolView]) -> set[str]:
    """The jobs running on capacity their pool borrows: per pool, its allocations oldest first,
    the ones past its guaranteed GPUs (a pool without a guarantee borrows all it runs)."""
    by_pool: dict[str, list[Job]] = {}
    for job in holding:
        by_pool.setdefault(job.spec.pool, []).append(job)
    borrowed: set[str] = set()
    for path, jobs in by_pool.items():
        pool = pools.get(path)
        guarantee = pool.guarantee.gpus if pool is not None else 0
        used = 0
        for job in sorted(jobs, key=lambda job: (_started(job, 0.0), job.id)):
            used += job.spec.resources.gpus
            if used > guarantee:
                borrowed.add(job.id)
    return borrowed


def _group_units(units: Sequence[_Unit], inputs: PlanInputs) -> None:
    """Each unit's fair-share group, from every allocation its pool holds (units or not: one not
    preemptible still counts in the prefix), a gang as one allocation."""
    assert inputs.fair is not None
    allocations: dict[str, tuple[str, float, Resources]] = {}
    for job in inputs.holding:
        if job.status == Status.PREEMPTING:
            continue  # leaving: what stays of its pool is what the prefix counts
        started = _started(job, inputs.now)
        if job.gang_id is None:  # a single job: its own allocation (``ZERO + r`` is ``r``)
            allocations[job.id] = (job.spec.pool, started, job.spec.resources)
            continue
        key = job.gang_id
        pool, since, held = allocations.get(key, (job.spec.pool, started, ZERO))
        allocations[key] = (pool, max(since, started), held + job.spec.resources)
    groups = fairshare.preemptible_units(
        ((key, pool, since, held) for key, (pool, since, held) in allocations.items()),
        inputs.fair,
        inputs.settings.aggressive_satisfaction_threshold,
        inputs.settings.satisfaction_threshold,
    )
    for unit in units:
        unit.group = groups.get(unit.key, fairshare.Group.NON_PREEMPTIBLE)


def _started(job: Job, otherwise: float) -> float:
    """When ``job`` started, else when it was reserved, else ``otherwise`` (0.0 is a time: the
    simulator's clock starts there)."""
    if job.started_at is not None:
        return job.started_at
    return job.reserved_at if job.reserved_at is not None else otherwise


def _capacity_at_start(
    worker: Worker, jobs: list[Job], extra: Sequence[Allocation], memo: CycleMemo | None
) -> Capacity:
    """``free_capacity`` of ``worker`` after ``jobs`` and this cycle's ``extra`` reservations, from
    ``memo`` where the same jobs were counted before (a worker with a reservation of this cycle is
    counted)."""
    if memo is None or extra:
        return free_capacity(worker, [*map(_allocation, jobs), *extra])
    found = memo.get("planner", worker, jobs)
    if found is None:
        found = free_capacity(worker, [_allocation(job) for job in jobs])
        memo.put("planner", worker, jobs, found)
    return found


def _allocation(job: Job) -> Allocation:
    return Allocation(job.id, job.worker_id or "", job.spec.resources, job.gpu_indices, job.status)


def _plus(free: Resources, resources: Resources, subtract: bool = False) -> Resources:
    sign = -1 if subtract else 1
    return Resources(
        free.gpus + sign * resources.gpus,
        free.vram_mb,
        free.memory_mb + sign * resources.memory_mb,
        free.cpus + sign * resources.cpus,
    )


def _tasks_fitting(free: Resources, request: Resources) -> int:
    pairs = ((free.gpus, request.gpus), (free.cpus, request.cpus), (free.memory_mb, request.memory_mb))
    counts = [max(0, have) // want for have, want in pairs if want > 0]
    return min(counts) if counts else 1


# --- applying a preemption ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreemptionStarted:
    """A preemption applied: the preemptor's tasks as reserved, and the victims' jobs as stopped
    (``preempting``; a victim gang's reserved tasks ``blocked``), by victim."""

    preemption: Preemption
    reserved: tuple[Job, ...]
    stopped: tuple[Job, ...]


def start_preemption(
    preemption: Preemption,
    jobs: Mapping[str, Job],
    workers: Mapping[str, tuple[Worker, Sequence[Allocation]]],
    ports_used: set[int],
    now: float,
    checkpoint_timeout_s: float,
) -> Plan[PreemptionStarted | None]:
    """Apply ``preemption`` to the rows read under lock (the preemptor's, every victim's, whole
    gangs; the placement workers with their allocations), all of it or nothing (None) when anything
    moved since the plan: the preemptor is no longer waiting, a victim is no longer running as
    planned, or the capacity P needs is not what is free plus what the victims free.

    Victims go ``preempting`` with a new preemption epoch, the job or gang they stop for, their
    attempt refunded (a preemption never spends a retry) and, when they checkpoint, their checkpoint
    phase (``checkpoint_timeout_s``); a victim gang's reserved tasks go back to ``blocked``. The
    preemptor is reserved where the plan placed it, with its ``victims_deadline``.
    """
    tasks = [jobs.get(job_id) for job_id in preemption.job_ids]
    if any(task is None for task in tasks):
        return Plan((), None)
    waiting = [task for task in tasks if task is not None]
    first = waiting[0]
    gang = first.gang_id is not None
    if gang:
        whole = sorted(
            (job for job in jobs.values() if job.gang_id == first.gang_id), key=lambda j: j.gang_index or 0
        )
        if [job.id for job in whole] != list(preemption.job_ids) or any(
            j.status != Status.BLOCKED for j in whole
        ):
            return Plan((), None)
    elif first.status != Status.PENDING:
        return Plan((), None)
    victims = _victim_rows(preemption, jobs)
    if victims is None or not _room_is_there(preemption, waiting, victims, workers):
        return Plan((), None)
    transitions: list[Transition] = []
    for victim, rows in zip(preemption.victims, victims, strict=True):
        transitions.extend(_stop_victim(victim, rows, preemption, now, checkpoint_timeout_s))
    names = ", ".join(victim.key for victim in preemption.victims)
    why = f"reserved on worker {{worker}} by preemption: waiting for {names} to stop"
    placements = {place.job_id: (place.worker_id, place.gpu_indices) for place in preemption.placements}
    if gang:
        reserved = drain.reserve(
            waiting, placements, drain.first_free_port(ports_used), now, why, preemption.victims_deadline
        )
        transitions.extend(reserved.transitions)
    else:
        worker_id, indices = placements[first.id]
        transitions.append(
            drain.reserve_one(
                first, worker_id, indices, now, why, victims_deadline=preemption.victims_deadline
            )
        )
    moved = [transition.after for transition in transitions]
    reserved_ids = set(preemption.job_ids)
    return Plan(
        tuple(transitions),
        PreemptionStarted(
            preemption,
            tuple(job for job in moved if job.id in reserved_ids),
            tuple(job for job in moved if job.id not in reserved_ids),
        ),
    )


def _victim_rows(preemption: Preemption, jobs: Mapping[str, Job]) -> list[tuple[Job, ...]] | None:
    """Each victim's rows (a gang's every task), or None when one is no longer what was planned:
    every job it stops still holding its resources and none of them already being stopped."""
    found: list[tuple[Job, ...]] = []
    for victim in preemption.victims:
        rows = [jobs.get(job_id) for job_id in victim.job_ids]
        if any(row is None for row in rows):
            return None
        held = tuple(row for row in rows if row is not None)
        if held[0].gang_id is not None:
            held = tuple(
                sorted(
                    (j for j in jobs.values() if j.gang_id == held[0].gang_id),
                    key=lambda j: j.gang_index or 0,
                )
            )
            if len(held) != held[0].spec.gang_size:
                return None
        if any(row.status not in (Status.RUNNING, Status.RESERVED) for row in held):
            return None
        if not any(row.status == Status.RUNNING for row in held) or set(victim.job_ids) != {
            row.id for row in held
        }:
            return None
        found.append(held)
    return found


def _room_is_there(
    preemption: Preemption,
    tasks: Sequence[Job],
    victims: Sequence[tuple[Job, ...]],
    workers: Mapping[str, tuple[Worker, Sequence[Allocation]]],
) -> bool:
    """On each worker P is placed on: free capacity, once the victims' allocations are left out,
    covers P's tasks there, GPU indices included."""
    leaving = {job.id for rows in victims for job in rows}  # and whatever is being stopped already
    request = tasks[0].spec.resources
    by_worker: dict[str, list[TaskPlacement]] = {}
    for place in preemption.placements:
        by_worker.setdefault(place.worker_id, []).append(place)
    for worker_id, places in by_worker.items():
        if worker_id not in workers:
            return False
        worker, allocations = workers[worker_id]
        if worker.status != "active":
            return False
        staying = [
            allocation
            for allocation in allocations
            if allocation.job_id not in leaving and allocation.status != Status.PREEMPTING
        ]
        capacity = free_capacity(worker, staying)
        needed = Resources()
        indices: list[int] = []
        for place in places:
            needed = needed + request
            indices.extend(place.gpu_indices)
        if not capacity.free.covers(needed) or not set(indices) <= set(capacity.free_gpu_indices):
            return False
        if len(indices) != len(set(indices)):
            return False
    return True


def _stop_victim(
    victim: Victim, rows: Sequence[Job], preemption: Preemption, now: float, checkpoint_timeout_s: float
) -> list[Transition]:
    epoch = max(row.preemption_epoch for row in rows) + 1
    if victim.reason == "priority":
        message = (
            f"preempted by {preemption.preemptor} (a higher preemption class) for priority;"
            f" cost {victim.cost:.0f} GPU-seconds"
        )
    else:
        message = (
            f"preempted by {preemption.preemptor} to reclaim its pool's guaranteed capacity this job"
            f" borrowed; cost {victim.cost:.0f} GPU-seconds"
        )
    transitions: list[Transition] = []
    for row in rows:
        if row.status == Status.RUNNING:
            checkpoints = row.spec.checkpoint_mode != "none"
            phase: dict[str, object] = {}
            if checkpoints:
                phase = {
                    "checkpoint_requested_at": now,
                    "checkpoint_deadline": now + checkpoint_timeout_s,
                    "checkpoint_extended": False,
                    "checkpoint_deferred_s": 0.0,
                }
            transitions.append(
                move(
                    row,
                    now,
                    Reason(
                        f"preempted_{victim.reason}",
                        message + ("; checkpointing first" if checkpoints else ""),
                    ),
                    epoch,
                    status=Status.PREEMPTING,
                    preemption_epoch=epoch,
                    drain_started_at=now,
                    preempted_for=preemption.preemptor,
                    refunds=row.refunds + 1,
                    **phase,
                )
            )
        else:  # a victim gang's task reserved but not started: back to waiting with its gang
            transitions.append(
                move(
                    row,
                    now,
                    Reason(f"preempted_{victim.reason}", message),
                    epoch,
                    status=Status.BLOCKED,
                    **drain.BLOCKED,
                    preemption_epoch=epoch,
                    preempted_for=preemption.preemptor,
                )
            )
    return transitions
