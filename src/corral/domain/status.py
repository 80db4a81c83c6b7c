"""Job statuses and the allowed transitions: the single source of truth for the life cycle.

The store checks every transition it writes against ``ALLOWED_TRANSITIONS`` and the tests walk the
table, so a transition that is not listed here cannot happen anywhere in corral.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    PENDING = "pending"
    BLOCKED = "blocked"
    RESERVED = "reserved"
    RUNNING = "running"
    PREEMPTING = "preempting"
    PREEMPTED = "preempted"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL

    @property
    def holds_resources(self) -> bool:
        """Reserved capacity is committed capacity, and a preempting job still holds its GPUs."""
        return self in HOLDING


TERMINAL = frozenset({Status.DONE, Status.FAILED, Status.CANCELLED})
HOLDING = frozenset({Status.RESERVED, Status.RUNNING, Status.PREEMPTING})
#: a job whose attempt holds a lease: its heartbeats renew it (and a stop is answered through them)
LEASED = frozenset({Status.RUNNING, Status.PREEMPTING})
NON_TERMINAL = frozenset(set(Status) - TERMINAL)

ALLOWED_TRANSITIONS: dict[Status, frozenset[Status]] = {
    # pending: claimed, reserved by admission, or cancelled.
    Status.PENDING: frozenset({Status.RUNNING, Status.RESERVED, Status.BLOCKED, Status.CANCELLED}),
    # blocked: a gang task waiting for admission.
    Status.BLOCKED: frozenset({Status.RESERVED, Status.CANCELLED, Status.FAILED}),
    # reserved: claimed by the assigned worker, or rolled back.
    Status.RESERVED: frozenset({Status.RUNNING, Status.BLOCKED, Status.PENDING, Status.CANCELLED}),
    # running: finished, failed (retry or not), drained, preempted, tripped, reaped or cancelled.
    # running -> preempted is the trigger of a gang drain: its process is already gone (it failed,
    # tripped a watchdog, or its worker went silent), so no stop is asked and no ack can come.
    Status.RUNNING: frozenset(
        {Status.DONE, Status.PENDING, Status.FAILED, Status.PREEMPTING, Status.PREEMPTED, Status.CANCELLED}
    ),
    # preempting: acked or force-drained; a cancel with grace ends here too, and a job that
    # completed just as it was told to stop keeps its result.
    Status.PREEMPTING: frozenset({Status.PREEMPTED, Status.CANCELLED, Status.DONE}),
    # preempted: drain completion or victim re-queue.
    Status.PREEMPTED: frozenset({Status.PENDING, Status.BLOCKED, Status.FAILED, Status.CANCELLED}),
    Status.DONE: frozenset(),
    Status.FAILED: frozenset(),
    Status.CANCELLED: frozenset(),
}


def is_allowed(source: Status | None, target: Status) -> bool:
    """True when ``source -> target`` is in the table. ``None`` is the submit (pending or blocked)."""
    if source is None:
        return target in (Status.PENDING, Status.BLOCKED)
    return target in ALLOWED_TRANSITIONS[source]


class WorkerStatus(StrEnum):
    ACTIVE = "active"
    OFFLINE = "offline"
    DRAINING = "draining"
