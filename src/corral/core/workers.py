"""A worker's liveness rules: when a silent worker goes offline, and when one is flagged dead.

The store reads the candidates (a pre-filter by the same thresholds), locks each worker's row,
reads its ``WorkerContact`` and calls one of these; what they return is the record it writes.
Silence counts every heartbeat the worker sends: its own and its jobs', so a worker whose own
heartbeat is slow (a long request, a busy server) while its jobs beat is neither. And it counts
only from when the server could hear the worker (``core.hearing``): not across a server restart
or a store that could not take writes.
"""

from __future__ import annotations

from dataclasses import replace

from corral.core.hearing import ALWAYS, Hearing, silence_cutoff
from corral.domain.records import Worker, WorkerContact
from corral.domain.status import WorkerStatus


def silent_since(worker: Worker, contact: WorkerContact, cutoff: float) -> bool:
    """No heartbeat of the worker's own nor of its leased jobs at or after ``cutoff``. A worker
    that never heartbeated is not silent (its registration is its first contact)."""
    if worker.last_heartbeat_at is None or worker.last_heartbeat_at >= cutoff:
        return False
    return contact.last_job_heartbeat_at is None or contact.last_job_heartbeat_at < cutoff


def silent_for(worker: Worker, contact: WorkerContact, now: float, after_s: float, hearing: Hearing) -> bool:
    """Silent for ``after_s`` now, counted from the later of its last contact and when the server
    could hear it again (``core.hearing.silence_cutoff``)."""
    cutoff = silence_cutoff(now, after_s, hearing)
    return cutoff is not None and silent_since(worker, contact, cutoff)


def goes_offline(
    worker: Worker, contact: WorkerContact, *, now: float, after_s: float, hearing: Hearing = ALWAYS
) -> Worker | None:
    """An active worker silent for ``after_s`` goes offline (a heartbeat brings it back); None:
    it stays as it is."""
    if worker.status != WorkerStatus.ACTIVE or not silent_for(worker, contact, now, after_s, hearing):
        return None
    return replace(worker, status=WorkerStatus.OFFLINE)


def flagged_dead(
    worker: Worker, contact: WorkerContact, *, now: float, after_s: float, hearing: Hearing = ALWAYS
) -> Worker | None:
    """A worker silent for ``after_s`` that still holds leased jobs is flagged dead, once per
    episode: only where no flag is (a heartbeat clears it, so a worker that goes silent again is
    flagged again). Nothing is killed or re-queued: the lease reaper recovers its jobs, and
    admission reserves nothing on a flagged worker. None: no flag to set."""
    if worker.flagged_dead_at is not None or contact.leased_jobs == 0:
        return None
    if not silent_for(worker, contact, now, after_s, hearing):
        return None
    return replace(worker, flagged_dead_at=now)


def leaves(worker: Worker, contact: WorkerContact) -> Worker | None:
    """A worker that says it is stopping (``POST /workers/{id}/leave``: SIGTERM or Ctrl-C) is
    offline at once rather than after ``CORRAL_WORKER_OFFLINE_S`` of silence, so ``corral
    workers`` shows what happened; a drained one too (nothing runs on an offline worker either, and
    it can then be removed). A register or heartbeat brings it back as ever. None: already offline."""
    if worker.status == WorkerStatus.OFFLINE:
        return None
    return replace(worker, status=WorkerStatus.OFFLINE)


def removal_refused(worker: Worker, holding: int) -> str | None:
    """Why ``DELETE /workers/{id}`` may not remove the worker (409 ``conflict``), or None: only an
    offline worker that holds nothing is removed; one that may come back or still holds work is
    drained or stopped first."""
    if worker.status != WorkerStatus.OFFLINE:
        return (
            f"worker {worker.id} is {worker.status}: only an offline worker can be removed "
            "(stop it, or wait until it goes offline)"
        )
    if holding:
        return f"worker {worker.id} still holds {holding} job(s); remove it once they have moved"
    return None
