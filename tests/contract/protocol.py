"""The server's state changes as the contract tests make them: each is the core decision the server
applies through the store (``corral.server.changes``), so these tests cover the store and the core
together, on SQLite and PostgreSQL, the way the server uses them. Each answers the job as it is now.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.core import lifecycle
from corral.core.drain import DrainCompleted, DrainStarted
from corral.domain.records import Job, JobSpec
from corral.domain.status import Status
from corral.server import changes
from corral.store import Store
from corral.store.base import JobReport


def submit(store: Store, specs: list[JobSpec], now: float, key: str | None = None, fingerprint: str = ""):
    """Submit as the server does: the core makes the jobs, the store inserts them."""
    return store.jobs.submit(lifecycle.submitted(specs, now), now, key, fingerprint)


def complete(store: Store, job_id: str, worker_id: str, attempt: int, now: float) -> Job:
    return changes.report_done(store.jobs, job_id, worker_id, attempt, now).job


def fail(
    store: Store,
    job_id: str,
    worker_id: str,
    attempt: int,
    now: float,
    exit_code: int | None,
    error: str | None = None,
    output_tail: str | None = None,
    release: bool = False,
) -> Job:
    return changes.report_failure(
        store.jobs, job_id, worker_id, attempt, now, exit_code, error, output_tail, release
    ).job


def ack_preempted(store: Store, job_id: str, worker_id: str, attempt: int, epoch: int, now: float) -> Job:
    return changes.acknowledge_stop(store.jobs, job_id, worker_id, attempt, epoch, now).job


def watchdog_trip(
    store: Store,
    job_id: str,
    worker_id: str,
    attempt: int,
    now: float,
    kind: str,
    detail: str,
    max_retries: int,
) -> Job:
    return changes.report_trip(store.jobs, job_id, worker_id, attempt, now, kind, detail, max_retries).job


def cancel(store: Store, job_id: str, now: float) -> tuple[Job, ...]:
    return changes.cancel(store.jobs, job_id, now)


def heartbeat_job(
    store: Store, job_id: str, worker_id: str, attempt: int, now: float, progress: dict | None = None
) -> Job:
    return changes.heartbeat(store.jobs, job_id, worker_id, attempt, now, JobReport(progress=progress)).job


def save_checkpoint(
    store: Store, job_id: str, worker_id: str, attempt: int, epoch: int | None, data: bytes, now: float
) -> Job:
    return changes.save_checkpoint(store.jobs, job_id, worker_id, attempt, epoch, data, now).job


def reserve_gang(store: Store, gang_id: str, placements, now: float, policy: object = None):
    return changes.reserve_gang(store.gangs, gang_id, placements, now)


def rollback_gang(store: Store, gang_id: str, now: float, timeout_s: float) -> DrainStarted | tuple[Job, ...]:
    """The drain a stale reservation started, else the tasks it rolled back (empty: nothing stale)."""
    started, _, rolled = changes.roll_back_stale(store.jobs, gang_id, now, timeout_s)
    return started if started is not None else rolled


def complete_drain(store: Store, gang_id: str, now: float) -> DrainCompleted | None:
    return changes.complete_drain(store.jobs, gang_id, now)


def complete_drains(store: Store, now: float) -> list[DrainCompleted]:
    return [
        completion
        for gang_id in store.jobs.gangs_to_complete()
        if (completion := changes.complete_drain(store.jobs, gang_id, now)) is not None
    ]


@dataclass(frozen=True)
class Reaped:
    requeued: tuple[Job, ...]
    failed: tuple[Job, ...]
    force_drained: tuple[Job, ...]
    drains: tuple[DrainStarted, ...]
    completions: tuple[DrainCompleted, ...]
    offline_workers: tuple[str, ...]


def reap(
    store: Store, now: float, heartbeat_timeout_s: float, preempt_timeout_s: float, worker_offline_s: float
) -> Reaped:
    report = changes.reap(store, now, heartbeat_timeout_s, preempt_timeout_s, worker_offline_s)
    singles = [lost.job for lost in report.lost if lost.job.gang_id is None]
    every_completion = [
        *(reported.completion for reported in report.lost + report.force_drained if reported.completion),
        *report.completions,
    ]
    return Reaped(
        requeued=tuple(job for job in singles if job.status == Status.PENDING),
        failed=tuple(job for job in singles if job.status == Status.FAILED),
        force_drained=tuple(reported.job for reported in report.force_drained),
        drains=tuple(lost.drain for lost in report.lost if lost.drain is not None),
        completions=tuple(every_completion),
        offline_workers=tuple(report.offline_workers),
    )


def append_log(
    store: Store,
    job_id: str,
    worker_id: str,
    attempt: int,
    offset: int,
    data: bytes,
    now: float,
    cap: int = 1 << 20,
):
    return changes.append_log(store.logs, job_id, worker_id, attempt, offset, data, now, cap)
