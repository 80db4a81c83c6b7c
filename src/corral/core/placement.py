"""The single-job placement decision: does this job fit this worker, and on which GPUs.

Pure functions over values: the claim path in the store calls them inside its transaction with the
worker's current allocations, and the admission cycle and the simulator call them on what-if copies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral.core import borrowing, lifecycle, protection
from corral.domain.records import Allocation, Constraints, Hold, Job, Reason, Worker
from corral.domain.resources import ZERO, Resources
from corral.domain.status import Status, WorkerStatus
from corral.domain.transitions import Transition


@dataclass(frozen=True, slots=True)
class Capacity:
    """A worker's free capacity: what is left of its resources, and which GPU indices are free."""

    free: Resources
    free_gpu_indices: tuple[int, ...]


def free_capacity(worker: Worker, allocations: Iterable[Allocation]) -> Capacity:
    """Subtract every allocation held on ``worker`` from its registered resources.

    GPU indices that an allocation names are taken, and so are the ones the worker reported
    unhealthy; indices beyond the worker's count (a worker that re-registered with fewer GPUs) are
    ignored rather than going negative.
    """
    # Summed as plain integers, not ``Resources.__add__`` per allocation: a cycle computes this for
    # every worker, a claim for every poll (``Resources.minus`` keeps the worker's VRAM per GPU).
    gpus = memory_mb = cpus = 0
    taken: set[int] = set(worker.unhealthy_gpus)
    for allocation in allocations:
        resources = allocation.resources
        gpus += resources.gpus
        memory_mb += resources.memory_mb
        cpus += resources.cpus
        taken.update(allocation.gpu_indices)
    total = worker.resources
    free_indices = tuple(index for index in range(total.gpus) if index not in taken)
    free_gpus = min(total.gpus - gpus, len(free_indices))
    free = Resources(free_gpus, total.vram_mb, total.memory_mb - memory_mb, total.cpus - cpus)
    return Capacity(free=free, free_gpu_indices=free_indices)


class CycleMemo:
    """What a cycle counted from the workers, for the next cycles: ``free_capacity`` per worker,
    kept while the worker and the records it was counted from are equal to the ones given, in the
    same order (records are immutable values: equal records leave equal capacity); any value
    computed from a list of records alone (``recall``, ``remember``), on the same terms; and tables
    of entries by key (``kept``, ``keep``: the preemption planner's victim units), each of which the
    caller checks against its records before reusing it.

    For a caller that keeps its records between cycles (the simulator keeps a job's row and its
    allocation until they change; the server's store hands back the same records for unchanged
    rows, ``Store.admission_inputs``), the comparison finds the very same objects (the list's ``==``
    checks identity first, in C), and a cycle counts again only the workers whose allocations
    changed. A caller that made new records every cycle would only compare field by field.
    ``space`` keeps apart the callers that count different records."""

    def __init__(self) -> None:
        self._kept: dict[str, dict[str, tuple[Worker, list[Any], Capacity]]] = {}
        self._values: dict[str, tuple[list[Any], Any]] = {}
        self._tables: dict[str, dict[str, Any]] = {}

    def recall(self, space: str, records: list[Any]) -> Any:
        """The value ``remember`` kept under ``space`` for records equal to ``records``, or None."""
        kept = self._values.get(space)
        return kept[1] if kept is not None and kept[0] == records else None

    def remember(self, space: str, records: list[Any], value: Any) -> None:
        """Keep ``value``, computed from ``records`` alone (which the caller leaves as they are)."""
        self._values[space] = (records, value)

    def kept(self, space: str) -> dict[str, Any]:
        """The entries ``keep`` left under ``space`` (empty at first): the caller checks each one is
        still valid for its records."""
        found: dict[str, Any] = self._tables.get(space, {})
        return found

    def keep(self, space: str, entries: dict[str, Any]) -> None:
        """Keep ``entries`` under ``space`` in place of the last ones (what is not in them is dropped)."""
        self._tables[space] = entries

    def get(self, space: str, worker: Worker, records: list[Any]) -> Capacity | None:
        """The capacity kept for ``worker`` counted from ``records``, or None."""
        kept = self._kept.setdefault(space, {}).get(worker.id)
        if kept is not None and (kept[0] is worker or kept[0] == worker) and kept[1] == records:
            return kept[2]
        return None

    def put(self, space: str, worker: Worker, records: list[Any], capacity: Capacity) -> None:
        """Keep ``capacity``, counted for ``worker`` from ``records`` (which the caller leaves as
        they are)."""
        self._kept.setdefault(space, {})[worker.id] = (worker, records, capacity)


def matches_constraints(worker: Worker, constraints: Constraints) -> Reason | None:
    """None when ``worker`` satisfies ``constraints``, else the reason it does not."""
    if constraints.gpu_model is not None and constraints.gpu_model != worker.gpu_model:
        return Reason(
            "gpu_model_mismatch",
            f"needs GPU model {constraints.gpu_model}, worker {worker.id} has {worker.gpu_model}",
        )
    for key, value in sorted(constraints.labels.items()):
        if worker.labels.get(key) != value:
            return Reason("label_mismatch", f"needs label {key}={value}, worker {worker.id} lacks it")
    return None


@dataclass(frozen=True, slots=True)
class Placement:
    """A job fits: it runs on ``worker_id`` with these GPU indices (lowest free first)."""

    worker_id: str
    gpu_indices: tuple[int, ...]


