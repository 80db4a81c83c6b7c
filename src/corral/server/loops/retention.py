"""The retention loop: removes what ``CORRAL_RETENTION_DAYS`` says is old (``core.retention``),
in short batches (``store.retention``), and the usage rows ``CORRAL_USAGE_RETENTION_DAYS`` says are
(``store.usage``)."""

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
    _purge_usage(state)


def _purge_usage(state: ServerState) -> None:
    """The usage rows past ``CORRAL_USAGE_RETENTION_DAYS`` (their own retention: job retention
    never removes them), in batches as the jobs are."""
    cutoff = retention.cutoff(state.clock.now(), state.settings.usage_retention_days)
    rows = batches = 0
    while True:
        removed = state.store.usage.purge_usage(cutoff, retention.BATCH)
        batches += 1
        rows += removed
        if not retention.another_batch(removed, 0, batches):
            break
    if rows:
        state.metrics.retention_removed.labels(kind="usage").inc(rows)
        logger.info("removed usage rows past retention", extra={"usage_rows": rows, "cutoff": cutoff})
