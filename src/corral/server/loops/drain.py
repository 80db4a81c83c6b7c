"""Metrics and the log lines that tell one gang's drain story (seed 000's observability):

``gang drain started`` (trigger_job_id, transitioned) -> ``job preempted`` per task ->
``gang drain completed`` (outcome) -> ``gang reserved`` (gang_size), all with ``gang_id`` and
``preemption_epoch``.
"""

from __future__ import annotations

import logging

from corral.domain.records import Job
from corral.domain.status import Status
from corral.server.state import ServerState
from corral.store.base import Drain, DrainCompletion

logger = logging.getLogger("corral.server.drain")


def record_drain(state: ServerState, drain: Drain) -> None:
    state.metrics.gangs_preempted.inc()
    state.metrics.preemptions.labels(reason="gang").inc()
    logger.warning(
        "gang drain started",
        extra={
            "gang_id": drain.gang_id,
            "trigger_job_id": drain.trigger.id,
            "preemption_epoch": drain.epoch,
            "transitioned": len(drain.transitioned),
            "reason": drain.trigger.reason.message if drain.trigger.reason else None,
        },
    )
    for job in drain.transitioned:
        if job.status == Status.PREEMPTED:
            record_preempted(job)
    state.released()


def drain_started_by(state: ServerState, trigger: Job, now: float) -> None:
    """A report (``/fail``, ``/watchdog``) made at ``now`` moved a gang task: if that report started
    a drain (the drain is stamped with its time), tell its story. A peer that was already stopping
    and reports its own exit started nothing."""
    if trigger.gang_id is None or trigger.drain_started_at != now:
        return
    if trigger.status not in (Status.PREEMPTED, Status.FAILED):
        return
    tasks = state.store.gang_tasks(trigger.gang_id)
    epoch = max(task.preemption_epoch for task in tasks)
    transitioned = tuple(task for task in tasks if task.preemption_epoch == epoch)
    record_drain(
        state, Drain(gang_id=trigger.gang_id, epoch=epoch, trigger=trigger, transitioned=transitioned)
    )


def record_preempted(job: Job) -> None:
    logger.info(
        "job preempted",
        extra={
            "job_id": job.id,
            "gang_id": job.gang_id,
            "worker_id": job.worker_id,
            "preemption_epoch": job.preemption_epoch,
        },
    )


def complete_if_drained(state: ServerState, job: Job) -> None:
    """After a gang task stopped (acked, or was the drain's only running task), end the drain now."""
    if job.gang_id is None:
        return
    completion = state.store.complete_drain(job.gang_id, state.clock.now())
    if completion is not None:
        record_completion(state, completion)


def record_completion(state: ServerState, completion: DrainCompletion) -> None:
    state.metrics.gang_drains_completed.labels(outcome=completion.outcome).inc()
    if completion.drain_seconds is not None:
        state.metrics.gang_drain_seconds.observe(completion.drain_seconds)
    log = logger.error if completion.outcome == "failed" else logger.info
    log(
        "gang drain completed",
        extra={
            "gang_id": completion.gang_id,
            "preemption_epoch": completion.epoch,
            "outcome": completion.outcome,
            "drain_s": round(completion.drain_seconds, 3) if completion.drain_seconds is not None else None,
        },
    )
    if completion.outcome == "blocked":
        state.released(gang_waiting=True)
