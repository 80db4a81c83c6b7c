"""Queue order and gang order: one comparator each, expressed as a sort key.

``queue_key`` orders pending work by, in turn:

1. preemption class, highest first;
2. priority, highest first;
3. front-of-queue re-queues (a watchdog trip, a preempted victim) before the rest;
4. submission time, oldest first;
5. job id, the final tie-break, so the order never depends on row or dict order.

The store's claim query uses the same criteria in its ``ORDER BY`` (and an index built for it); the
contract tests check that both agree. ``gang_key`` orders the gangs the admission cycle places
(its criteria are in its docstring).
"""

from __future__ import annotations

from corral.core.snapshot import Gang
from corral.domain.records import Job

QueueKey = tuple[int, int, int, float, str]


def queue_key(job: Job) -> QueueKey:
    return (
        -job.spec.preemption_class,
        -job.spec.priority,
        0 if job.queue_front else 1,
        job.submitted_at,
        job.id,
    )


def in_queue_order(jobs: list[Job]) -> list[Job]:
    return sorted(jobs, key=queue_key)


GangKey = tuple[int, int, int, float, str]


def gang_key(gang: Gang) -> GangKey:
    """Gang admission order, one comparator expressed as a sort key:

    1. size, largest first (a large gang needs the most simultaneous capacity: placing small
       gangs first would crowd it out for good, seed 001);
    2. preemption class, highest first;
    3. priority, highest first;
    4. submission time, oldest first (task 0's ``submitted_at``; every task shares it);
    5. gang id, the final tie-break.
    """
    first = gang.tasks[0]
    return (-gang.size, -first.spec.preemption_class, -first.spec.priority, first.submitted_at, gang.gang_id)


def in_gang_order(gangs: list[Gang]) -> list[Gang]:
    return sorted(gangs, key=gang_key)
