"""The stable reason codes, and their messages, for gangs the admission cycle leaves waiting.

``corral.core.admission`` decides; this module only words the outcome, so that ``corral why`` can
show a gang's ``Reason``: ``no_workers``, ``unschedulable``, ``head_of_queue``, ``held_for_gang``,
``insufficient_capacity``. The codes are stable (machines read them); the messages are for people.
Pure text from values: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.domain.clock import to_rfc3339
from corral.domain.records import Constraints, Reason, Worker
from corral.domain.resources import Resources

NO_WORKERS = Reason("no_workers", "no active worker is registered: start one with `corral worker`")


def describe(request: Resources, constraints: Constraints | None = None) -> str:
    """What work asks of a worker, for people: ``2 GPU(s) with 1000 MB VRAM each, GPU model A100``."""
    parts = []
    if request.gpus:
        vram = f" with {request.vram_mb} MB VRAM each" if request.vram_mb else ""
        parts.append(f"{request.gpus} GPU(s){vram}")
    if request.cpus:
        parts.append(f"{request.cpus} CPU(s)")
    if request.memory_mb:
        parts.append(f"{request.memory_mb} MB memory")
    text = ", ".join(parts) or "no resources"
    if constraints is not None and constraints.gpu_model is not None:
        text += f", GPU model {constraints.gpu_model}"
    if constraints is not None and constraints.labels:
        text += ", labels " + ",".join(f"{key}={value}" for key, value in sorted(constraints.labels.items()))
    return text


def unschedulable(
    size: int, request: Resources, constraints: Constraints, ever: int, active: Sequence[Worker]
) -> Reason:
    """The gang needs more tasks at once than the active workers could hold (``ever``) even idle."""
    if ever == 0:
        largest = max(worker.resources.gpus for worker in active)
        return Reason(
            "unschedulable",
            f"no active worker can ever hold a task: needs {describe(request, constraints)}; "
            f"the largest worker has {largest} GPU(s)",
        )
    return Reason(
        "unschedulable",
        f"needs {size} tasks of {describe(request, constraints)} at once; "
        f"the active workers could hold {ever} even if idle",
    )


def _room_text(room_tasks: int, room_exact: bool) -> str:
    return f"room for {room_tasks} now" if room_exact else f"room for at most {room_tasks} now"


def short_reason(size: int, request: Resources, room_tasks: int, room_exact: bool) -> Reason:
    """Not enough free capacity now: room for ``room_tasks`` (at most, unless ``room_exact``)."""
    return Reason(
        "insufficient_capacity",
        f"needs {size} tasks of {describe(request)} at once; {_room_text(room_tasks, room_exact)}",
    )


def _when(expected_at: float | None, now: float) -> str:
    if expected_at is None:
        return "at an unknown time (a job in the way declared no walltime)"
    return f"in about {max(0.0, expected_at - now):.0f} s"


def head_reason(
    size: int,
    request: Resources,
    room_tasks: int,
    room_exact: bool,
    workers: int,
    expected_at: float | None,
    now: float,
) -> Reason:
    """The head of the queue: capacity held for it on ``workers`` workers until ``expected_at``."""
    return Reason(
        "head_of_queue",
        f"first in line: needs {size} tasks of {describe(request)} at once; "
        f"{_room_text(room_tasks, room_exact)}; "
        f"capacity held on {workers} worker(s), expected free {_when(expected_at, now)}",
    )


def held_reason(head_gang_id: str, expected_at: float | None, walltime_s: float | None, now: float) -> Reason:
    """It would fit now, but only on capacity held for the head of the queue, which it may not
    backfill (``walltime_s`` missing, or ending after ``expected_at``)."""
    if expected_at is None:
        rule = "nothing may backfill it"
    elif walltime_s is None:
        rule = "declare a walltime_s that ends before then to backfill"
    else:
        rule = f"its walltime_s ({walltime_s:g} s) ends after that"
    return Reason(
        "held_for_gang",
        f"held capacity for gang {head_gang_id}: it would fit now, but that capacity is kept for the gang "
        f"first in line, expected free {_when(expected_at, now)}; {rule}",
    )


def reserved_reason(
    size: int, start: float, workers: Sequence[str], ending: Sequence[str], now: float
) -> Reason:
    """A reservation (``corral.core.reservations``): the gang or job starts at ``start`` on
    ``workers``, once the jobs ``ending`` reach their limits."""
    what = f"{size} tasks" if size > 1 else "the job"
    places = ", ".join(workers)
    if start <= now:
        return Reason("reserved_for_later", f"planned to start now on {places}: the room is held for {what}")
    when = f"when jobs {_names(ending)} reach their limits" if ending else "when room frees up"
    return Reason("reserved_for_later", f"planned to start at {to_rfc3339(start)} on {places} {when}")


def backfill_refused(key: str, start: float, walltime_s: float | None) -> Reason:
    """It would fit now, but only on room reserved for ``key`` from ``start``, which its walltime
    (none, or one ending later) would delay."""
    own = (
        "it declares no walltime_s" if walltime_s is None else f"its walltime_s ({walltime_s:g} s) ends later"
    )
    return Reason(
        "backfill_refused",
        f"would delay gang {key} planned for {to_rfc3339(start)} ({own}); "
        f"a walltime_s ending before {to_rfc3339(start)} lets it start",
    )


def _names(job_ids: Sequence[str], most: int = 5) -> str:
    shown = ", ".join(job_ids[:most])
    return shown if len(job_ids) <= most else f"{shown} and {len(job_ids) - most} more"


__all__ = [
    "NO_WORKERS",
    "backfill_refused",
    "describe",
    "head_reason",
    "held_reason",
    "reserved_reason",
    "short_reason",
    "unschedulable",
]


def topology_reason(size: int, level: str, closest: str | None, room: int, in_way: Sequence[str]) -> Reason:
    """A gang whose ``required`` topology level has no single domain with room for all its tasks
    now (API.md "Topology"), though the cluster as a whole has: the domain that comes closest,
    and the work in the way there (the first few ids)."""
    if closest is None:
        return Reason("topology", f"needs its {size} tasks inside one {level}; no {level} has room now")
    text = f"needs its {size} tasks inside one {level}; the closest, {closest}, has room for {room} now"
    if in_way:
        shown = ", ".join(in_way[:5]) + (f" and {len(in_way) - 5} more" if len(in_way) > 5 else "")
        text += f" (in the way: {shown})"
    return Reason("topology", text)
