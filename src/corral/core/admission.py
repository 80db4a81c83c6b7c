"""The gang admission cycle: which blocked gangs to reserve this tick, on which workers and GPUs.

``decide(snapshot, reservation_timeout_s)`` is pure: the snapshot in (``now`` included), decisions
out, no I/O, no clock, no logging, and the same decisions for the same snapshot whatever the order
of its tuples. The loop applies them in the order given: rollbacks, then reservations, then holds
(replacing the previous cycle's), then the waiting reasons.

1. **Roll back stale reservations.** A gang with a ``reserved`` task whose ``reserved_at`` is more
   than ``reservation_timeout_s`` before ``now`` (``drain.stale_tasks``) gets a ``Rollback`` of all
   its reserved tasks (back to ``blocked``; the loop applies ``drain.stale_reservation``, which
   drains the gang instead when a sibling already started). Their allocations are dropped from
   this cycle's capacity at once.
2. **Candidates**: the gangs whose tasks are all ``blocked`` (counting the ones just rolled back).
   A gang with any task running, preempting, reserved (and fresh), done or failed is not one.
3. **Order**: ``corral.core.ordering.gang_key`` (size, class, priority, front-of-queue, submission
   time, id).
4. **Capacity**: for each usable worker (``usable``: active, not flagged dead), ``free_capacity``
   after every allocation on it (reserved, running and preempting jobs, single jobs included:
   workron's B7). Draining, offline and flagged workers get nothing.
5. **Place** each candidate against the capacity the earlier ones left, speculatively: task by
   task in ``gang_index`` order, each on the best-fitting worker (see ``_Cluster.best``), a worker
   taking several tasks when they fit; the gang is committed only when all N tasks are placed,
   else every speculative take is given back. A gang asking for no resources at all is spread one
   task per worker. GPU indices are the lowest free ones, as for single jobs. Once any worker
   carries a topology label (``CORRAL_TOPOLOGY_LEVELS``), a gang that fits by count is placed by
   ``corral.core.topology.choose`` instead (``_Layout``): the narrowest domain that holds it whole,
   best fit, ranks numbered so consecutive ones share the narrowest domain; a gang whose
   ``topology`` is ``required`` and that no single domain of that level holds waits with
   ``topology``.
6. **Reservations and backfill** (``_Later``, ``corral.core.reservations``). The first
   ``backfill_depth`` candidates that do not fit now (and could on idle workers), then the pending
   single jobs that fit nowhere now, get a reservation at their earliest start on the workers'
   timelines (the running work's deadlines; this cycle's reservations included): ``Hold``s with
   that start. The rest of the cycle sees those workers' free capacity minus the held resources,
   except a gang whose ``walltime_s`` ends before every reservation starts, which sees them whole
   (the claim applies the finer rule per hold: ``placement.holds_in_way``). A candidate whose room
   depends on work without a deadline gets no reservation; when it is the first not placed and no
   reservation was made before it, it keeps the head-of-queue hold (``_plan_hold``), expected at
   an unknown time (or at ``_plan_hold``'s time with a depth of 0). Every candidate not placed
   gets a ``Waiting`` with a stable code: ``no_workers``, ``unschedulable``,
   ``reserved_for_later``, ``head_of_queue``, ``backfill_refused``, ``held_for_gang``,
   ``insufficient_capacity`` (worded in ``corral.core.admission_reasons``).
   A gang its pool's limits (or an ancestor's) keep out waits with ``pool_limit``
   (``corral.core.pool_limits``) before it is placed, reserved for, held for or counted as the head.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from heapq import heapify, heappop, heappush

from corral.core import borrowing, drain, pool_limits, preemption, reservations, topology
from corral.core.admission_reasons import (
    NO_WORKERS,
    backfill_refused,
    head_reason,
    held_reason,
    reserved_reason,
    short_reason,
    topology_reason,
    unschedulable,
)
from corral.core.decisions import (
    AdmissionDecisions,
    Hold,
    Preemption,
    Reservation,
    Rollback,
    TaskPlacement,
    Waiting,
)
from corral.core.ordering import in_gang_order
from corral.core.placement import (
    Capacity,
    CapacityKept,
    Remembered,
    free_capacity,
    matches_constraints,
    usable,
)
from corral.core.preemption import PreemptionSettings
from corral.core.preemption.memo import PlannerMemo
from corral.core.preemption.rules import as_preemptor
from corral.core.protection import unreclaimable
from corral.core.schedulable import tasks_on
from corral.core.snapshot import Gang, Snapshot
from corral.domain.records import Allocation, Constraints, Job, Reason, TopologyRequest, Worker
from corral.domain.resources import Resources
from corral.domain.status import Status

_NOBODY: frozenset[int] = frozenset()
#: how many waiting gangs and jobs, in queue order, get a reservation (``CORRAL_BACKFILL_DEPTH``)
DEFAULT_BACKFILL_DEPTH = 16
#: Below any real quantity: ``(cpus, _FLOOR, _FLOOR)`` sorts before every index entry with ``cpus``.
_FLOOR = -(1 << 62)

#: What holds resources on a worker: (resources, expected end or None when unknown, job id).
Holding = tuple[Resources, float | None, str]
#: A speculative take: the worker's slot and the GPU indices given to the task.
Take = tuple["_Slot", tuple[int, ...]]


@dataclass(slots=True)
class AdmissionMemo:
    """What the gang admission keeps from one cycle for the next: each worker's free capacity
    counted from its allocations, the idle capacity of the usable workers and their shapes (both
    computed from the workers alone)."""

    capacity: CapacityKept[Allocation] = field(default_factory=CapacityKept)
    idle: Remembered[Worker, list[Capacity]] = field(default_factory=Remembered)
    shapes: Remembered[Worker, _Shapes] = field(default_factory=Remembered)


@dataclass(slots=True)
class CycleMemo:
    """What a cycle counted and built, for the next cycles of a caller that keeps its records
    between them (the simulator keeps a job's row until it changes; the server's store hands back
    the same records for unchanged rows): the gang admission's part and the preemption planner's.
    Each part checks its entries against the cycle's records before it reuses one."""

    admission: AdmissionMemo = field(default_factory=AdmissionMemo)
    planner: PlannerMemo = field(default_factory=PlannerMemo)


