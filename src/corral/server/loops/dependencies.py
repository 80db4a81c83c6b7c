"""The dependency loop: settles the jobs waiting on their ``after`` conditions (API.md "Arrays and
dependencies"). Each pass reads the waiting jobs (``jobs_awaiting``), the statuses of what they
name, and applies ``core.dependencies``: a job whose conditions all hold is released to the queue,
one whose condition can no longer hold is cancelled with ``dependency_never_satisfied``. A job's end
wakes the loop (``ServerState.released``) while a job waits on its conditions, so a dependent
starts soon after; a pass that finds none waiting lets job ends pass without a wake until the
next submit with conditions (``ServerState.dependents_waiting``)."""

from __future__ import annotations

import logging
from functools import partial

from corral.core import dependencies
from corral.domain.records import Job
from corral.domain.status import Status
from corral.domain.transitions import Plan
from corral.server.state import ServerState

logger = logging.getLogger("corral.server.dependencies")

#: waiting jobs one pass settles at most (the rest, the next pass: it is woken again by their ends)
BATCH = 1000


def dependencies_tick(state: ServerState) -> None:
    # Cleared before the read: a submit with conditions during it sets the flag again after this,
    # so a dependent this read misses still wakes the next pass.
    state.dependents_waiting = False
    waiting = state.store.jobs.awaiting_dependencies(BATCH)
    if not waiting:
        return
    statuses = state.store.jobs.task_statuses([item.id for job in waiting for item in job.spec.after])
    now = state.clock.now()
    settled = []
    for job in waiting:
        found = dependencies.verdict(job.spec.after, statuses)
        if found != dependencies.Verdict.WAITING:
            settled.append((job.id, partial(_settle, found=found, now=now)))
    results = state.store.jobs.change_many(settled) if settled else []
    released = cancelled = 0
    for result in results:
        if isinstance(result, Job):
            if result.status == Status.CANCELLED:
                cancelled += 1
                state.metrics.jobs_cancelled.inc()
            else:
                released += 1
        elif isinstance(result, Exception):
            logger.warning("a dependency settlement was refused", extra={"error": str(result)})
    if released + cancelled < len(waiting) or len(waiting) >= BATCH:
        state.dependents_waiting = True  # some still wait (or more than a pass reads)
    if released or cancelled:
        logger.info("dependencies settled", extra={"released": released, "cancelled": cancelled})
        state.released()


def _settle(job: Job, gang: tuple[Job, ...], found: dependencies.Verdict, now: float) -> Plan[Job | None]:
    """``change_many``'s decision for one waiting job, on its locked row."""
    return dependencies.settle(job, found, now)
