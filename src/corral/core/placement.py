"""The single-job placement decision: does this job fit this worker, and on which GPUs.

Pure functions over values: the claim (``corral.core.claim``) calls them with the worker's current
allocations, and the admission cycle and the simulator on what-if copies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from corral.domain.records import Allocation, Constraints, Hold, Job, Reason, Worker
from corral.domain.resources import ZERO, Resources
from corral.domain.status import WorkerStatus

R = TypeVar("R")
V = TypeVar("V")


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


class CapacityKept(Generic[R]):
    """Each worker's free capacity counted from a list of records (its allocations, or the jobs it
    runs), kept for the next cycles while the worker and the records are equal to the ones given,
    in the same order (records are immutable values: equal records leave equal capacity).

    For a caller that keeps its records between cycles (the simulator keeps a job's row and its
    allocation until they change; the server's store hands back the same records for unchanged
    rows, ``Gangs.admission_inputs``), the comparison finds the very same objects (the list's ``==``
    checks identity first, in C), and a cycle counts again only the workers whose records changed.
    A caller that made new records every cycle would only compare field by field."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: dict[str, tuple[Worker, list[R], Capacity]] = {}

    def get(self, worker: Worker, records: list[R]) -> Capacity | None:
        """The capacity kept for ``worker`` counted from ``records``, or None."""
        kept = self._kept.get(worker.id)
        if kept is not None and (kept[0] is worker or kept[0] == worker) and kept[1] == records:
            return kept[2]
        return None

    def put(self, worker: Worker, records: list[R], capacity: Capacity) -> None:
        """Keep ``capacity``, counted for ``worker`` from ``records`` (which the caller leaves as
        they are)."""
        self._kept[worker.id] = (worker, records, capacity)


class Remembered(Generic[R, V]):
    """A value computed from a list of records alone, kept while the records are equal to the ones
    it was computed from (on the terms of ``CapacityKept``)."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: tuple[list[R], V] | None = None

    def recall(self, records: list[R]) -> V | None:
        """The value kept for records equal to ``records``, or None."""
        kept = self._kept
        return kept[1] if kept is not None and kept[0] == records else None

    def remember(self, records: list[R], value: V) -> None:
        """Keep ``value``, computed from ``records`` alone (which the caller leaves as they are)."""
        self._kept = (records, value)


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


def holds_in_way(job: Job, holds: Sequence[Hold], now: float) -> tuple[Hold, ...]:
    """The holds on a worker whose room ``job`` may not use (a reservation, ``corral.core.reservations``,
    is a hold with a start): those that start before the job's own deadline (now + its walltime;
    without one, every hold), or at an unknown time. A job's own reservation is never in its way."""
    walltime = job.spec.walltime_s
    own = (job.id, job.gang_id)
    if walltime is None:
        return tuple(hold for hold in holds if hold.gang_id not in own)
    deadline = now + walltime
    return tuple(
        hold
        for hold in holds
        if hold.gang_id not in own and (hold.expected_at is None or hold.expected_at < deadline)
    )


def first_fit(
    job: Job, worker: Worker, capacity: Capacity, holds: Sequence[Hold], now: float
) -> Placement | Reason:
    """Where ``job`` would go on ``worker`` at a claim now: the claim's own rule (``corral.core.claim``),
    held capacity included, so ``why`` never says "fits" where every claim would refuse."""
    in_way = holds_in_way(job, holds, now) if holds else ()
    usable = without_holds(capacity, in_way) if in_way else capacity
    return place(job.spec.resources, job.spec.constraints, worker, usable)


def usable(worker: Worker) -> bool:
    """A worker work may be placed on: active, and not flagged dead (its heartbeat froze while it
    holds running jobs: a reservation there would only expire)."""
    return worker.status == WorkerStatus.ACTIVE and worker.flagged_dead_at is None
