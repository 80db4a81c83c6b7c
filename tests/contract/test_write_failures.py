"""A store that cannot write (a full disk, an I/O error, a read-only database) raises
``StoreWriteFailed`` (503 ``store_unavailable``), never a driver's error (a 500), with nothing
written; ``ping(write=True)`` checks that a write commits, and leaves nothing behind."""

from __future__ import annotations

import pytest

from corral.domain import errors
from corral.store import open_store
from corral.store.sqlite import SqliteStore
from tests.helpers import submit_one


def test_a_write_probe_commits_and_leaves_nothing_behind(store):
    store.ping(1.0, write=True)
    store.ping(1.0)
    versions = [row[0] for row in store.read().execute("SELECT version FROM schema_migrations")]
    assert versions and min(versions) > 0


def test_sqlite_full_is_a_write_failure_with_nothing_written(tmp_path):
    """SQLite's ``database or disk is full`` (here: the file held to its size with
    ``max_page_count``, as a full disk holds it)."""
    store = open_store(f"sqlite:///{tmp_path / 'full.db'}")
    assert isinstance(store, SqliteStore)
    try:
        kept = submit_one(store)
        connection = store._connection()
        pages = connection.execute("PRAGMA page_count").fetchone()[0]
        connection.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(errors.StoreWriteFailed) as refused:
            for _ in range(200):
                submit_one(store, env={"PAD": "x" * 4000})
        assert refused.value.code == "store_unavailable" and refused.value.retry_after_s == 1
        assert "full" in refused.value.message
        connection.execute(f"PRAGMA max_page_count = {pages * 1000}")  # room again
        assert store.jobs.get_job(kept.id) == kept
        assert submit_one(store).status == "pending"
    finally:
        store.close()


@pytest.mark.postgres
@pytest.mark.parametrize(
    "raised",
    ["DiskFull", "IoError", "OutOfMemory", "ReadOnlySqlTransaction"],
)
def test_postgres_write_failures_are_503s(raised):
    """53100 disk full, 58030 an I/O error, 53200 out of memory, 25006 a read-only transaction."""
    import psycopg

    from corral.store.pg_pipeline import unavailable_on_connection_loss

    with pytest.raises(errors.StoreWriteFailed), unavailable_on_connection_loss():
        raise getattr(psycopg.errors, raised)("the database refused the write")
    with pytest.raises(errors.StoreUnavailable) as lost, unavailable_on_connection_loss():
        raise psycopg.OperationalError("server closed the connection unexpectedly")
    assert type(lost.value) is errors.StoreUnavailable
    with pytest.raises(psycopg.errors.UniqueViolation), unavailable_on_connection_loss():
        raise psycopg.errors.UniqueViolation("a fault of the request, not of the store")
