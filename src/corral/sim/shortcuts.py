"""When the preemption planner provably decides no preemption, so that the engine may skip it.

The engine applies only the decisions that change state (rollbacks, reservations, holds,
preemptions); the planner's waiting reasons, which the server shows in ``why``, it never reads.
Building the planner costs most of a cycle on a large cluster (its units and free capacity over
every allocation, then every preemptor's room), and on a loaded multi-tenant workload most cycles
end without a preemption. ``planner_may_preempt`` says False only when ``corral.core.preemption.plan``
can return no ``Preemption`` for the snapshot; the engine then calls ``admission.decide`` without
the planner, which leaves every other decision as it is (the planner only removes the holds of
the gangs it serves, and it serves none).

The argument, from ``corral.core.preemption.planner.Planner.place`` (the only producer of a ``Preemption``):

1. A preemption without victims is placed only on room that victims of earlier cycles are still
   freeing: on a worker where a job is ``preempting`` for another (``preempted_for``), and only
   when a preemptor's task fits in that worker's free capacity with those victims gone. Without
   rule 2 or 3 no victim is taken in the plan, so that room only shrinks during it (the room it
   sets aside, this cycle's reservations): none at the start, none at all.
2. Otherwise a preemptor needs a victim: a unit of a lower class than its own (``priority``), or,
   when its pool is below its guarantee with its request added (``reclaim``), a borrowed one of
   its class or lower. A preemptor whose class is at most the lowest running class and that does
   not reclaim is told to wait before any victim is looked at.
3. A pool's held GPUs only grow during a plan (the room it sets aside or reserves is booked to the
   preemptor's pool; no victim leaves the books before it has stopped), so a preemptor that does
   not reclaim at the start of the plan does not later in it, nor in the retry of the preemptors
   refused for borrowing.

The preemptors checked here are a superset of the planner's (every gang of the snapshot, not only
the ones the regular placement left waiting), so the answer errs towards running the planner.
A starving pool is one more trigger (its preemptors may take within their own class): the check
answers True while any pool is starving (``snapshot.fair``). ``Engine(verify_shortcuts=True)``
runs the planner anyway and fails on any difference; the engine tests run that way.
"""

from __future__ import annotations

from corral.core import borrowing
from corral.core.placement import free_capacity
from corral.core.preemption.rules import as_preemptor
from corral.core.protection import NEVER_PREEMPTED_CLASS
from corral.core.snapshot import Snapshot
from corral.domain.records import Allocation, Job
from corral.domain.resources import Resources
from corral.domain.status import Status


def planner_may_preempt(snapshot: Snapshot) -> bool:
    """False only when the planner can decide no preemption on ``snapshot`` (module docstring)."""
    lowest = NEVER_PREEMPTED_CLASS  # the lowest running class when nothing runs
    stopping: set[str] = set()
    for job in snapshot.holding:
        if _stopping(job):
            stopping.add(job.worker_id or "")
        elif job.status == Status.RUNNING and job.spec.preemption_class < lowest:
            lowest = job.spec.preemption_class
    preemptors: list[tuple[Job, int]] = [(gang.tasks[0], gang.size) for gang in snapshot.gangs if gang.tasks]
    preemptors.extend((job, 1) for job in snapshot.pending)
    preemptors = [(_as_preemptor(snapshot, job), size) for job, size in preemptors]
    if not preemptors:
        return False
    if any(first.spec.preemption_class > lowest for first, _ in preemptors):
        return True  # rule 2: a lower class runs
    if snapshot.fair is not None and snapshot.fair.anyone_starving():
        return True  # rule 2: a starving pool may take within its class
    guaranteed = {path: pool.guarantee.gpus for path, pool in snapshot.pools.items()}
    if any(gpus > 0 for gpus in guaranteed.values()):
        held = borrowing.Guarantees.of(0, guaranteed, snapshot.holding).held
        for first, size in preemptors:
            guarantee = guaranteed.get(first.spec.pool, 0)
            if guarantee > 0 and held.get(first.spec.pool, 0) + first.spec.resources.gpus * size <= guarantee:
                return True  # rule 2: it may reclaim
    return bool(stopping) and _room_coming_free(
        snapshot, stopping, {job.spec.resources for job, _ in preemptors}
    )


def _as_preemptor(snapshot: Snapshot, job: Job) -> Job:
    """The job as the planner reads it (a sensitive pool's work preempts as class 10)."""
    pool = snapshot.pools.get(job.spec.pool)
    return as_preemptor(job, pool.kind if pool is not None else None)


def _stopping(job: Job) -> bool:
    """A victim of an earlier cycle still stopping: its room is the planner's to give."""
    return job.status == Status.PREEMPTING and job.preempted_for is not None


def _room_coming_free(snapshot: Snapshot, stopping: set[str], requests: set[Resources]) -> bool:
    """Whether a task of one of ``requests`` fits on a worker of ``stopping`` once its stopping
    victims have gone (rule 1), as the planner counts it (``_tasks_fitting`` on ``free_capacity``
    of every other job holding there; this cycle's reservations, left out, only take room)."""
    workers = [worker for worker in snapshot.workers if worker.id in stopping]
    held: dict[str, list[Allocation]] = {worker.id: [] for worker in workers}
    for job in snapshot.holding:
        on = held.get(job.worker_id or "")
        if on is not None and not _stopping(job):
            on.append(
                Allocation(job.id, job.worker_id or "", job.spec.resources, job.gpu_indices, job.status)
            )
    for worker in workers:
        free = free_capacity(worker, held[worker.id]).free
        for request in requests:
            wants = (
                (free.gpus, request.gpus),
                (free.cpus, request.cpus),
                (free.memory_mb, request.memory_mb),
            )
            if all(max(0, have) >= want for have, want in wants if want > 0):
                return True
    return False
