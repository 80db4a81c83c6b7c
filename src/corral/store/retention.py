"""Retention in the store: finished jobs (with their events, checkpoints and logs) and idempotency keys
older than a cutoff, removed in small batches; the store's size and its oldest kept job.

Each batch is one short transaction (at most ``batch`` jobs), so a purge of a large backlog never
holds a long lock: claims and reports interleave between batches. A gang is removed whole, once
every task of it finished before the cutoff (its status is derived from its tasks: removing some
would change it). What the cutoff is, is the core's (``core.retention``).
"""

from __future__ import annotations

from collections.abc import Callable

from corral.store.base import Purged
from corral.store.dialect import Database, Dialect
from corral.store.rows import TERMINAL_SQL


class SqlRetention:
    """The ``Retention`` port over a ``Database``; ``size_bytes`` is the backend's own."""

    def __init__(self, db: Database, dialect: Dialect, size_bytes: Callable[[], int]) -> None:
        self.db = db
        self.dialect = dialect
        self._size_bytes = size_bytes

    def purge_finished(self, cutoff: float, batch: int) -> Purged:
        """Remove at most ``batch`` jobs that finished before ``cutoff`` (whole gangs only) with
        their events and checkpoints, and at most ``batch`` idempotency keys created before it."""
        with self.db.transaction() as tx:
            # Finished before the cutoff, oldest first (jobs_finished index); a gang task only when
            # no task of its gang is live or finished later.
            rows = tx.execute(
                f"SELECT id FROM jobs WHERE finished_at < ? AND status IN {TERMINAL_SQL}"
                " AND (gang_id IS NULL OR NOT EXISTS (SELECT 1 FROM jobs AS peer"
                "  WHERE peer.gang_id = jobs.gang_id"
                "  AND (peer.finished_at IS NULL OR peer.finished_at >= ?)))"
                " ORDER BY finished_at LIMIT ?",
                (cutoff, cutoff, batch),
            )
            ids = [row[0] for row in rows]
            if ids:
                marks = ", ".join("?" for _ in ids)
                tx.execute(f"DELETE FROM job_events WHERE job_id IN ({marks})", ids)
                tx.execute(f"DELETE FROM checkpoints WHERE job_id IN ({marks})", ids)
                tx.execute(f"DELETE FROM job_log_chunks WHERE job_id IN ({marks})", ids)
                tx.execute(f"DELETE FROM job_logs WHERE job_id IN ({marks})", ids)
                tx.execute(f"DELETE FROM jobs WHERE id IN ({marks})", ids)
            keys = tx.execute(
                "DELETE FROM idempotency_keys WHERE (owner, key) IN (SELECT owner, key"
                " FROM idempotency_keys WHERE created_at < ? ORDER BY created_at LIMIT ?)"
                " RETURNING key",
                (cutoff, batch),
            )
        return Purged(len(ids), len(keys))

    def oldest_job_submitted_at(self) -> float | None:
        """When the oldest kept job was submitted (``jobs_submitted`` index), None without jobs."""
        rows = self.db.read().execute("SELECT submitted_at FROM jobs ORDER BY submitted_at, id LIMIT 1")
        return float(rows[0][0]) if rows else None

    def size_bytes(self) -> int:
        """What the store takes on disk (tables and indexes)."""
        return self._size_bytes()
