"""The samples loop: once a minute, the cluster's queue length and GPU allocation
(``core.history``) stored for the dashboard overview's last 24 hours (``store.history``), and the
samples past their retention removed.

It runs on the loop leader, but needs no lock to be right: a sample's key is its minute, so a
replica that samples the same minute (a leader handing over) writes nothing, and every replica
reads the same rows."""

from __future__ import annotations

import logging

from corral.core import history, retention
from corral.domain.history import SAMPLE_RETENTION_S
from corral.server.state import ServerState

logger = logging.getLogger("corral.server.history")


def history_tick(state: ServerState) -> None:
    store = state.store
    now = state.clock.now()
    taken = history.sample(
        now, store.jobs.count_jobs_by_status(), store.workers.workers(), store.workers.allocations()
    )
    store.history.record_sample(taken)
    removed = batches = 0
    while True:
        purged = store.history.purge_samples(now - SAMPLE_RETENTION_S, retention.BATCH)
        removed += purged
        batches += 1
        if not retention.another_batch(purged, 0, batches):
            break
    if removed:
        logger.info("removed cluster samples past retention", extra={"samples": removed})