def decide(
    snapshot: Snapshot,
    reservation_timeout_s: float,
    preemption_settings: PreemptionSettings | None = None,
    memo: CycleMemo | None = None,
    backfill_depth: int = DEFAULT_BACKFILL_DEPTH,
    topology_levels: Sequence[str] = topology.DEFAULT_LEVELS,
) -> AdmissionDecisions:
    """One admission cycle over ``snapshot`` (the steps are in the module docstring), then, with
    ``preemption_settings``, the preemption planner (step 7) over what it left waiting. ``memo``:
    the workers' free capacity from earlier cycles, for a caller that keeps its records between
    cycles (``CycleMemo``; the decisions are the same without it). ``topology_levels``:
    ``CORRAL_TOPOLOGY_LEVELS``, widest first (``corral.core.topology``)."""
    admitted = _admit_gangs(
        snapshot,
        reservation_timeout_s,
        memo.admission if memo is not None else None,
        backfill_depth,
        tuple(topology_levels),
    )
    stale_singles = [
        job
        for job in snapshot.holding
        if job.gang_id is None and drain.is_stale(job, snapshot.now, reservation_timeout_s)
    ]
    admitted = replace(
        admitted,
        single_rollbacks=tuple(job.id for job in stale_singles),
        single_rollback_epochs=tuple(job.reservation_epoch for job in stale_singles),
    )
    if preemption_settings is None:
        return admitted
    planned = _preempt(snapshot, admitted, preemption_settings, memo, tuple(topology_levels))
    if not planned.preemptions:
        return planned
    return _preemptions_by_topology(snapshot, planned, tuple(topology_levels))


def _preempt(
    snapshot: Snapshot,
    admitted: AdmissionDecisions,
    settings: PreemptionSettings,
    memo: CycleMemo | None = None,
    levels: tuple[str, ...] = (),
) -> AdmissionDecisions:
    """Step 7: the gangs the regular placement left waiting (those that could ever fit) and the
    pending single jobs are the preemption planner's preemptors; a gang it makes room for is
    reserved by the preemption instead, so its waiting reason and holds go. ``levels``: the
    topology levels, by which a gang's victims are taken inside the best domain
    (``corral.core.preemption.locality``)."""
    never = {"no_workers", "unschedulable"}
    tasks_of = {gang.gang_id: gang.tasks for gang in snapshot.gangs}
    preemptors = [
        _preemptor(snapshot, waiting.gang_id, in_index_order(tasks_of[waiting.gang_id]))
        for waiting in admitted.waiting
        if waiting.reason.code not in never and waiting.gang_id in tasks_of
    ]
    preemptors.extend(_preemptor(snapshot, job.id, (job,)) for job in snapshot.pending)
    extra = tuple(  # this cycle's reservations hold their capacity already
        Allocation(
            place.job_id,
            place.worker_id,
            tasks_of[reservation.gang_id][0].spec.resources,
            place.gpu_indices,
            Status.RESERVED,
        )
        for reservation in admitted.reservations
        for place in reservation.placements
    )
    planned = preemption.plan(
        preemption.PlanInputs(
            now=snapshot.now,
            workers=snapshot.workers,
            holding=snapshot.holding,
            preemptors=tuple(preemptors),
            settings=settings,
            pools=snapshot.pools,
            extra=extra,
            last_preemptive=snapshot.last_preemptive,
            fair=snapshot.fair,
            extra_pools={
                place.job_id: tasks_of[reservation.gang_id][0].spec.pool
                for reservation in admitted.reservations
                for place in reservation.placements
            },
            memo=memo.planner if memo is not None else None,
            topology_levels=levels,
        )
    )
    served = {found.preemptor for found in planned.preemptions}
    reasons = dict(planned.waiting)
    waiting = tuple(
        Waiting(entry.gang_id, reasons.get(entry.gang_id, entry.reason))
        for entry in admitted.waiting
        if entry.gang_id not in served
    )
    return replace(
        admitted,
        holds=tuple(hold for hold in admitted.holds if hold.gang_id not in served),
        waiting=waiting,
        preemptions=planned.preemptions,
        single_waiting=tuple((key, reason) for key, reason in planned.waiting if key not in tasks_of),
    )


def _preemptions_by_topology(
    snapshot: Snapshot, decisions: AdmissionDecisions, levels: tuple[str, ...]
) -> AdmissionDecisions:
    """The planner's preemptions for gangs, held to their topology (``corral.core.topology``): a
    gang that requires a level and whose placement spans more than one domain of it is not
    preempted for (it waits, reason ``topology``); the others' ranks are renumbered so that
    consecutive ranks share the narrowest domain (placements sorted by the workers' paths)."""
    workers = {worker.id: worker for worker in snapshot.workers}
    tasks_of = {gang.gang_id: gang.tasks for gang in snapshot.gangs}
    labelled = topology.labelled(snapshot.workers, levels)
    kept: list[Preemption] = []
    refused: list[Waiting] = []
    for found in decisions.preemptions:
        tasks = tasks_of.get(found.preemptor)
        if tasks is None or len(found.placements) < 2:
            kept.append(found)
            continue
        paths = {
            place.worker_id: topology.path_of(workers[place.worker_id], levels)
            if place.worker_id in workers
            else ()
            for place in found.placements
        }
        asked = tasks[0].spec.topology
        if asked is not None and asked.required and asked.level in levels:
            depth = levels.index(asked.level)
            spanned = {
                paths[place.worker_id][: depth + 1]
                if all(value is not None for value in paths[place.worker_id][: depth + 1])
                else (place.worker_id,)
                for place in found.placements
            }
            if len(spanned) > 1:
                message = (
                    f"needs its {len(tasks)} tasks inside one {asked.level}; a preemption would"
                    f" place them across {len(spanned)}"
                )
                refused.append(Waiting(found.preemptor, Reason("topology", message)))
                continue
        if not labelled:  # no domains to group the ranks by: the planner's order, as before
            kept.append(found)
            continue
        ordered = sorted(
            found.placements,
            key=lambda place: (tuple(value or "" for value in paths[place.worker_id]), place.worker_id),
        )
        index_of = {task.id: (task.gang_index or 0, task.id) for task in tasks}
        by_index = sorted(
            (place.job_id for place in found.placements), key=lambda job_id: index_of.get(job_id, (0, job_id))
        )
        placements = tuple(
            TaskPlacement(job_id, place.worker_id, place.gpu_indices)
            for job_id, place in zip(by_index, ordered, strict=True)
        )
        kept.append(replace(found, placements=placements))
    if not refused and kept == list(decisions.preemptions):
        return decisions
    refused_ids = {entry.gang_id for entry in refused}
    return replace(
        decisions,
        preemptions=tuple(kept),
        waiting=(*(entry for entry in decisions.waiting if entry.gang_id not in refused_ids), *refused),
    )


def _preemptor(snapshot: Snapshot, key: str, tasks: tuple[Job, ...]) -> preemption.Preemptor:
    """A waiting job or gang as the planner's preemptor, a sensitive pool's work preempting as
    class 10 (``rules.as_preemptor``)."""
    kind = _pool_kind(snapshot, tasks[0].spec.pool)
    return preemption.Preemptor(key, tuple(as_preemptor(task, kind) for task in tasks))


