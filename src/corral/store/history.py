"""The cluster's history in the store (``domain.history``): one ``cluster_samples`` row per
minute, written by whichever replica samples first (the minute is the key: a second write of the
same minute is dropped), read by any, removed past its retention in batches."""

from __future__ import annotations

from corral.domain.history import ClusterSample
from corral.store.dialect import Database, Dialect
from corral.store.rows import HOLDING_SQL

_COLUMNS = "at, queued_jobs, running_jobs, gpus_total, gpus_allocated"


class SqlHistory:
    """The ``History`` port over a ``Database``."""

    def __init__(self, db: Database, dialect: Dialect) -> None:
        self.db = db
        self.dialect = dialect

    def record_sample(self, sample: ClusterSample) -> bool:
        """Store ``sample`` unless its minute has one already (the first one stays); whether it
        was stored."""
        with self.db.transaction() as tx:
            stored = tx.execute(
                f"INSERT INTO cluster_samples ({_COLUMNS}) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (at) DO NOTHING RETURNING at",
                (
                    sample.at,
                    sample.queued_jobs,
                    sample.running_jobs,
                    sample.gpus_total,
                    sample.gpus_allocated,
                ),
            )
        return bool(stored)

    def samples(self, since: float, until: float) -> list[ClusterSample]:
        """The samples with ``since <= at <= until``, oldest first."""
        rows = self.db.read().execute(
            f"SELECT {_COLUMNS} FROM cluster_samples WHERE at >= ? AND at <= ? ORDER BY at", (since, until)
        )
        return [
            ClusterSample(float(at), int(queued), int(running), int(total), int(allocated))
            for at, queued, running, total, allocated in rows
        ]

    def gpus_by_worker_status(self) -> dict[str, tuple[int, int]]:
        """Worker status -> (its workers' GPUs, the GPUs that jobs holding resources there have
        been given): a sample's GPU figures summed by the database, two scans and no row
        converted (``core.history.sample`` picks the statuses it counts)."""
        read = self.db.read()
        totals = read.execute("SELECT status, SUM(gpus) FROM workers GROUP BY status")
        # a holding job's GPUs are its ``gpu_indices`` ("0,3": commas + 1; "" for none)
        held = read.execute(
            "SELECT workers.status, SUM(CASE WHEN jobs.gpu_indices = '' THEN 0 ELSE"
            " LENGTH(jobs.gpu_indices) - LENGTH(REPLACE(jobs.gpu_indices, ',', '')) + 1 END)"
            " FROM jobs JOIN workers ON workers.id = jobs.worker_id"
            f" WHERE jobs.status IN {HOLDING_SQL} GROUP BY workers.status"
        )
        allocated = {status: int(gpus or 0) for status, gpus in held}
        return {status: (int(gpus or 0), allocated.get(status, 0)) for status, gpus in totals}

    def purge_samples(self, cutoff: float, batch: int) -> int:
        """Remove at most ``batch`` samples taken before ``cutoff``, oldest first; how many."""
        with self.db.transaction() as tx:
            removed = tx.execute(
                "DELETE FROM cluster_samples WHERE at IN"
                " (SELECT at FROM cluster_samples WHERE at < ? ORDER BY at LIMIT ?) RETURNING at",
                (cutoff, batch),
            )
        return len(removed)
