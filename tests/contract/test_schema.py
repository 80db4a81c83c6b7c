"""The schema the migrations build, on SQLite and PostgreSQL, and the plan of the claim query.

The declaration lives in ``corral.store.schema`` (``DECLARED_COLUMNS``, ``DECLARED_PRIMARY_KEYS``,
``DECLARED_INDEXES``); each backend reads its own catalogue back in the declaration's terms
(``column_definitions``, ``primary_keys``, ``index_definitions``), so one comparison covers both.
"""

from __future__ import annotations

import pytest

from corral.domain.records import JobSpec
from corral.domain.resources import Resources
from corral.store import open_store
from corral.store.dialect import WORKER_ALLOCATIONS_SQL
from corral.store.operations import LEASED_ON_WORKER_SQL
from corral.store.schema import (
    DECLARED_COLUMNS,
    DECLARED_INDEXES,
    DECLARED_PRIMARY_KEYS,
    DECLARED_SCHEMA,
    Column,
    columns,
)
from tests.contract import protocol
from tests.helpers import plan_nodes

NOW = 1_800_000_000.0


def test_migrations_build_the_declared_columns(store):
    built = store.column_definitions()
    for table, declared in DECLARED_COLUMNS.items():
        assert built.get(table) == declared, table
    assert set(built) == set(DECLARED_COLUMNS)
    assert store.table_columns() == DECLARED_SCHEMA


def test_migrations_build_the_declared_primary_keys(store):
    assert store.primary_keys() == DECLARED_PRIMARY_KEYS


def test_migrations_build_the_declared_indexes(store):
    built = store.index_definitions()
    for name, declared in DECLARED_INDEXES.items():
        assert built.get(name) == declared, name
    assert set(built) == set(DECLARED_INDEXES)
    assert store.index_names() == set(DECLARED_INDEXES)


def test_a_column_is_declared_as_its_ddl_line_and_a_typo_fails_at_once():
    assert columns("attempts INTEGER NOT NULL DEFAULT 0", "reserved_at DOUBLE PRECISION") == (
        Column("attempts", "INTEGER", not_null=True, default="0"),
        Column("reserved_at", "DOUBLE PRECISION"),
    )
    with pytest.raises(ValueError, match="attempts integer"):
        columns("attempts integer")


def test_migrate_twice_changes_nothing(store_url, store):
    job = protocol.submit(store, [JobSpec(command="true")], NOW).items[0].job
    again = open_store(store_url)
    try:
        assert again.jobs.get_job(job.id) == job
        assert again.column_definitions() == store.column_definitions()
        assert again.index_definitions() == store.index_definitions()
    finally:
        again.close()


@pytest.mark.postgres
def test_postgres_claim_query_walks_the_queue_index_without_sorting(postgres_store):
    store = postgres_store
    protocol.submit(
        store, [JobSpec(command="true", resources=Resources(cpus=index % 3)) for index in range(5000)], NOW
    )
    # Parameters: free gpus, memory_mb, cpus, per-GPU vram_mb, page size, offset.
    plan = store.explain(store.claims.claim_candidates_sql(), (0, 100, 4, 0, 32, 0))
    nodes = list(plan_nodes(plan))
    node_types = [node["Node Type"] for node in nodes]
    assert not [kind for kind in node_types if "Sort" in kind], node_types  # the index gives the order
    assert "jobs_queue" in {node.get("Index Name") for node in nodes}, plan


def sqlite_plan(tmp_path, sql: str, params: tuple[object, ...]) -> list[str]:
    """The details of ``EXPLAIN QUERY PLAN sql`` on a fresh SQLite store."""
    store = open_store(f"sqlite:///{tmp_path / 'corral.db'}")
    try:
        return [detail for *_, detail in store._read().execute(f"EXPLAIN QUERY PLAN {sql}", params)]
    finally:
        store.close()


def test_sqlite_finds_a_workers_leased_jobs_through_the_holding_index(tmp_path):
    """A worker heartbeat's ``running`` check reads the worker's jobs by the partial ``jobs_holding``
    index, not by status among every running job of the fleet (issue 13): SQLite takes a partial
    index only for a query that writes its predicate as the index does."""
    plan = sqlite_plan(tmp_path, LEASED_ON_WORKER_SQL, ("w1",))
    assert plan == ["SEARCH jobs USING INDEX jobs_holding (worker_id=?)"]


def test_sqlite_reads_a_claiming_workers_holdings_through_the_holding_index(tmp_path):
    """The claim's allocations read (``_worker_allocations``) takes the partial ``jobs_holding``
    index too: before, SQLite read them by status among every running job of the fleet, at each
    claim (2,000 hosts x 8 jobs took minutes to come up in ``bench/fleet.py``)."""
    plan = sqlite_plan(tmp_path, WORKER_ALLOCATIONS_SQL, ("w1",))
    assert plan == ["SEARCH jobs USING INDEX jobs_holding (worker_id=?)"]
