"""Pools in the store: their settings (the ``pools`` table), deleting one safely, and what each
pool's jobs hold and ask for. What the settings mean, and how they are inherited, is
``corral.domain.pools``'s; the rows and the pools a submit creates are ``store.pool_rows``'s.
"""

from __future__ import annotations

from collections.abc import Mapping

from corral.domain import errors
from corral.domain.pools import DEFAULT_POOL, PoolSettings, PoolUsage, Starvation, StarvationState
from corral.domain.resources import Resources
from corral.store.dialect import Database, Dialect
from corral.store.pool_rows import (
    POOL_SELECT,
    SETTINGS_COLUMNS,
    ensure_pools,
    settings_from_row,
    settings_values,
)
from corral.store.rows import HOLDING_SQL, NON_TERMINAL_SQL


def _within(column: str) -> str:
    """``column`` names the pool ``?`` or one of its descendants. Parameters: the path, then the
    path and a slash twice (``substr`` rather than LIKE, in which ``_`` is a wildcard)."""
    return f"({column} = ? OR substr({column}, 1, length(?)) = ?)"


class SqlPools:
    """The ``Pools`` port over a ``Database`` (no SQL of it differs between the backends)."""

    def __init__(self, db: Database, dialect: Dialect) -> None:
        self.db = db
        self.dialect = dialect

    def pools(self) -> dict[str, PoolSettings]:
        """Every stored pool's settings, by path."""
        rows = self.db.read().execute(f"SELECT {POOL_SELECT} FROM pools ORDER BY path")
        return {row[0]: settings_from_row(row) for row in rows}

    def put_pool(self, path: str, settings: PoolSettings, now: float) -> PoolSettings:
        """Store ``path``'s settings (every one replaced), creating the pool and any ancestor
        without a row, so the tree a PUT describes is explicit."""
        assignments = ", ".join(f"{column} = ?" for column in SETTINGS_COLUMNS)
        with self.db.transaction() as tx:
            ensure_pools(tx, [path], now)
            rows = tx.execute(
                f"UPDATE pools SET {assignments}, updated_at = ? WHERE path = ? RETURNING {POOL_SELECT}",
                (*settings_values(settings), now, path),
            )
            return settings_from_row(rows[0])

    def delete_pool(self, path: str) -> None:
        """Delete a pool's row. Refused (409, nothing changed) for ``default``, for a pool with child
        pools (delete them first: a tree is never left with a hole), and for a pool whose subtree
        holds a job not yet ended; 404 when there is no such pool."""
        if path == DEFAULT_POOL:
            raise errors.Conflict("the default pool cannot be deleted")
        below = path + "/"
        with self.db.transaction() as tx:
            children = tx.execute(
                "SELECT path FROM pools WHERE substr(path, 1, length(?)) = ? ORDER BY path LIMIT 1",
                (below, below),
            )
            if children:
                raise errors.Conflict(f"pool {path} has child pools ({children[0][0]}): delete them first")
            count = tx.execute(
                f"SELECT COUNT(*) FROM jobs WHERE status IN {NON_TERMINAL_SQL} AND {_within('pool')}",
                (path, below, below),
            )[0][0]
            if count:
                raise errors.Conflict(
                    f"pool {path} holds {count} unfinished job(s): cancel them or let them end"
                )
            if not tx.execute("DELETE FROM pools WHERE path = ? RETURNING path", (path,)):
                raise errors.NotFound(f"pool {path} not found")

    def pool_starvation(self) -> dict[str, StarvationState]:
        """The starvation timers the admission loop keeps: path -> (status, below since, since)."""
        rows = self.db.read().execute(
            "SELECT path, status, below_since, since FROM pool_starvation ORDER BY path"
        )
        return {row[0]: StarvationState(Starvation(row[1]), row[2], row[3]) for row in rows}

    def put_pool_starvation(self, states: Mapping[str, StarvationState]) -> None:
        """Replace the timers with ``states`` (a pool absent is not starving), writing only rows
        that changed: most cycles change none."""
        with self.db.transaction() as tx:
            stored = {
                row[0]: (row[1], row[2], row[3])
                for row in tx.execute("SELECT path, status, below_since, since FROM pool_starvation")
            }
            for path in sorted(stored.keys() - states.keys()):
                tx.execute("DELETE FROM pool_starvation WHERE path = ?", (path,))
            for path, state in sorted(states.items()):
                if stored.get(path) == (state.status, state.below_since, state.since):
                    continue
                tx.execute(
                    "INSERT INTO pool_starvation (path, status, below_since, since) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (path) DO UPDATE SET status = excluded.status,"
                    " below_since = excluded.below_since, since = excluded.since",
                    (path, str(state.status), state.below_since, state.since),
                )

    def pool_usage(self) -> dict[str, PoolUsage]:
        """For every pool path a job not yet ended names, what its jobs hold (reserved, running,
        preempting) and ask for (the rest), each task's resources summed, and how many there are:
        one grouped query."""

        def summed(condition: str) -> str:
            return (
                f"SUM(CASE WHEN {condition} THEN gpus ELSE 0 END),"
                f" MAX(CASE WHEN {condition} THEN vram_mb ELSE 0 END),"
                f" SUM(CASE WHEN {condition} THEN memory_mb ELSE 0 END),"
                f" SUM(CASE WHEN {condition} THEN cpus ELSE 0 END)"
            )

        rows = self.db.read().execute(
            f"SELECT pool, {summed(f'status IN {HOLDING_SQL}')}, {summed(f'status NOT IN {HOLDING_SQL}')},"
            f" COUNT(*) FROM jobs WHERE status IN {NON_TERMINAL_SQL} GROUP BY pool ORDER BY pool"
        )
        return {
            row[0]: PoolUsage(
                held=Resources(*(int(value) for value in row[1:5])),
                demand=Resources(*(int(value) for value in row[5:9])),
                jobs=int(row[9]),
            )
            for row in rows
        }