def place(
    request: Resources, constraints: Constraints, worker: Worker, capacity: Capacity
) -> Placement | Reason:
    """Decide whether a job asking for ``request`` fits ``worker`` with free ``capacity``.

    Returns a ``Placement`` naming the GPU indices to use, or the ``Reason`` it does not fit.
    """
    mismatch = matches_constraints(worker, constraints)
    if mismatch is not None:
        return mismatch
    if request.gpus > 0 and worker.resources.gpus == 0:
        return Reason("no_gpus", f"needs {request.gpus} GPU(s), worker {worker.id} has none")
    missing = capacity.free.shortfall(request)
    if missing:
        return Reason(
            "insufficient_capacity",
            f"worker {worker.id} lacks free {', '.join(missing)} for this job",
        )
    return Placement(worker_id=worker.id, gpu_indices=capacity.free_gpu_indices[: request.gpus])


def without_holds(capacity: Capacity, holds: Sequence[Hold]) -> Capacity:
    """The capacity left once the holds are set aside (held GPUs are the highest free indices)."""
    held = ZERO
    for hold in holds:
        held = held + hold.resources
    keep = max(0, len(capacity.free_gpu_indices) - held.gpus)
    free = capacity.free
    return Capacity(
        free=Resources(
            max(0, free.gpus - held.gpus),
            free.vram_mb,
            max(0, free.memory_mb - held.memory_mb),
            max(0, free.cpus - held.cpus),
        ),
        free_gpu_indices=capacity.free_gpu_indices[:keep],
    )


def may_backfill(job: Job, holds: Sequence[Hold], now: float) -> bool:
    """A job may start on held capacity only when its declared walltime ends before every hold on
    the worker is expected to be satisfied (an unknown expectation allows nothing)."""
    walltime = job.spec.walltime_s
    if walltime is None:
        return False
    return all(hold.expected_at is not None and now + walltime <= hold.expected_at for hold in holds)


class ClaimPlacement:
    """The claim's policy, handed to the store: free capacity, then the first candidate that fits,
    then how it starts (``corral.core.lifecycle.start``).

    Candidates arrive in queue order (``corral.domain.queue_order``), so the first one that fits is
    the job the queue says should run next on this worker. Capacity held for a waiting gang is only
    used by a job that backfills (``may_backfill``).
    """

    def start(
        self, job: Job, worker_id: str, gpu_indices: Sequence[int], now: float, claim_key: str | None = None
    ) -> Transition | None:
        return lifecycle.start(job, worker_id, gpu_indices, now, claim_key)

    def capacity(self, worker: Worker, allocations: Sequence[Allocation]) -> Capacity:
        return free_capacity(worker, allocations)

    def reserved_task(self, worker: Worker, allocations: Sequence[Allocation]) -> str | None:
        """A task reserved on the worker goes first (its gang waits for it, seed 001); of several,
        the lowest id. A preemptor's reservation is started only once its victims have left: its
        GPU indices and resources are free of every other allocation on the worker."""
        for allocation in sorted(allocations, key=lambda allocation: allocation.job_id):
            if allocation.status == Status.RESERVED and _room_left_for(allocation, worker, allocations):
                return allocation.job_id
        return None

    def unreclaimable(self, job: Job) -> bool:
        """A job no preemption could take back (``corral.core.borrowing``): the claim then asks
        ``may_borrow`` before starting it."""
        return protection.unreclaimable(job, None)

    def may_borrow(
        self, job: Job, free_gpus: int, guaranteed: Mapping[str, int], held: Mapping[str, int]
    ) -> bool:
        """``borrowing.may_place`` on the cluster as the claim's transaction read it."""
        guarantees = borrowing.Guarantees(
            free_gpus, {p: g for p, g in guaranteed.items() if g > 0}, dict(held)
        )
        return borrowing.may_place(job, job.spec.resources.gpus, guarantees)

    def choose(
        self, worker: Worker, capacity: Capacity, candidates: Sequence[Job], holds: Sequence[Hold], now: float
    ) -> tuple[Job, tuple[int, ...]] | None:
        # ``first_fit`` per candidate, with the held-back capacity computed once, and a candidate
        # that cannot fit it skipped before a reason is worded (a poll may read thousands).
        held_back = without_holds(capacity, holds) if holds else capacity
        for job in candidates:
            usable = capacity if not holds or may_backfill(job, holds, now) else held_back
            if not usable.free.covers(job.spec.resources):
                continue
            decision = place(job.spec.resources, job.spec.constraints, worker, usable)
            if isinstance(decision, Placement):
                return job, decision.gpu_indices
        return None


def first_fit(
    job: Job, worker: Worker, capacity: Capacity, holds: Sequence[Hold], now: float
) -> Placement | Reason:
    """Where ``job`` would go on ``worker`` at a claim now: the claim's own rule (``ClaimPlacement``),
    held capacity included, so ``why`` never says "fits" where every claim would refuse."""
    usable = capacity if not holds or may_backfill(job, holds, now) else without_holds(capacity, holds)
    return place(job.spec.resources, job.spec.constraints, worker, usable)


def _room_left_for(reserved: Allocation, worker: Worker, allocations: Sequence[Allocation]) -> bool:
    others = [allocation for allocation in allocations if allocation.job_id != reserved.job_id]
    capacity = free_capacity(worker, others)
    return capacity.free.covers(reserved.resources) and set(reserved.gpu_indices) <= set(
        capacity.free_gpu_indices
    )


def usable(worker: Worker) -> bool:
    """A worker work may be placed on: active, and not flagged dead (its heartbeat froze while it
    holds running jobs: a reservation there would only expire)."""
    return worker.status == WorkerStatus.ACTIVE and worker.flagged_dead_at is None
