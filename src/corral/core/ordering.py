"""Queue order: one comparator, expressed as a sort key.

The key orders pending work by, in turn:

1. preemption class, highest first;
2. priority, highest first;
3. front-of-queue re-queues (a watchdog trip, a preempted victim) before the rest;
4. submission time, oldest first;
5. job id, the final tie-break, so the order never depends on row or dict order.

The store's claim query uses the same criteria in its ``ORDER BY`` (and an index built for it); the
contract tests check that both agree.
"""

from __future__ import annotations

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
