"""The retention loop: removes what ``CORRAL_RETENTION_DAYS`` says is old (``core.retention``),
in short batches (``store.retention``)."""

from __future__ import annotations

import logging

from corral.core import retention
from corral.server.state import ServerState

logger = logging.getLogger("corral.server.retention")


def retention_tick(state: ServerState) -> None:
    cutoff = retention.cutoff(state.clock.now(), state.settings.retention_days)
    jobs = keys = batches = 0
    while True:
        purged = state.store.retention.purge_finished(cutoff, retention.BATCH)
        batches += 1
        jobs += purged.jobs
        keys += purged.keys
        if not retention.another_batch(purged.jobs, purged.keys, batches):
            break
    if jobs:
        state.metrics.retention_removed.labels(kind="jobs").inc(jobs)
    if keys:
        state.metrics.retention_removed.labels(kind="idempotency_keys").inc(keys)
    if jobs or keys:
        logger.info(
            "removed finished jobs and keys past retention",
            extra={"jobs": jobs, "idempotency_keys": keys, "batches": batches, "cutoff": cutoff},
        )
