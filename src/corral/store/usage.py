"""Usage accounting in the store (API.md "Usage"): a window's attempts summed per group, and the
oldest rows removed past ``CORRAL_USAGE_RETENTION_DAYS``.

An ended attempt's row is written by ``SqlStore.compare_and_set`` with the transition that ended
its hold of resources (``attempt_usage``); job retention never touches them. An attempt still
running (or stopping) has no row yet: it is read from its job's row, held until ``now``. A window
reads the attempts that overlap it (the ended ones by the ``attempt_usage_ended`` index) and counts
each one's seconds inside it only, in one statement (one snapshot: an attempt that ends meanwhile
is counted once).
"""

from __future__ import annotations

from typing import Any

from corral.domain.usage import UsageTotals
from corral.store.dialect import Database, Dialect
from corral.store.rows import LEASED_SQL

#: an answer's dimension -> its column
_COLUMNS = {"user": "username", "pool": "pool"}
#: an attempt's seconds inside the window [?, ?]: its end clipped to the window's end, less its
#: start clipped to the window's start (CASE: SQLite's MIN/MAX are PostgreSQL's LEAST/GREATEST)
_CLIPPED = (
    "(CASE WHEN ended_at < ? THEN ended_at ELSE ? END)"
    " - (CASE WHEN started_at > ? THEN started_at ELSE ? END)"
)
#: the attempts of the window, ended or not (parameters: ``_attempt_params``): an attempt holding
#: its resources now is held until ``now`` (its job's row; an ended one is not there any more)
_ATTEMPTS = (
    "SELECT username, pool, job_id, gpus, cpus, started_at, ended_at, wait_s FROM attempt_usage"
    " WHERE ended_at > ? AND started_at < ?{user}"
    " UNION ALL SELECT username, pool, id, gpus, cpus, started_at, CAST(? AS DOUBLE PRECISION),"
    " CASE WHEN attempts = 1 THEN started_at - submitted_at END FROM jobs"
    f" WHERE status IN {LEASED_SQL} AND started_at IS NOT NULL AND started_at < ? AND ? > ?{{user}}"
)


class SqlUsage:
    """The ``Usage`` port over a ``Database``."""

    def __init__(self, db: Database, dialect: Dialect) -> None:
        self.db = db
        self.dialect = dialect

    def usage_totals(
        self, since: float, until: float, by: tuple[str, ...], now: float, user: str | None = None
    ) -> list[UsageTotals]:
        """Per group of ``by`` (``user``, ``pool``), in its order: the GPU- and CPU-seconds of
        the attempts overlapping [since, until] (each clipped to it; one still holding its
        resources is held until ``now``), how many attempts, how many jobs; ``user``: that
        user's attempts only."""
        columns = [_COLUMNS[dimension] for dimension in by]
        keys = ", ".join(columns)
        attempts, params = self._attempts(since, until, now, user)
        rows = self.db.read().execute(
            f"SELECT {keys}, SUM(gpus * span), SUM(cpus * span), COUNT(*), COUNT(DISTINCT job_id)"
            f" FROM (SELECT username, pool, job_id, gpus, cpus, {_CLIPPED} AS span"
            f" FROM ({attempts}) AS attempts) AS clipped GROUP BY {keys} ORDER BY {keys}",
            [until, until, since, since, *params],
        )
        totals = []
        for row in rows:
            named = dict(zip(by, row[: len(by)], strict=True))
            gpu_seconds, cpu_seconds, attempt_count, jobs = row[len(by) :]
            totals.append(
                UsageTotals(
                    user=named.get("user"),
                    pool=named.get("pool"),
                    gpu_seconds=float(gpu_seconds or 0.0),
                    cpu_seconds=float(cpu_seconds or 0.0),
                    attempts=int(attempt_count),
                    jobs=int(jobs),
                )
            )
        return totals

    def usage_waits(
        self, since: float, until: float, by: tuple[str, ...], now: float, user: str | None = None
    ) -> list[tuple[str | None, str | None, float]]:
        """The waits of the first attempts overlapping the window, each with its group's key as
        ``usage_totals`` gives it (user, pool; None where ``by`` leaves one out)."""
        attempts, params = self._attempts(since, until, now, user)
        rows = self.db.read().execute(
            f"SELECT username, pool, wait_s FROM ({attempts}) AS attempts WHERE wait_s IS NOT NULL",
            params,
        )
        return [
            (
                username if "user" in by else None,
                pool if "pool" in by else None,
                float(wait_s),
            )
            for username, pool, wait_s in rows
        ]

    @staticmethod
    def _attempts(since: float, until: float, now: float, user: str | None) -> tuple[str, list[Any]]:
        """``_ATTEMPTS`` narrowed to ``user`` (when given), and its parameters."""
        if user is None:
            return _ATTEMPTS.format(user=""), [since, until, now, until, now, since]
        return _ATTEMPTS.format(user=" AND username = ?"), [since, until, user, now, until, now, since, user]

    def purge_usage(self, cutoff: float, batch: int) -> int:
        """Remove at most ``batch`` usage rows of attempts that ended before ``cutoff``, oldest
        first; how many."""
        with self.db.transaction() as tx:
            removed = tx.execute(
                "DELETE FROM attempt_usage WHERE (job_id, attempt) IN (SELECT job_id, attempt"
                " FROM attempt_usage WHERE ended_at < ? ORDER BY ended_at LIMIT ?) RETURNING job_id",
                (cutoff, batch),
            )
        return len(removed)
