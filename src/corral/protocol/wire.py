"""Records to wire objects: the field names and formats of ``shared/API.md``, in one place."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from corral.domain.clock import to_rfc3339
from corral.domain.records import Hold, Job, JobEvent
from corral.domain.status import TERMINAL, Status

#: the statuses a reservation (``corral.core.reservations``) may be kept for
WAITING = frozenset({Status.PENDING, Status.BLOCKED})


def job_to_wire(job: Job, holds: Sequence[Hold] = ()) -> dict[str, Any]:
    """The job object; ``holds``: the holds table (or the part naming the job or its gang), for
    its reservation's ``estimated_start_at`` and ``planned_workers``."""
    spec = job.spec
    return {
        "id": job.id,
        "name": spec.name,
        "command": spec.command,
        "env": spec.env,
        "status": job.status.value,
        "gang_id": job.gang_id,
        "gang_size": spec.gang_size,
        "gang_index": job.gang_index,
        "resources": spec.resources.to_dict(),
        "constraints": spec.constraints.to_dict(),
        "pool": spec.pool,
        "user": spec.user,
        "priority": spec.priority,
        "preemption_class": spec.preemption_class,
        "checkpoint_mode": spec.checkpoint_mode,
        "max_retries": spec.max_retries,
        # attempts that count against max_retries; the claim's ``attempt`` is the fence
        "attempts": job.attempts_used,
        # the run number of the current (or last) attempt: what the events, the claim and
        # CORRAL_ATTEMPT say; larger than ``attempts`` once a run was refunded
        "attempt": job.attempts,
        "watchdog_retries": job.watchdog_retries,
        "preempted_count": job.preempted_count,
        "worker_id": job.worker_id,
        "gpu_indices": list(job.gpu_indices),
        "reservation_epoch": job.reservation_epoch,
        "reserved_at": to_rfc3339(job.reserved_at),
        "preemption_epoch": job.preemption_epoch,
        "drain_started_at": to_rfc3339(job.drain_started_at),
        "submitted_at": to_rfc3339(job.submitted_at),
        "started_at": to_rfc3339(job.started_at),
        "finished_at": to_rfc3339(job.finished_at),
        "last_heartbeat_at": to_rfc3339(job.last_heartbeat_at),
        "exit_code": job.exit_code,
        "error": job.error,
        "output_tail": job.output_tail,
        "reason": job.reason.to_dict() if job.reason else None,
        "has_checkpoint": job.has_checkpoint,
        "progress": job.progress,
        # what its last heartbeat reported: GPU utilisation (%) and its process tree's memory (MB)
        "gpu_util_pct": job.gpu_util_pct,
        "rss_mb": job.rss_mb,
        "budget_s": spec.budget_s,
        "walltime_s": spec.walltime_s,
        # when its worker ends the attempt for its walltime (start + limit), while it runs
        "deadline_at": to_rfc3339(job.deadline_at),
        "stall_timeout_s": spec.stall_timeout_s,
        "workdir": spec.workdir,
        "cancel_requested": job.cancel_requested,
        # preemption (additions to API.md's job object): the job or gang a victim is stopped for,
        # when its checkpoint phase ends, when it last saved, and checkpoint phases it missed
        "preempted_for": job.preempted_for,
        "checkpoint_deadline": to_rfc3339(job.checkpoint_deadline),
        "last_checkpoint_at": to_rfc3339(job.last_checkpoint_at),
        "checkpoint_failures": job.checkpoint_failures,
        "array_id": job.array_id,
        "array_index": job.array_index,
        "array_size": job.array_size,
        "after": [item.to_dict() for item in spec.after],
        "topology": spec.topology.to_dict() if spec.topology is not None else None,
        **reservation_to_wire(job, holds),
    }


def reservation_to_wire(job: Job, holds: Sequence[Hold]) -> dict[str, Any]:
    """When a waiting job (or its gang) is planned to start, and on which workers: from the holds
    with a start kept for it; null and none without a reservation."""
    key = job.gang_id or job.id
    mine = [hold for hold in holds if hold.gang_id == key and hold.expected_at is not None]
    if not mine or job.status not in WAITING:
        return {"estimated_start_at": None, "planned_workers": []}
    start = min(hold.expected_at for hold in mine if hold.expected_at is not None)
    return {
        "estimated_start_at": to_rfc3339(start),
        "planned_workers": sorted({hold.worker_id for hold in mine}),
    }


def event_to_wire(event: JobEvent) -> dict[str, Any]:
    return {
        "at": to_rfc3339(event.at),
        "from": event.from_status.value if event.from_status else None,
        "to": event.to_status.value,
        "reason": event.reason.to_dict() if event.reason else None,
        "epoch": event.epoch,
        "worker_id": event.worker_id,
        "attempt": event.attempt,
    }


def gang_status(tasks: list[Job]) -> str:
    """A gang's status, derived from its tasks (there is no gang row to drift from them).

    Any task failed -> failed; all done -> done; all terminal with a cancel -> cancelled; any task
    draining (preempting/preempted) -> preempting; any running -> running; all reserved or running ->
    reserved; otherwise blocked.
    """
    statuses = {task.status for task in tasks}
    if Status.FAILED in statuses:
        return "failed"
    if statuses == {Status.DONE}:
        return "done"
    if statuses <= TERMINAL:
        return "cancelled"
    if statuses & {Status.PREEMPTING, Status.PREEMPTED}:
        return "preempting"
    if Status.RUNNING in statuses:
        return "running"
    if statuses <= {Status.RESERVED}:
        return "reserved"
    return "blocked"
