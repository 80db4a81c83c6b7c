"""The only code that talks SQL: one schema, two backends (SQLite, PostgreSQL)."""

from __future__ import annotations

from corral.domain import errors
from corral.store.ports import Store


def open_store(url: str, migrate: bool = True, busy_timeout_s: float = 5.0) -> Store:
    """Open the store a ``CORRAL_DB`` URL names and migrate it forward.

    ``sqlite:///corral.db`` (relative path), ``sqlite:////abs/path.db``, ``sqlite://:memory:`` is not
    supported (each connection would see its own database); ``postgresql://...`` or ``postgres://...``.
    ``busy_timeout_s``: how long a change waits for a lock before it is refused as ``StoreBusy``.
    """
    store: Store
    if url.startswith("sqlite:///"):
        from corral.store.sqlite import SqliteStore

        store = SqliteStore(url.removeprefix("sqlite:///"), busy_timeout_s)
    elif url.startswith(("postgresql://", "postgres://")):
        from corral.store.postgres import PostgresStore

        store = PostgresStore(url, busy_timeout_s)
    else:
        raise errors.InvalidRequest(
            f"unsupported CORRAL_DB {url!r}: use sqlite:///path.db or postgresql://...", field="db"
        )
    if migrate:
        store.migrate()
    return store


__all__ = ["Store", "open_store"]
