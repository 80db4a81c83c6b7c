"""Metrics and the log lines that tell one gang's drain story (seed 000's observability):

``gang drain started`` (trigger_job_id, transitioned) -> ``job preempted`` per task ->
``gang drain completed`` (outcome) -> ``gang reserved`` (gang_size), all with ``gang_id`` and
``preemption_epoch``. Each is told from the typed outcome the core returned, never guessed from
the rows afterwards.
"""

from __future__ import annotations

import logging

from corral.core.drain import DrainCompleted, DrainStarted
from corral.core.lifecycle import Reported
from corral.domain.records import Job
from corral.domain.status import Status
from corral.server.state import ServerState

logger = logging.getLogger("corral.server.drain")


def record_reported(state: ServerState, reported: Reported) -> None:
    """Tell what a decision did to a gang: the drain it started, the stop it ended, the drain it
    completed. A single job's outcome is the caller's to tell."""
    if reported.drain is not None:
        record_drain(state, reported.drain)
    if reported.preempted:
        record_preempted(reported.job)
    if reported.failed_checkpoint:
        state.metrics.preemption_failed_checkpoint.inc()
    if reported.requeued:
        state.metrics.preemption_victim_requeue.inc()
        logger.info(
            "preempted job re-queued",
            extra={"job_id": reported.job.id, "preempted_count": reported.job.preempted_count},
        )
    if reported.completion is not None:
        record_completion(state, reported.completion)


def record_drain(state: ServerState, drain: DrainStarted) -> None:
    state.metrics.gangs_preempted.inc()
    state.metrics.preemptions.labels(reason="gang", pool=drain.trigger.spec.pool).inc()
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


def record_completion(state: ServerState, completion: DrainCompleted) -> None:
    state.metrics.gang_drains_completed.labels(outcome=completion.outcome).inc()
    if completion.drain_seconds is not None:
        state.metrics.gang_drain_seconds.observe(completion.drain_seconds)
    # A rank's watchdog trip under the cap is settled here: re-queued with the gang, or not.
    trip_outcome = "requeued" if completion.outcome == "blocked" else "failed"
    for kind in completion.watchdog_trips:
        state.metrics.watchdog_trips.labels(kind=kind, outcome=trip_outcome).inc()
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
    if completion.preempted_for is not None:
        state.metrics.preemption_victim_requeue.inc()
    if completion.outcome == "blocked":
        state.released(gang_waiting=True)
