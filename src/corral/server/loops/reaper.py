"""The reaper: expired leases, stuck stops, silent workers (see ``Store.reap``).

The pass itself is in the store (each change a compare-and-set, so two replicas reaping at once
cannot double-apply); this tick turns its report into metrics and log lines.
"""

from __future__ import annotations

import logging

from corral.config import ServerSettings
from corral.domain.status import Status
from corral.server.loops.drain import record_completion, record_drain, record_preempted
from corral.server.state import ServerState

logger = logging.getLogger("corral.server.reaper")


def reaper_tick(state: ServerState) -> None:
    settings = state.settings
    report = state.store.reap(
        state.clock.now(),
        heartbeat_timeout_s=settings.heartbeat_timeout_s,
        preempt_timeout_s=settings.preempt_timeout_s,
        worker_offline_s=settings.worker_offline_s,
    )
    for job in report.requeued:
        state.metrics.jobs_reaped.labels(outcome="requeued").inc()
        logger.warning("stale heartbeat, re-queuing", extra={"job_id": job.id, "attempt": job.attempts})
    for job in report.failed:
        state.metrics.jobs_reaped.labels(outcome="failed").inc()
        logger.error(
            "stale heartbeat, marking failed",
            extra={"job_id": job.id, "worker_id": job.worker_id, "attempt": job.attempts},
        )
    for job in report.force_drained:
        if job.gang_id is not None:
            state.metrics.gang_force_drained.inc()
        logger.warning(
            "force-drained stuck preempting job",
            extra={
                "job_id": job.id,
                "gang_id": job.gang_id,
                "worker_id": job.worker_id,
                "preemption_epoch": job.preemption_epoch,
            },
        )
        if job.status == Status.PREEMPTED:
            record_preempted(job)
    for drain in report.drains:
        record_drain(state, drain)
    for completion in report.completions:
        record_completion(state, completion)
    if report.offline_workers:
        logger.warning(
            "marked stale workers offline",
            extra={"count": len(report.offline_workers), "worker_ids": list(report.offline_workers)},
        )
    if report.requeued or report.force_drained or report.completions:
        state.released()


def dead_worker_sweep_tick(state: ServerState) -> None:
    """Flag workers whose heartbeat froze while they hold running jobs (seed 004's orchestrator-side
    detector): one ERROR line and one count per episode, for a host supervisor to act on. The jobs
    themselves are recovered by the lease reaper."""
    flagged = state.store.flag_dead_workers(state.clock.now(), state.settings.dead_worker_after_s)
    for worker, running in flagged:
        state.metrics.dead_workers_flagged.inc()
        silent = state.clock.now() - (worker.last_heartbeat_at or worker.registered_at)
        logger.error(
            "DEAD WORKER",
            extra={"worker_id": worker.id, "running_jobs": running, "silent_s": round(silent, 1)},
        )


def dead_worker_sweep_interval(settings: ServerSettings) -> float:
    """Sweep often enough to flag within a third of the threshold, at most every 5 s (the seed's)."""
    return max(0.05, min(5.0, settings.dead_worker_after_s / 3))
