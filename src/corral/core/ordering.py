"""Queue order and gang order: one comparator each, expressed as a sort key.

``queue_key`` is derived from ``corral.domain.queue_order.QUEUE_ORDER``, the declaration the store's
claim ``ORDER BY`` comes from too (its criteria are listed there). ``gang_key`` orders the gangs the
admission cycle places (its criteria are in its docstring).
"""

from __future__ import annotations

from corral.core.snapshot import Gang
from corral.domain.queue_order import QUEUE_ORDER
from corral.domain.records import Job

QueueKey = tuple[float | str, ...]


def queue_key(job: Job) -> QueueKey:
    """The sort key of ``QUEUE_ORDER``: descending criteria negated."""
    return tuple(-float(key.value(job)) if key.descending else key.value(job) for key in QUEUE_ORDER)


def in_queue_order(jobs: list[Job]) -> list[Job]:
    return sorted(jobs, key=queue_key)


GangKey = tuple[int, int, int, int, float, str]


def gang_key(gang: Gang) -> GangKey:
    """Gang admission order, one comparator expressed as a sort key:

    1. size, largest first (a large gang needs the most simultaneous capacity: placing small
       gangs first would crowd it out for good, seed 001);
    2. preemption class, highest first;
    3. priority, highest first;
    4. a gang re-queued at the front (its drain began with a watchdog trip) before the rest of
       its size, class and priority, as a tripped single job goes to the front of its queue;
    5. submission time, oldest first (task 0's ``submitted_at``; every task shares it);
    6. gang id, the final tie-break.
    """
    first = gang.tasks[0]
    return (
        -gang.size,
        -first.spec.preemption_class,
        -first.spec.priority,
        0 if first.queue_front else 1,
        first.submitted_at,
        gang.gang_id,
    )


def in_gang_order(gangs: list[Gang]) -> list[Gang]:
    return sorted(gangs, key=gang_key)
