"""The samples loop: once per ``CORRAL_HISTORY_INTERVAL_S`` (a minute by default), the cluster's
queue length and GPU allocation (``core.history``) stored for the dashboard overview's last 24
hours (``store.history``), and the samples older than ``CORRAL_HISTORY_RETENTION_DAYS`` removed.

It runs on the loop leader, but needs no lock to be right: a sample's key is its interval's start,
so a replica that samples the same interval (a leader handing over) writes nothing, and every
replica reads the same rows."""

from __future__ import annotations

import logging

from corral.core import history, retention
from corral.server.state import ServerState

logger = logging.getLogger("corral.server.history")


def history_tick(state: ServerState) -> None:
    store = state.store
    now = state.clock.now()
    settings = state.settings
    taken = history.sample(
        now,
        store.jobs.count_jobs_by_status(),
        store.history.gpus_by_worker_status(),
        settings.history_interval_s,
    )
    store.history.record_sample(taken)
    removed = batches = 0
    while True:
        purged = store.history.purge_samples(
            retention.cutoff(now, settings.history_retention_days), retention.BATCH
        )
        removed += purged
        batches += 1
        if not retention.another_batch(purged, 0, batches):
            break
    if removed:
        logger.info("removed cluster samples past retention", extra={"samples": removed})
