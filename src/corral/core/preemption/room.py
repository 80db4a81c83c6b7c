"""The room a plan works with: each usable worker's free capacity as the plan's preemptions and set
asides change it, the workers a preemptor is eligible for, how many of its tasks fit where, and
where its tasks go once its victims have left."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from corral.core.decisions import TaskPlacement
from corral.core.placement import Capacity, matches_constraints
from corral.core.preemption.capacity import Free, capacity_at_start, plus, tasks_fitting
from corral.core.preemption.inputs import PlanInputs, Preemptor
from corral.core.preemption.units import Unit
from corral.domain.records import Allocation, Job
from corral.domain.resources import Resources
from corral.domain.status import Status

__all__ = ["Room"]


@dataclass(slots=True)
class _Answer:
    """``Room.tasks_on``'s answer for one (eligible workers, request), as of ``seen`` touches."""

    eligible: Sequence[str]  # kept alive: the cache is keyed by its id
    allowed: set[str]
    room: dict[str, int]
    seen: int


class Room:
    """The usable workers' free capacity during one plan. Every change of a worker's free capacity
    ``touch``es it: its version moves (a victim set computed at an older version is stale) and the
    cached answers of ``tasks_on`` are brought up to date from the workers touched since."""

    def __init__(self, inputs: PlanInputs) -> None:
        self.holding = inputs.holding
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
            worker.id: Free(
                worker,
                capacity_at_start(worker, by_worker[worker.id], extra.get(worker.id, ()), inputs.memo),
            )
            for worker in sorted(usable, key=lambda w: w.id)
        }
        #: workers with a free GPU: the only ones where a GPU task may fit without a victim
        self.gpu_room = {worker_id for worker_id, free in self.free.items() if free.capacity.free.gpus > 0}
        #: per worker, bumped whenever this cycle's preemptions change it
        self.versions: dict[str, int] = {}
        #: the workers ``touch`` changed, in order, and ``tasks_on``'s answers kept up to date from it
        self._touched: list[str] = []
        self.answers: dict[tuple[int, Resources], _Answer] = {}
        self._eligible: dict[tuple[object, ...], list[str]] = {}
        #: the GPUs free on each worker before the plan changed anything
        self.free_gpus_at_start = {
            worker_id: free.capacity.free.gpus for worker_id, free in self.free.items()
        }

    def free_gpus(self) -> int:
        """The GPUs free on the usable workers, as the plan has them now."""
        return sum(free.capacity.free.gpus for free in self.free.values())

    def eligible_workers(self, first: Job) -> list[str]:
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

    def tasks_on(self, eligible: Sequence[str], request: Resources) -> dict[str, int]:
        """Tasks of ``request`` each eligible worker holds now, where it holds any.

        Kept per (eligible workers, request) and brought up to date from the workers ``touch``
        changed since, instead of counted again over the cluster for every preemptor. The dict
        returned is the cache's: read it before the next call, never change it."""
        key = (id(eligible), request)
        entry = self.answers.get(key)
        if entry is None:
            entry = self.answers[key] = _Answer(
                eligible, set(eligible), self.tasks_counted(eligible, request), len(self._touched)
            )
            return entry.room
        touched = self._touched
        if entry.seen < len(touched):
            room, allowed, free = entry.room, entry.allowed, self.free
            for worker_id in set(touched[entry.seen :]):
                if worker_id in allowed:
                    tasks = tasks_fitting(free[worker_id].capacity.free, request)
                    if tasks:
                        room[worker_id] = tasks
                    else:
                        room.pop(worker_id, None)
            entry.seen = len(touched)
        return entry.room

    def tasks_counted(self, eligible: Sequence[str], request: Resources) -> dict[str, int]:
        """``tasks_on`` counted over the cluster as it is now (its first answer; the tests' reference)."""
        if request.gpus > 0:
            allowed = set(eligible)
            pool: Iterable[str] = (worker_id for worker_id in self.gpu_room if worker_id in allowed)
        else:
            pool = eligible
        room = {}
        for worker_id in pool:
            count = tasks_fitting(self.free[worker_id].capacity.free, request)
            if count:
                room[worker_id] = count
        return room

    def fits_now(self, preemptor: Preemptor, room: Mapping[str, int]) -> bool:
        """Whether the tasks fit on ``room``'s workers counting the stopping victims as still there."""
        request = preemptor.first.spec.resources
        tasks = 0
        for worker_id in room:
            free = self.free[worker_id]
            if worker_id in self.stopping:
                capacity = free.capacity.free
                for job in self.holding:
                    if job.worker_id == worker_id and job.status == Status.PREEMPTING and job.preempted_for:
                        capacity = plus(capacity, job.spec.resources, subtract=True)
                tasks += tasks_fitting(capacity, request)
            else:
                tasks += room[worker_id]
        return tasks >= len(preemptor.tasks)

    def take(self, placements: Sequence[TaskPlacement], request: Resources) -> None:
        """The room these placements use is no one else's this cycle."""
        for placement in placements:
            free = self.free[placement.worker_id]
            taken = set(placement.gpu_indices)
            free.capacity = Capacity(
                plus(free.capacity.free, request, subtract=True),
                tuple(index for index in free.capacity.free_gpu_indices if index not in taken),
            )
            self.touch(placement.worker_id)

    def release(self, chosen: Sequence[Unit]) -> None:
        """What ``chosen`` frees is free (the workers are touched by the caller, once it has placed)."""
        for unit in chosen:
            for worker_id, (resources, indices) in unit.frees.items():
                free = self.free[worker_id]
                free.capacity = Capacity(
                    plus(free.capacity.free, resources),
                    tuple(sorted(set(free.capacity.free_gpu_indices) | set(indices))),
                )

    def touch(self, worker_id: str) -> None:
        self.versions[worker_id] = self.versions.get(worker_id, 0) + 1
        self._touched.append(worker_id)
        if self.free[worker_id].capacity.free.gpus > 0:
            self.gpu_room.add(worker_id)
        else:
            self.gpu_room.discard(worker_id)

    def tasks_with(
        self, chosen: Sequence[Unit], workers: set[str], request: Resources, eligible: AbstractSet[str]
    ) -> int:
        """Tasks of ``request`` that fit on ``workers`` and the ``eligible`` workers ``chosen``
        frees, once it has (a gang victim also frees workers the preemptor may not use)."""
        freed = {worker_id for unit in chosen for worker_id in unit.frees if worker_id in eligible}
        capacity = self.freed_capacity(chosen, workers | freed)
        return sum(tasks_fitting(free, request) for free, _ in capacity.values())

    def freed_capacity(
        self, chosen: Sequence[Unit], workers: set[str]
    ) -> dict[str, tuple[Resources, tuple[int, ...]]]:
        """Each of ``workers``' free capacity (and GPU indices) once ``chosen`` has left (what a
        gang victim frees elsewhere is not counted)."""
        capacity = {
            worker_id: (self.free[worker_id].capacity.free, self.free[worker_id].capacity.free_gpu_indices)
            for worker_id in sorted(workers)
        }
        for unit in chosen:
            for worker_id, (resources, indices) in unit.frees.items():
                if worker_id not in capacity:
                    continue
                have, have_indices = capacity[worker_id]
                capacity[worker_id] = (
                    plus(have, resources),
                    tuple(sorted(set(have_indices) | set(indices))),
                )
        return capacity

    def placements(
        self, preemptor: Preemptor, chosen: Sequence[Unit], workers: set[str], request: Resources
    ) -> list[TaskPlacement] | None:
        """Each task on a worker: free capacity plus what the chosen units free, the workers the
        victims free first (so the freed room is what P uses), then by id."""
        capacity = self.freed_capacity(chosen, workers)
        freed_workers = {worker_id for unit in chosen for worker_id in unit.frees}
        order = sorted(capacity, key=lambda worker_id: (worker_id not in freed_workers, worker_id))
        placements: list[TaskPlacement] = []
        tasks = iter(preemptor.tasks)
        task = next(tasks, None)
        for worker_id in order:
            free, indices = capacity[worker_id]
            while task is not None and tasks_fitting(free, request) >= 1:
                placements.append(TaskPlacement(task.id, worker_id, tuple(indices[: request.gpus])))
                indices = indices[request.gpus :]
                free = plus(free, request, subtract=True)
                task = next(tasks, None)
                if request == Resources():
                    break  # a task asking for nothing: one per worker
        return placements if task is None else None
