"""The reaper: expired leases, stuck stops, drains to complete, silent workers.

The pass is ``changes.reap`` (each candidate decided by the core on its locked row, so two replicas
reaping at once cannot double-apply); this tick turns its report into metrics and log lines.
"""

from __future__ import annotations

import logging
from functools import partial

from corral.config import ServerSettings
from corral.core.lifecycle import Reported
from corral.domain import errors
from corral.domain.status import Status
from corral.server import changes
from corral.server.loops.drain import record_completion, record_reported
from corral.server.state import ServerState

logger = logging.getLogger("corral.server.reaper")


def reaper_tick(state: ServerState) -> None:
    settings = state.settings
    if not store_takes_writes(state):
        return
    report = changes.reap(
        state.store,
        state.clock.now(),
        heartbeat_timeout_s=settings.heartbeat_timeout_s,
        preempt_timeout_s=settings.preempt_timeout_s,
        worker_offline_s=settings.worker_offline_s,
        hearing=state.hearing,
    )
    for lost in report.lost:
        record_lost(state, lost, "stale heartbeat")
    for reported in report.force_drained:
        job = reported.job
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
        record_reported(state, reported)
    for completion in report.completions:
        record_completion(state, completion)
    if report.offline_workers:
        logger.warning(
            "marked stale workers offline",
            extra={"count": len(report.offline_workers), "worker_ids": list(report.offline_workers)},
        )
    if report.changed:
        state.released()
    purge_logs(state)


def store_takes_writes(state: ServerState) -> bool:
    """Whether the store takes writes: while it is failing, checked with one
    (``store_health.StoreHealth.check``), whose commit is the store's recovery, from which every
    lease counts again. False: still failing, nothing for this pass to do (each of its writes would
    fail too, and no silence counts meanwhile)."""
    store, timeout_s = state.store, state.settings.store_busy_timeout_s
    try:
        state.store_health.check(partial(store.ping, timeout_s, write=True))
    except errors.StoreUnavailable:
        return False
    return True


#: how often the retention purge runs (a pass reads every ended job's finish time)
PURGE_EVERY_S = 3600.0


def purge_logs(state: ServerState) -> None:
    """Remove the logs of jobs that ended more than ``CORRAL_RETENTION_DAYS`` ago, at most once an
    hour per replica (a purge two replicas run at once deletes the same rows twice: harmless)."""
    now = state.clock.now()
    if now - state.logs_purged_at < PURGE_EVERY_S:
        return
    state.logs_purged_at = now
    removed = state.store.logs.purge_logs(now - state.settings.retention_days * 86400.0)
    if removed:
        logger.info("purged job logs past retention", extra={"attempts": removed})


def record_lost(state: ServerState, lost: Reported, why: str) -> None:
    """A job whose worker is gone (lease expired, or the worker no longer lists it): a single job
    re-queued or failed, a gang task's drain."""
    job = lost.job
    if job.gang_id is None and job.status == Status.PENDING:
        state.metrics.jobs_reaped.labels(outcome="requeued").inc()
        logger.warning(f"{why}, re-queuing", extra={"job_id": job.id, "attempt": job.attempts})
    elif job.gang_id is None and job.status == Status.FAILED:
        state.metrics.jobs_reaped.labels(outcome="failed").inc()
        logger.error(
            f"{why}, marking failed",
            extra={"job_id": job.id, "worker_id": job.worker_id, "attempt": job.attempts},
        )
    record_reported(state, lost)


def dead_worker_sweep_tick(state: ServerState) -> None:
    """Flag workers whose heartbeat froze while they hold running jobs (seed 004's orchestrator-side
    detector): one ERROR line and one count per episode, for a host supervisor to act on. The jobs
    themselves are recovered by the lease reaper. The silence counts from when the server could
    hear the worker (``core.hearing``): its start, the store's last recovery."""
    now = state.clock.now()
    flagged = changes.flag_dead_workers(
        state.store.workers, now, state.settings.dead_worker_after_s, state.hearing
    )
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
