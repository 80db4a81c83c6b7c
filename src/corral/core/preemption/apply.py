"""Applying a preemption in one transaction (``start_preemption``): the victims go ``preempting``
(each with the job or gang it is stopped for, and, when it checkpoints, its checkpoint phase), and
the preemptor is reserved on the capacity they hold, with ``victims_deadline``: the claim starts it
once they have left, and its reservation does not expire before then. No lower job slips in while
the victims stop: the worker's books count both the victims and the preemptor's reservation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from corral.core import drain
from corral.core.decisions import Preemption, TaskPlacement, Victim
from corral.core.placement import free_capacity
from corral.core.preemption.limits import limited_pool
from corral.domain.records import Allocation, Job, Reason, Worker
from corral.domain.resources import Resources
from corral.domain.status import Status
from corral.domain.transitions import Plan, Transition, move

__all__ = ["PreemptionStarted", "start_preemption", "victim_message"]


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
    if not preemption.job_ids:
        return _stop_for_limits(preemption, jobs, now, checkpoint_timeout_s)
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


def _stop_for_limits(
    preemption: Preemption, jobs: Mapping[str, Job], now: float, checkpoint_timeout_s: float
) -> Plan[PreemptionStarted | None]:
    """A preemption with no preemptor (``limits.over_limits``: a pool over its limits): the
    victims stop as any victim does, nothing is reserved; nothing at all when a victim is no
    longer what was planned."""
    victims = _victim_rows(preemption, jobs)
    if victims is None:
        return Plan((), None)
    transitions: list[Transition] = []
    for victim, rows in zip(preemption.victims, victims, strict=True):
        transitions.extend(_stop_victim(victim, rows, preemption, now, checkpoint_timeout_s))
    stopped = tuple(transition.after for transition in transitions)
    return Plan(tuple(transitions), PreemptionStarted(preemption, (), stopped))


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


def victim_message(victim: Victim, preemptor: str, pool: str) -> str:
    """What a victim (of pool ``pool``) is told, by trigger; its wire code is ``preempted_<trigger>``."""
    if victim.reason == "pool_limit":
        path = limited_pool(preemptor) or pool
        return (
            f"preempted to bring pool {path} back within its limits (they are below what it runs);"
            f" cost {victim.cost:.0f} GPU-seconds"
        )
    if victim.reason == "priority":
        why = "(a higher preemption class) for priority"
    elif victim.reason == "fair_share":
        why = f"for fair share: its pool {pool} runs above its fair share and a starving pool needs the room"
    else:
        why = "to reclaim its pool's guaranteed capacity this job borrowed"
    return f"preempted by {preemptor} {why}; cost {victim.cost:.0f} GPU-seconds"


def _stop_victim(
    victim: Victim, rows: Sequence[Job], preemption: Preemption, now: float, checkpoint_timeout_s: float
) -> list[Transition]:
    epoch = max(row.preemption_epoch for row in rows) + 1
    message = victim_message(victim, preemption.preemptor, rows[0].spec.pool)
    transitions: list[Transition] = []
    for row in rows:
        if row.status == Status.RUNNING:
            checkpoints = row.spec.checkpoint_mode != "none"
            phase: dict[str, object] = {}
            if checkpoints:
                # the phase's clock starts now; the worker is asked at its next heartbeat (the
                # hint sets ``checkpoint_requested_at``: ``lifecycle.heartbeat_action``)
                phase = {
                    "checkpoint_requested_at": None,
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
