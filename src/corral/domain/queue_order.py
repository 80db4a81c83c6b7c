"""The queue order, declared once: the store's claim ``ORDER BY`` and the core's sort key are both
derived from ``QUEUE_ORDER``, so the job a claim takes is the one the core says is next.

Pending work is ordered by, in turn:

1. preemption class, highest first;
2. priority, highest first;
3. front-of-queue re-queues (a watchdog trip, a preempted victim) before the rest;
4. submission time, oldest first;
5. job id, the final tie-break, so the order never depends on row or dict order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from corral.domain.records import Job
from corral.domain.status import Status


@dataclass(frozen=True, slots=True)
class OrderBy:
    """One criterion: the column the store sorts on, the same value read off a ``Job``, and the
    direction. Only numeric criteria may be descending (the key negates them)."""

    column: str
    value: Callable[[Job], float | str]
    descending: bool = False


QUEUE_ORDER: tuple[OrderBy, ...] = (
    OrderBy("preemption_class", lambda job: job.spec.preemption_class, descending=True),
    OrderBy("priority", lambda job: job.spec.priority, descending=True),
    OrderBy("queue_front", lambda job: int(job.queue_front), descending=True),
    OrderBy("submitted_at", lambda job: job.submitted_at),
    OrderBy("id", lambda job: job.id),
)


def order_by_sql(order: tuple[OrderBy, ...] = QUEUE_ORDER) -> str:
    """``preemption_class DESC, priority DESC, ...``: the claim query's ORDER BY."""
    return ", ".join(f"{key.column} DESC" if key.descending else key.column for key in order)


#: pending single jobs a cycle reads as possible preemptors, at most: the store's read and the
#: simulator's take the same number (``preemptor_floor`` says which)
PREEMPTOR_CANDIDATES = 1000


def preemptor_floor(holding: Iterable[Job]) -> int | None:
    """The lowest preemption class among running jobs: pending single jobs of that class or above,
    in queue order, are a cycle's possible preemptors (no job may take from a class above its
    own; the fair-share trigger adds the starving pools' jobs apart). None: nothing runs, so no
    pending job can preempt."""
    return min((job.spec.preemption_class for job in holding if job.status == Status.RUNNING), default=None)