def guarantees_of(snapshot: Snapshot) -> borrowing.Guarantees:
    """The pools' guarantees and usage, and the GPUs free on usable workers, as the snapshot has them."""
    usable_ids = {worker.id for worker in snapshot.workers if usable(worker)}
    total = sum(worker.resources.gpus for worker in snapshot.workers if worker.id in usable_ids)
    held = sum(job.spec.resources.gpus for job in snapshot.holding if job.worker_id in usable_ids)
    guaranteed = {path: pool.guarantee.gpus for path, pool in snapshot.pools.items()}
    return borrowing.Guarantees.of(total - held, guaranteed, snapshot.holding)


def limits_of(snapshot: Snapshot) -> pool_limits.Limits:
    """The pools' limits and what each limited subtree holds, as the snapshot has them."""
    limits = pool_limits.limits_of(snapshot.pools)
    if not limits:
        return pool_limits.Limits(limits)
    return pool_limits.Limits.of(limits, pool_limits.own_held(snapshot.holding))


def _pool_kind(snapshot: Snapshot, path: str) -> str | None:
    pool = snapshot.pools.get(path)
    return pool.kind if pool is not None else None


def in_index_order(tasks: Iterable[Job]) -> tuple[Job, ...]:
    return tuple(sorted(tasks, key=lambda task: (task.gang_index or 0, task.id)))


def _admit_gangs(
    snapshot: Snapshot,
    reservation_timeout_s: float,
    memo: AdmissionMemo | None = None,
    backfill_depth: int = DEFAULT_BACKFILL_DEPTH,
    levels: tuple[str, ...] = topology.DEFAULT_LEVELS,
) -> AdmissionDecisions:
    """Steps 1 to 6 of the module docstring."""
    pending = snapshot.pending if backfill_depth > 0 else ()
    now = snapshot.now
    rollbacks, released = _stale_reservations(snapshot.gangs, now, reservation_timeout_s)
    candidates = in_gang_order([gang for gang in snapshot.gangs if _is_candidate(gang, released)])
    if not candidates and not pending:
        return AdmissionDecisions(rollbacks=rollbacks)
    active = sorted((worker for worker in snapshot.workers if usable(worker)), key=lambda w: w.id)
    labelled = topology.labelled(active, levels)
    if labelled:  # the id tie-break everywhere below becomes a topology one: racks stay together
        active.sort(key=lambda worker: (topology.sort_key(worker, levels), worker.id))
    if not active:
        return AdmissionDecisions(
            rollbacks=rollbacks, waiting=tuple(Waiting(gang.gang_id, NO_WORKERS) for gang in candidates)
        )
    cluster = _Cluster(_slots(active, snapshot.allocations, released, snapshot.expected_ends, now, memo))
    shapes = memo.shapes.recall(active) if memo is not None else None
    if shapes is None:  # the same workers as the last cycle: the same shapes, and their answers
        shapes = _Shapes(cluster.slots)
        if memo is not None:
            memo.shapes.remember(active, shapes)
    reservations: list[Reservation] = []
    waiting: list[Waiting] = []
    head: _HeadHold | None = None  # the head of the queue's holds at an unknown time, if any
    later = _Later(cluster, now, backfill_depth)
    guarantees = guarantees_of(snapshot)
    limits = limits_of(snapshot)
    layout = _Layout(cluster, levels, labelled)
    for gang in candidates:
        spec, size = gang.tasks[0].spec, len(gang.tasks)  # every task shares the spec
        request, constraints = spec.resources, spec.constraints
        past_limit = limits.refusal(spec.pool, _times(request, size)) if limits.limits else None
        if past_limit is not None:
            waiting.append(Waiting(gang.gang_id, past_limit))
            continue
        if unreclaimable(gang.tasks[0], _pool_kind(snapshot, spec.pool)) and not borrowing.may_place(
            gang.tasks[0], request.gpus * size, guarantees
        ):
            waiting.append(Waiting(gang.gang_id, borrowing.refusal(gang.tasks[0], request.gpus * size)))
            continue
        eligible = shapes.eligible(request, constraints)
        backfill = later.may_backfill(spec.walltime_s)
        if layout.applies(spec.topology, request):
            placed, room, refused = layout.attempt(request, size, eligible, backfill, spec.topology)
            if refused is not None:
                waiting.append(Waiting(gang.gang_id, refused))
                continue
        else:
            placed, room = cluster.attempt(request, size, eligible, backfill)
        if placed is not None:
            guarantees.take(spec.pool, request.gpus * size)
            limits.take(spec.pool, _times(request, size))
            tasks = sorted(gang.tasks, key=lambda task: (task.gang_index or 0, task.id))
            end = None if spec.walltime_s is None else now + spec.walltime_s
            for task, (slot, _) in zip(tasks, placed, strict=True):
                slot.holding.append((request, end, task.id))
                later.placed(slot, request, end, task.id)
            reservations.append(
                Reservation(
                    gang.gang_id,
                    tuple(
                        TaskPlacement(task.id, slot.worker.id, indices)
                        for task, (slot, indices) in zip(tasks, placed, strict=True)
                    ),
                )
            )
            continue
        ever = shapes.ever_room(request, constraints)
        if ever < size:
            waiting.append(Waiting(gang.gang_id, unschedulable(size, request, constraints, ever, active)))
            continue
        if later.wanted():
            planned = later.book_gang(gang, eligible)
            if planned is not None:
                waiting.append(Waiting(gang.gang_id, later.reason(planned, size, now)))
                continue
        if head is None and not later.booked:
            plan = _plan_hold(cluster, request, size, eligible, now)
            if plan is None:  # idle workers could hold it, yet no plan: count it as never fitting
                waiting.append(Waiting(gang.gang_id, unschedulable(size, request, constraints, 0, active)))
                continue
            head_holds = later.hold_head(
                gang.gang_id, [(slot, _times(request, count)) for slot, count in plan.tasks], plan.expected_at
            )
            head = _HeadHold(gang.gang_id, plan.expected_at, head_holds)
            waiting.append(
                Waiting(
                    gang.gang_id,
                    head_reason(
                        size, request, room.tasks, room.exact, len(plan.tasks), plan.expected_at, now
                    ),
                )
            )
            continue
        if not backfill and cluster.fits(request, size, eligible, backfill=True):
            waiting.append(Waiting(gang.gang_id, later.refusal(spec.walltime_s, now)))
        else:
            waiting.append(Waiting(gang.gang_id, short_reason(size, request, room.tasks, room.exact)))
    if pending:
        later.book_singles(pending, shapes)
    holds = later.holds()
    return AdmissionDecisions(
        rollbacks=rollbacks, reservations=tuple(reservations), holds=tuple(holds), waiting=tuple(waiting)
    )


# --- steps 1 and 2: stale reservations and candidates ----------------------------------------------


def _stale_reservations(
    gangs: Iterable[Gang], now: float, timeout_s: float
) -> tuple[tuple[Rollback, ...], frozenset[str]]:
    """A ``Rollback`` per gang with a reservation older than ``timeout_s`` (``drain.stale_tasks``,
    the rule the rollback applies again under lock), in gang id order, and the ids of the tasks it
    returns to ``blocked``."""
    rollbacks: list[Rollback] = []
    released: set[str] = set()
    for gang in sorted(gangs, key=lambda g: g.gang_id):
        stale = drain.stale_tasks(gang.tasks, now, timeout_s)
        if not stale:
            continue
        reserved = [task for task in gang.tasks if task.status == Status.RESERVED]
        message = f"{len(stale)} reserved task(s) not claimed within {timeout_s:g} s"
        running = sum(task.status in (Status.RUNNING, Status.PREEMPTING) for task in gang.tasks)
        if running:
            message += f"; {running} sibling task(s) already started: the gang must drain"
        rollbacks.append(
            Rollback(
                gang.gang_id,
                tuple(task.id for task in reserved),
                Reason("reservation_expired", message),
                tuple(task.reservation_epoch for task in reserved),
            )
        )
        released.update(task.id for task in reserved)
    return tuple(rollbacks), frozenset(released)


def _is_candidate(gang: Gang, released: frozenset[str]) -> bool:
    return bool(gang.tasks) and all(
        task.status == Status.BLOCKED or task.id in released for task in gang.tasks
    )


# --- step 4: capacity, and the index placement searches -----------------------------------------


class _Slot:
    """One active worker during the cycle: its free capacity in the what-if world (speculative takes
    included), the allocations that hold it, and what the head of the queue holds on it."""

    __slots__ = (
        "_holding",
        "_source",
        "cpus",
        "empty",
        "gpus",
        "held",
        "indices",
        "memory",
        "order",
        "worker",
    )

    def __init__(
        self,
        order: int,
        worker: Worker,
        free: Capacity,
        empty: Resources,
        source: tuple[list[Allocation], float, Mapping[str, float]] | None = None,
    ) -> None:
        self.order = order  # rank of the worker among the active ones (id order; topology, then id,
        # once workers carry topology labels): the tie-break
        self.worker = worker
        self.empty = empty  # free capacity when idle (unhealthy GPUs left out)
        self.gpus = free.free.gpus
        self.cpus = free.free.cpus
        self.memory = free.free.memory_mb
        self.indices = list(free.free_gpu_indices)
        #: the allocations on the worker, now and the expected ends: ``holding`` is built from
        #: them on first use (only the head of the queue's hold plan reads every worker's)
        self._source = source
        self._holding: list[Holding] | None = None if source else []
        self.held: Resources | None = None

    @property
    def holding(self) -> list[Holding]:
        """What holds the worker's resources (``Holding``): a preempting allocation ends now (it has
        been told to stop), another when ``expected_ends`` says, if it says."""
        holding = self._holding
        if holding is None:
            assert self._source is not None
            held, now, expected_ends = self._source
            preempting = Status.PREEMPTING
            holding = self._holding = [
                (
                    allocation.resources,
                    now if allocation.status == preempting else expected_ends.get(allocation.job_id),
                    allocation.job_id,
                )
                for allocation in held
            ]
        return holding

    def view(self) -> tuple[int, int, int]:
        """Free (GPUs, CPUs, memory) as work that may not backfill sees it: minus the head's hold,
        never below zero for a resource the hold takes."""
        if self.held is None:
            return self.gpus, self.cpus, self.memory
        return (
            _after_hold(self.gpus, self.held.gpus),
            _after_hold(self.cpus, self.held.cpus),
            _after_hold(self.memory, self.held.memory_mb),
        )


def _after_hold(free: int, held: int) -> int:
    return free if free < 0 else max(0, free - held)


def _slots(
    active: Sequence[Worker],
    allocations: Iterable[Allocation],
    released: frozenset[str],
    expected_ends: Mapping[str, float],
    now: float,
    memo: AdmissionMemo | None = None,
) -> list[_Slot]:
    by_worker: dict[str, list[Allocation]] = {worker.id: [] for worker in active}
    for allocation in allocations:
        on = by_worker.get(allocation.worker_id)
        if on is not None and allocation.job_id not in released and allocation.status.holds_resources:
            on.append(allocation)
    empties: list[Capacity] | None = memo.idle.recall(list(active)) if memo is not None else None
    if empties is None:
        idle: dict[tuple[Resources, tuple[int, ...]], Capacity] = {}  # workers alike share it
        empties = []
        for worker in active:
            key = (worker.resources, worker.unhealthy_gpus)
            empty = idle.get(key)
            if empty is None:
                empty = idle[key] = free_capacity(worker, ())
            empties.append(empty)
        if memo is not None:
            memo.idle.remember(list(active), empties)
    slots = []
    for order, worker in enumerate(active):
        empty = empties[order]
        held = by_worker[worker.id]
        if not held:
            slots.append(_Slot(order, worker, empty, empty.free))
            continue
        free = memo.capacity.get(worker, held) if memo is not None else None
        if free is None:
            free = free_capacity(worker, held)
            if memo is not None:
                memo.capacity.put(worker, held, free)
        slots.append(_Slot(order, worker, free, empty.free, (held, now, expected_ends)))
    return slots


class _Index:
    """Workers by free capacity, for best fit: ``buckets[g]`` holds the workers with ``g`` free GPUs,
    each bucket sorted by (free CPUs, free memory, order). Walking the buckets from the GPU count
    asked upward and taking the first entry that fits yields the best fit, one comparator:

    1. fewest free GPUs (so fewest left after placing: every task of a gang asks the same);
    2. fewest free CPUs;
    3. least free memory;
    4. worker id (``order`` is the id's rank).
    """

    def __init__(self, size: int) -> None:
        self.buckets: list[list[tuple[int, int, int]]] = [[] for _ in range(size)]
        self.entries: dict[int, tuple[int, tuple[int, int, int]]] = {}

    def fill(self, rows: Iterable[tuple[int, int, int, int]]) -> None:
        """File every worker of an empty index at once, each (order, GPUs, CPUs, memory) as ``put``
        files it (the buckets sorted once, not kept sorted entry by entry)."""
        for order, gpus, cpus, memory in rows:
            if gpus >= 0:
                entry = (cpus, memory, order)
                self.buckets[gpus].append(entry)
                self.entries[order] = (gpus, entry)
        for bucket in self.buckets:
            bucket.sort()

    def put(self, order: int, gpus: int, cpus: int, memory: int) -> None:
        """(Re)file worker ``order``; a worker with fewer than zero free GPUs is left out."""
        old = self.entries.pop(order, None)
        if old is not None:
            bucket = self.buckets[old[0]]
            del bucket[bisect_left(bucket, old[1])]
        if gpus >= 0:
            entry = (cpus, memory, order)
            insort(self.buckets[gpus], entry)
            self.entries[order] = (gpus, entry)

    def first(
        self,
        request: Resources,
        eligible: list[bool] | None,
        skip: AbstractSet[int],
        passed: AbstractSet[int],
    ) -> tuple[int, int, int, int] | None:
        """The best fit for one task of ``request`` as (GPUs, CPUs, memory, order), or None."""
        gpus, cpus, memory = request.gpus, request.cpus, request.memory_mb
        probe = (cpus, _FLOOR, _FLOOR)
        for have in range(gpus, len(self.buckets)):
            bucket = self.buckets[have]
            for at in range(bisect_left(bucket, probe), len(bucket)):
                entry_cpus, entry_memory, order = bucket[at]
                if entry_memory < memory or (eligible is not None and not eligible[order]):
                    continue
                if order in skip or order in passed:
                    continue
                return have, entry_cpus, entry_memory, order
        return None

    def count(
        self, request: Resources, eligible: list[bool] | None, passed: AbstractSet[int], enough: int
    ) -> int:
        """Tasks of ``request`` the filed workers that ``first`` may return hold in all, each
        worker as many as its free capacity holds (a countable request, ``_countable``); it stops
        once the total reaches ``enough``."""
        gpus, cpus, memory = request.gpus, request.cpus, request.memory_mb
        probe = (cpus, _FLOOR, _FLOOR)
        total = 0
        for have in range(gpus, len(self.buckets)):
            bucket = self.buckets[have]
            for at in range(bisect_left(bucket, probe), len(bucket)):
                entry_cpus, entry_memory, order = bucket[at]
                if entry_memory < memory or (eligible is not None and not eligible[order]):
                    continue
                if order in passed:
                    continue
                total += _tasks_within(have, entry_cpus, entry_memory, request)
                if total >= enough:
                    return total
        return total

    def units(
        self, request: Resources, eligible: list[bool] | None, passed: AbstractSet[int]
    ) -> list[tuple[int, int]]:
        """(order, tasks of ``request`` it holds) for every filed worker ``first`` may return."""
        gpus, cpus, memory = request.gpus, request.cpus, request.memory_mb
        probe = (cpus, _FLOOR, _FLOOR)
        found: list[tuple[int, int]] = []
        append = found.append
        for have in range(gpus, len(self.buckets)):
            bucket = self.buckets[have]
            by_gpus = have // gpus if gpus else None
            for entry_cpus, entry_memory, order in bucket[bisect_left(bucket, probe) :]:
                if entry_memory < memory or (eligible is not None and not eligible[order]):
                    continue
                if order in passed:
                    continue
                tasks = by_gpus
                if cpus and (tasks is None or entry_cpus // cpus < tasks):
                    tasks = entry_cpus // cpus
                if memory and (tasks is None or entry_memory // memory < tasks):
                    tasks = entry_memory // memory
                append((order, tasks if tasks is not None else 0))
        return found


def _tasks_within(gpus: int, cpus: int, memory: int, request: Resources) -> int:
    """Tasks of a countable ``request`` that free (GPUs, CPUs, memory) holds, each at least
    the request (``_Index.first``'s filter)."""
    counts = [
        have // want
        for have, want in ((gpus, request.gpus), (cpus, request.cpus), (memory, request.memory_mb))
        if want > 0
    ]
    return min(counts)


class _Cluster:
    """Every active worker's free capacity, indexed for best fit (``_Index``): ``view`` files every
    worker as ``_Slot.view`` says (minus the head's hold), ``whole`` files the held workers again
    at their whole free capacity, for backfill."""

    def __init__(self, slots: list[_Slot]) -> None:
        self.slots = slots
        size = max((max(slot.gpus, slot.empty.gpus) for slot in slots), default=0) + 1
        self.view = _Index(size)
        self.whole = _Index(size)
        self.held_slots: list[_Slot] = []
        self.held_orders: set[int] = set()
        #: per GPU count asked, the tasks held workers add when seen whole (``room_bound``), kept
        #: up to date as held workers change (``_reindex``) rather than summed again each time
        self._held_extra: dict[int, int] = {}
        #: per held worker (by order), its free GPUs whole and as ``view`` sees them, floored at 0
        self._held_gpus: dict[int, tuple[int, int]] = {}
        # nothing is held yet: every worker as ``_Slot.view`` files it, its whole free capacity
        self.view.fill((slot.order, slot.gpus, slot.cpus, slot.memory) for slot in slots)

    def _reindex(self, slot: _Slot) -> None:
        self.view.put(slot.order, *slot.view())
        if slot.held is not None:
            self.whole.put(slot.order, slot.gpus, slot.cpus, slot.memory)
            old = self._held_gpus.get(slot.order, (0, 0))
            new = self._held_gpus[slot.order] = (max(0, slot.gpus), max(0, slot.view()[0]))
            for want in self._held_extra:
                self._held_extra[want] += _held_tasks(new, want) - _held_tasks(old, want)

    def hold(self, slot: _Slot, held: Resources) -> None:
        slot.held = held
        if slot.order not in self.held_orders:
            self.held_slots.append(slot)
            self.held_orders.add(slot.order)
        self._reindex(slot)

    def _take(self, slot: _Slot, request: Resources) -> tuple[int, ...]:
        slot.gpus -= request.gpus
        slot.cpus -= request.cpus
        slot.memory -= request.memory_mb
        taken = tuple(slot.indices[: request.gpus])
        del slot.indices[: request.gpus]
        self._reindex(slot)
        return taken

    def _give_back(self, slot: _Slot, request: Resources, taken: tuple[int, ...]) -> None:
        slot.gpus += request.gpus
        slot.cpus += request.cpus
        slot.memory += request.memory_mb
        slot.indices = sorted(slot.indices + list(taken))
        self._reindex(slot)

    def room_bound(self, request: Resources, backfill: bool) -> int | None:
        """At most this many tasks of ``request`` fit now, counting GPUs only (None: no GPUs asked,
        no cheap bound). Cheap, so a gang that cannot fit is turned away without a search."""
        want = request.gpus
        if want == 0:
            return None
        buckets = self.view.buckets
        bound = sum(len(buckets[gpus]) * (gpus // want) for gpus in range(want, len(buckets)))
        if backfill:
            extra = self._held_extra.get(want)
            if extra is None:
                extra = self._held_extra[want] = sum(
                    _held_tasks(gpus, want) for gpus in self._held_gpus.values()
                )
            bound += extra
        return bound

    def best(
        self, request: Resources, eligible: list[bool] | None, backfill: bool, skip: set[int]
    ) -> _Slot | None:
        """The best-fitting worker with room for one task of ``request`` (``_Index``'s order), or
        None. ``skip``: workers this gang may not use again. With ``backfill`` the held workers
        count whole, without the hold."""
        found = self.view.first(request, eligible, skip, self.held_orders if backfill else _NOBODY)
        if backfill and self.held_slots:
            whole = self.whole.first(request, eligible, skip, _NOBODY)
            if whole is not None and (found is None or whole < found):
                found = whole
        return None if found is None else self.slots[found[3]]

    def attempt(
        self, request: Resources, size: int, eligible: list[bool] | None, backfill: bool
    ) -> tuple[list[Take] | None, _Room]:
        """Speculate: place ``size`` tasks one by one; keep the takes only if all fit.
        Returns the takes (None when the gang does not fit) and the room found (exact after a
        search or a count, an upper bound when the cheap bound turned the gang away)."""
        bound = self.room_bound(request, backfill)
        if bound is not None and bound < size:
            return None, _Room(bound, exact=False)
        if _countable(request):
            counted = self.count(request, eligible, backfill, size)
            if counted < size:  # what the search would place before it gave up, and give back
                return None, _Room(counted, exact=True)
        spread = request == Resources()  # asks for nothing: one task per worker
        placed: list[Take] = []
        used: set[int] = set()
        while len(placed) < size:
            slot = self.best(request, eligible, backfill, used)
            if slot is None:
                break
            placed.append((slot, self._take(slot, request)))
            if spread:
                used.add(slot.order)
        room = _Room(len(placed), exact=True)
        if len(placed) == size:
            return placed, room
        for slot, taken in reversed(placed):
            self._give_back(slot, request, taken)
        return None, room

    def fits(self, request: Resources, size: int, eligible: list[bool] | None, backfill: bool) -> bool:
        """Whether ``attempt`` would place all ``size`` tasks, without placing them."""
        bound = self.room_bound(request, backfill)
        if bound is not None and bound < size:
            return False
        if _countable(request):
            return self.count(request, eligible, backfill, size) >= size
        placed, _ = self.attempt(request, size, eligible, backfill)
        if placed is None:
            return False
        for slot, taken in reversed(placed):
            self._give_back(slot, request, taken)
        return True

    def count(self, request: Resources, eligible: list[bool] | None, backfill: bool, enough: int) -> int:
        """How many tasks of ``request`` the search of ``attempt`` places before it gives up,
        counted without placing them; it stops once the count reaches ``enough`` (the value is
        then at least that). Every task of a gang asks the same and a take on a worker changes no
        other worker, so the search, whatever its order, places on each worker the tasks that fit
        in its free capacity (``_Index.count``), on the workers ``best`` sees: with ``backfill``
        the held ones whole, the others as ``view`` files them."""
        found = self.view.count(request, eligible, self.held_orders if backfill else _NOBODY, enough)
        if backfill and self.held_slots and found < enough:
            found += self.whole.count(request, eligible, _NOBODY, enough - found)
        return found

    def units(self, request: Resources, eligible: list[bool] | None, backfill: bool) -> list[tuple[int, int]]:
        """(order, tasks of a countable ``request`` it holds) for each worker ``count`` counts."""
        found = self.view.units(request, eligible, self.held_orders if backfill else _NOBODY)
        if backfill and self.held_slots:
            found += self.whole.units(request, eligible, _NOBODY)
        return found

    def take(self, slot: _Slot, request: Resources) -> tuple[int, ...]:
        """Take one task's room on ``slot`` (a placement chosen elsewhere: ``_Layout``)."""
        return self._take(slot, request)

    def give_back(self, placed: Sequence[Take], request: Resources) -> None:
        for slot, taken in reversed(placed):
            self._give_back(slot, request, taken)


class _Layout:
    """The topology-aware placement of gangs (``corral.core.topology``): used for every countable
    gang once any worker carries a topology label, and for a gang that requires a domain even when
    none does (each worker is then a domain of its own). Without labels and requirements the
    cluster's id-order best fit (``_Cluster.attempt``) places every gang, exactly as before."""

    def __init__(self, cluster: _Cluster, levels: tuple[str, ...], labelled: bool) -> None:
        self.cluster = cluster
        self.levels = levels
        self.labelled = labelled
        self._domains: topology.Domains | None = None

    def applies(self, asked: TopologyRequest | None, request: Resources) -> bool:
        if not _countable(request):
            return False
        return self.labelled or (asked is not None and asked.required and asked.level in self.levels)

    def domains(self) -> topology.Domains:
        """The workers' domains, built on first need (from the labels alone: once per cycle)."""
        domains = self._domains
        if domains is None:
            paths = [topology.path_of(slot.worker, self.levels) for slot in self.cluster.slots]
            domains = self._domains = topology.Domains(paths)
        return domains

    def attempt(
        self,
        request: Resources,
        size: int,
        eligible: list[bool] | None,
        backfill: bool,
        asked: TopologyRequest | None,
    ) -> tuple[list[Take] | None, _Room, Reason | None]:
        """The takes for the gang (None when it does not fit), the room found, and the reason a
        gang that fits the cluster but no single domain of its required level waits."""
        cluster = self.cluster
        bound = cluster.room_bound(request, backfill)
        if bound is not None and bound < size:
            return None, _Room(bound, exact=False), None
        counted = cluster.count(request, eligible, backfill, size)
        if counted < size:
            return None, _Room(counted, exact=True), None
        units = cluster.units(request, eligible, backfill)
        required = None
        if asked is not None and asked.required and asked.level in self.levels:
            required = self.levels.index(asked.level)
        plan = self.domains().choose(units, size, required)
        if plan is None:
            assert asked is not None and required is not None
            return None, _Room(counted, exact=True), self._refusal(units, size, asked.level, required)
        placed: list[Take] = []
        for order, count in plan:
            slot = cluster.slots[order]
            placed.extend((slot, cluster.take(slot, request)) for _ in range(count))
        return placed, _Room(size, exact=True), None

    def _refusal(self, units: list[tuple[int, int]], size: int, level: str, required: int) -> Reason:
        """Why a gang that fits the cluster now waits for one domain of its required level: the
        domain that comes closest, its room, and the work that holds the rest of it."""
        domains = self.domains()
        found = domains.closest(units, required)
        if found is None:
            return topology_reason(size, level, None, 0, ())
        node, room = found
        slots = self.cluster.slots
        in_way = sorted(
            {job_id for order in domains.workers_in(node) for _, _, job_id in slots[order].holding}
        )
        return topology_reason(size, level, f"{level}={domains.names[node]}", room, in_way)


def _countable(request: Resources) -> bool:
    """A request whose tasks use up a worker (``_Cluster.count``): one asking for nothing is
    spread one per worker instead, and one asking for VRAM alone would stack without end."""
    return request.gpus > 0 or request.cpus > 0 or request.memory_mb > 0


def _held_tasks(gpus: tuple[int, int], want: int) -> int:
    """The tasks of ``want`` GPUs a held worker adds when seen whole: (whole, view) free GPUs."""
    return gpus[0] // want - gpus[1] // want


@dataclass(frozen=True, slots=True)
class _Room:
    tasks: int
    exact: bool


class _Shapes:
    """Active workers grouped by what they are when idle (capacity, GPU model, labels): the static
    questions (which workers match a gang's constraints and VRAM, how many of its tasks idle workers
    could ever hold) are answered once per shape, not once per worker."""

    def __init__(self, slots: Sequence[_Slot]) -> None:
        groups: dict[tuple[object, ...], int] = {}
        self.representatives: list[_Slot] = []
        self.counts: list[int] = []
        self.shape_of: list[int] = []
        for slot in slots:  # in worker id order: the shape numbering is deterministic
            key = (slot.empty, slot.worker.gpu_model, tuple(sorted(slot.worker.labels.items())))
            shape = groups.get(key)
            if shape is None:
                shape = groups[key] = len(self.representatives)
                self.representatives.append(slot)
                self.counts.append(0)
            self.counts[shape] += 1
            self.shape_of.append(shape)
        self._eligible: dict[tuple[object, ...], list[bool] | None] = {}
        self._ever: dict[tuple[object, ...], int] = {}

    def _matching(self, request: Resources, constraints: Constraints) -> list[bool]:
        return [
            matches_constraints(slot.worker, constraints) is None
            and (request.gpus == 0 or request.vram_mb <= slot.empty.vram_mb)
            for slot in self.representatives
        ]

    def eligible(self, request: Resources, constraints: Constraints) -> list[bool] | None:
        """Per worker order, whether the worker matches the constraints and the VRAM per GPU
        (None: every worker does)."""
        key = (
            constraints.gpu_model,
            tuple(sorted(constraints.labels.items())),
            request.vram_mb if request.gpus else 0,
        )
        if key not in self._eligible:
            matching = self._matching(request, constraints)
            self._eligible[key] = None if all(matching) else [matching[shape] for shape in self.shape_of]
        return self._eligible[key]

    def ever_room(self, request: Resources, constraints: Constraints) -> int:
        """How many tasks of ``request`` the active workers could hold if they were all idle."""
        key = (request, constraints.gpu_model, tuple(sorted(constraints.labels.items())))
        if key not in self._ever:
            matching = self._matching(request, constraints)
            self._ever[key] = sum(
                count * tasks_on(slot.empty, request)
                for slot, count, ok in zip(self.representatives, self.counts, matching, strict=True)
                if ok
            )
        return self._ever[key]


# --- step 6: the head of the queue's hold -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _HoldPlan:
    tasks: tuple[tuple[_Slot, int], ...]  # (worker, tasks it would take), in worker id order
    expected_at: float | None


@dataclass(frozen=True, slots=True)
class _HeadHold:
    gang_id: str
    expected_at: float | None
    holds: tuple[Hold, ...]


def _plan_hold(
    cluster: _Cluster, request: Resources, size: int, eligible: list[bool] | None, now: float
) -> _HoldPlan | None:
    """The workers the head of the queue would run on once the allocations in its way end.

    Each worker that can hold a task at all (constraints, VRAM, and capacity when idle) offers its
    k-th task at the time enough of its allocations have ended for k tasks to fit (ending soonest
    first; reserved and running alike, this cycle's reservations included). The ``size`` offers
    taken are the smallest by, in turn:

    1. that time, known before unknown (an allocation in the way without a walltime);
    2. the best fit on the idle worker (fewest GPUs, CPUs, memory left after the k tasks);
    3. worker id.

    Each worker's offers come in increasing time, so taking them from one heap gives the set whose
    latest time (``expected_at``) is smallest. None when the idle workers cannot hold ``size`` tasks.
    """
    offers: list[tuple[int, float, int, int, int, int, int]] = []
    for slot in cluster.slots:
        if eligible is None or eligible[slot.order]:
            offer = _offer(slot, request, 1, now)
            if offer is not None:
                offers.append(offer)
    heapify(offers)
    counts: dict[int, int] = {}
    latest: float | None = now
    for _ in range(size):
        if not offers:
            return None
        unknown, ready, *_, order, count = heappop(offers)
        counts[order] = count
        latest = None if unknown or latest is None else max(latest, ready)
        if request != Resources():
            offer = _offer(cluster.slots[order], request, count + 1, now)
            if offer is not None:
                heappush(offers, offer)
    return _HoldPlan(tuple((cluster.slots[order], counts[order]) for order in sorted(counts)), latest)


def _offer(
    slot: _Slot, request: Resources, count: int, now: float
) -> tuple[int, float, int, int, int, int, int] | None:
    """The heap entry for ``count`` tasks on ``slot`` (see ``_plan_hold``), None if it never fits."""
    need = _times(request, count)
    empty = slot.empty
    if need.gpus > empty.gpus or need.cpus > empty.cpus or need.memory_mb > empty.memory_mb:
        return None
    gpus, cpus, memory = slot.gpus, slot.cpus, slot.memory
    unknown, ready = 0, now
    if gpus < need.gpus or cpus < need.cpus or memory < need.memory_mb:
        for resources, end, _ in _ending_first(slot.holding):
            gpus, cpus, memory = gpus + resources.gpus, cpus + resources.cpus, memory + resources.memory_mb
            if end is None:
                unknown = 1
            else:
                ready = max(ready, end)
            if min(gpus, empty.gpus) >= need.gpus and cpus >= need.cpus and memory >= need.memory_mb:
                break
        else:  # the books do not add up (a stale allocation): it fits when idle, at an unknown time
            unknown = 1
    left = empty.minus(need)
    return (unknown, 0.0 if unknown else ready, left.gpus, left.cpus, left.memory_mb, slot.order, count)


def _ending_first(holding: list[Holding]) -> list[Holding]:
    """``holding`` sorted in place by expected end, soonest first, unknown last, then job id (a
    total order: sorted only where an offer reads it, it reads what sorting every worker first
    would give)."""
    holding.sort(key=lambda item: (item[1] is None, item[1] or 0.0, item[2]))
    return holding


def _times(request: Resources, count: int) -> Resources:
    return Resources(request.gpus * count, request.vram_mb, request.memory_mb * count, request.cpus * count)


# --- reservations: room kept for the first waiting gangs and jobs (``corral.core.reservations``) --


class _Later:
    """The cycle's reservations: the first ``depth`` gangs and pending jobs, in queue order, that
    cannot start now are booked on the workers' timelines (built on first need from the slots,
    this cycle's placements included), and the room each keeps now is held in the cluster, so the
    rest of the cycle places only work that leaves every reservation its room (a gang uses held
    room only when it ends before every reservation starts; the claim, per hold)."""

    def __init__(self, cluster: _Cluster, now: float, depth: int) -> None:
        self.cluster = cluster
        self.now = now
        self.depth = depth
        self.asked = 0
        self.booked: list[reservations.Planned] = []
        #: the head's hold (``_plan_hold``) when it has no reservation: its expected time, if known
        self.head: dict[str, float | None] = {}
        self._lines: list[reservations.WorkerLine] | None = None
        self._timelines: reservations.Timelines | None = None
        self.earliest: float | None = None  # the soonest start of a booking (-inf: unknown)

    def wanted(self) -> bool:
        return self.asked < self.depth

    def lines(self) -> list[reservations.WorkerLine]:
        lines = self._lines
        if lines is None:
            lines = self._lines = [_line_of(slot, self.now) for slot in self.cluster.slots]
            self._timelines = reservations.Timelines(lines)
        return lines

    def timelines(self) -> reservations.Timelines:
        self.lines()
        assert self._timelines is not None
        return self._timelines

    def placed(self, slot: _Slot, request: Resources, end: float | None, job_id: str) -> None:
        """A placement now: its room leaves the worker's timeline until ``end``."""
        if self._lines is None:
            return
        line = self._lines[slot.order]
        line.free = (
            line.free[0] - request.gpus,
            line.free[1] - request.cpus,
            line.free[2] - request.memory_mb,
        )
        if end is not None:
            insort(line.releases, (end, (request.gpus, request.cpus, request.memory_mb), job_id))
        self.timelines().changed(slot.order)

    def may_backfill(self, walltime_s: float | None) -> bool:
        """A gang may use held room when it ends before every reservation starts."""
        earliest = self.earliest
        return earliest is not None and walltime_s is not None and self.now + walltime_s <= earliest

    def book_gang(self, gang: Gang, eligible: list[bool] | None) -> reservations.Planned | None:
        spec = gang.tasks[0].spec
        return self._book(
            reservations.Ask(gang.gang_id, spec.resources, len(gang.tasks), spec.walltime_s, eligible)
        )

    def book_singles(self, pending: Sequence[Job], shapes: _Shapes) -> None:
        """The pending single jobs that no worker could start now (held room counted as the claim
        counts it for them), in the snapshot's order (queue order), while the depth allows."""
        for job in pending:
            if not self.wanted():
                return
            if job.gang_id is not None:
                continue
            request, constraints = job.spec.resources, job.spec.constraints
            if shapes.ever_room(request, constraints) < 1:
                continue
            eligible = shapes.eligible(request, constraints)
            if self.cluster.fits(request, 1, eligible, self.may_backfill(job.spec.walltime_s)):
                continue
            self._book(reservations.Ask(job.id, request, 1, job.spec.walltime_s, eligible))

    def _book(self, ask: reservations.Ask) -> reservations.Planned | None:
        self.asked += 1
        lines = self.lines()
        planned = self.timelines().book(ask, self.now)
        if planned is None:
            return None
        self.booked.append(planned)
        if self.earliest is None or planned.start < self.earliest:
            self.earliest = planned.start
        for order, _ in planned.tasks:
            self._rehold(lines[order])
        return planned

    def hold_head(
        self, key: str, held: Sequence[tuple[_Slot, Resources]], expected_at: float | None
    ) -> tuple[Hold, ...]:
        """The head's hold when it gets no reservation (its start is unknown, or the depth is 0):
        the room is kept from now on, for good."""
        self.head[key] = expected_at
        self.earliest = float("-inf") if expected_at is None else expected_at
        lines = self.lines()
        holds = []
        for slot, resources in held:
            line = lines[slot.order]
            need = (resources.gpus, resources.cpus, resources.memory_mb)
            self.timelines().add(slot.order, reservations.Booking(key, self.now, None, need))
            self._rehold(line)
            holds.append(Hold(key, slot.worker.id, resources, expected_at))
        return tuple(holds)

    def _rehold(self, line: reservations.WorkerLine) -> None:
        gpus = cpus = memory = 0
        for booking in line.bookings:
            held = booking.need
            gpus, cpus, memory = gpus + held[0], cpus + held[1], memory + held[2]
        self.cluster.hold(self.cluster.slots[line.order], Resources(gpus, 0, memory, cpus))

    def holds(self) -> tuple[Hold, ...]:
        """Every booking as a ``Hold``: its start (the head's expected time when it has no
        reservation) and the room it takes there, by worker id then key (the table's order)."""
        if self._lines is None:
            return ()
        holds = []
        for line in self._lines:
            for booking in sorted(line.bookings, key=lambda booking: booking.key):
                start = self.head.get(booking.key, booking.start)
                need = booking.need
                holds.append(
                    Hold(booking.key, line.worker_id, Resources(need[0], 0, need[2], need[1]), start)
                )
        return tuple(holds)

    def reason(self, planned: reservations.Planned, size: int, now: float) -> Reason:
        lines = self.lines()
        workers = [lines[order].worker_id for order, _ in planned.tasks]
        ending = sorted(
            {job_id for order, _ in planned.tasks for job_id in lines[order].ending_by(planned.start)}
        )
        return reserved_reason(size, planned.start, workers, ending, now)

    def refusal(self, walltime_s: float | None, now: float) -> Reason:
        """A gang that would fit now on held room, which it may not use."""
        if not self.booked:
            head = min(self.head, default="")
            return held_reason(head, self.head.get(head), walltime_s, now)
        first = min(self.booked, key=lambda planned: (planned.start, planned.key))
        return backfill_refused(first.key, first.start, walltime_s)


def _line_of(slot: _Slot, now: float) -> reservations.WorkerLine:
    """A worker's timeline from its slot: free room now, and what its allocations give back when."""
    releases = sorted(
        (now if end < now else end, (resources.gpus, resources.cpus, resources.memory_mb), job_id)
        for resources, end, job_id in slot.holding
        if end is not None
    )
    empty = slot.empty
    return reservations.WorkerLine(
        slot.worker.id,
        slot.order,
        (empty.gpus, empty.cpus, empty.memory_mb),
        (slot.gpus, slot.cpus, slot.memory),
        releases,
    )


__all__ = ["DEFAULT_BACKFILL_DEPTH", "decide"]
