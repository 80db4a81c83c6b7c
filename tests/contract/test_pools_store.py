"""Pools in the store, on SQLite and PostgreSQL: settings round-trip, the safety of a delete, what
each pool's jobs hold and wait for, and the pools a submit creates."""

from __future__ import annotations

import pytest

from corral.core import lifecycle
from corral.core.claim import Claim
from corral.domain import errors
from corral.domain.pools import (
    UNLIMITED,
    PoolKind,
    PoolMode,
    PoolSettings,
    PoolUsage,
    Starvation,
    StarvationState,
)
from corral.domain.records import JobSpec
from corral.domain.resources import Resources
from corral.domain.status import Status
from corral.store import open_store
from corral.store.base import JobFilter, WorkerRegistration
from corral.store.rows import INSERT_JOB, insert_row
from tests.contract import protocol

NOW = 1_800_000_000.0
EVERY_SETTING = PoolSettings(
    weight=2.5,
    guarantee=Resources(8, 0, 1024, 16),
    limits=Resources(16, UNLIMITED, UNLIMITED, 64),
    mode=PoolMode.FIFO,
    kind=PoolKind.SENSITIVE,
    starvation_timeout_s=12.5,
    aggressive_starvation_timeout_s=60.0,
    starvation_tolerance=0.6,
    enable_aggressive_starvation=True,
    allow_aggressive_preemption=False,
    default_walltime_s=3600.0,
    max_walltime_s=86400.5,
)


def submit(store, *specs, now=NOW):
    return protocol.submit(store, list(specs), now).items


def test_a_new_store_has_only_the_default_pool(store):
    assert store.pools.pools() == {"default": PoolSettings()}


def test_every_setting_round_trips_and_a_put_replaces_them_all(store):
    assert store.pools.put_pool("team/x", EVERY_SETTING, NOW) == EVERY_SETTING
    assert store.pools.pools()["team/x"] == EVERY_SETTING
    assert isinstance(store.pools.pools()["team/x"].weight, float)
    assert store.pools.put_pool("team/x", PoolSettings(weight=1), NOW + 1) == PoolSettings(weight=1.0)
    assert store.pools.pools()["team/x"] == PoolSettings(weight=1.0)


def test_a_put_makes_every_ancestor_a_row(store):
    store.pools.put_pool("a/b/c", PoolSettings(kind=PoolKind.TRAINING), NOW)
    assert store.pools.pools() == {
        "a": PoolSettings(),
        "a/b": PoolSettings(),
        "a/b/c": PoolSettings(kind=PoolKind.TRAINING),
        "default": PoolSettings(),
    }
    store.pools.put_pool("a", PoolSettings(weight=3), NOW)  # an existing ancestor keeps its row
    assert store.pools.pools()["a"] == PoolSettings(weight=3.0)
    assert store.pools.pools()["a/b/c"] == PoolSettings(kind=PoolKind.TRAINING)


def test_delete_removes_a_leaf_and_refuses_the_rest(store):
    store.pools.put_pool("a/b", PoolSettings(weight=2), NOW)
    with pytest.raises(errors.Conflict, match="child pools"):
        store.pools.delete_pool("a")
    with pytest.raises(errors.Conflict, match="default pool"):
        store.pools.delete_pool("default")
    with pytest.raises(errors.NotFound):
        store.pools.delete_pool("nope")
    store.pools.delete_pool("a/b")
    store.pools.delete_pool("a")
    assert set(store.pools.pools()) == {"default"}


def test_delete_is_refused_while_the_subtree_holds_an_unfinished_job(store):
    store.pools.put_pool("a_b", PoolSettings(), NOW)
    store.pools.put_pool("a", PoolSettings(), NOW)
    (item,) = submit(store, JobSpec(command="true", pool="a_b"))
    # "a" is not an ancestor of "a_b" (nor would LIKE's "_" make "a_b" match "a/b")
    store.pools.delete_pool("a")
    with pytest.raises(errors.Conflict, match="1 unfinished job"):
        store.pools.delete_pool("a_b")
    assert "a_b" in store.pools.pools()  # a 409 changes nothing
    protocol.cancel(store, item.job.id, NOW + 1)
    store.pools.delete_pool("a_b")
    assert set(store.pools.pools()) == {"default"}


def test_a_job_in_a_descendant_without_a_row_blocks_its_ancestor(store):
    submit(store, JobSpec(command="true", pool="p/q/r"))
    with store._transaction() as tx:  # the row lost to a race with a delete: the job still counts
        tx.execute("DELETE FROM pools WHERE path = 'p/q/r'")
    with pytest.raises(errors.Conflict, match="pool p/q holds 1 unfinished"):
        store.pools.delete_pool("p/q")


def test_usage_sums_tasks_held_and_waiting_per_pool_and_counts_unfinished_jobs(store):
    store.workers.register_worker(WorkerRegistration("w1", "10.0.0.1", Resources(4, 80_000, 65_536, 32)), NOW)
    gpu = Resources(gpus=1, vram_mb=40_000, memory_mb=1000, cpus=2)
    submit(
        store,
        JobSpec(command="run", pool="t/a", resources=gpu),
        JobSpec(command="wait", pool="t/a", resources=Resources(gpus=2, cpus=1)),
        JobSpec(command="gang", pool="t/b", gang_size=3, resources=Resources(gpus=1, memory_mb=10)),
        JobSpec(command="cancelled", pool="t/b"),
    )
    claimed = store.claims.claim("w1", NOW + 1, Claim())
    assert claimed.spec.command == "run"
    (cancelled,) = [
        job for job in store.jobs.list_jobs(JobFilter(pool="t/b"), 10, None) if job.gang_id is None
    ]
    protocol.cancel(store, cancelled.id, NOW + 2)
    usage = store.pools.pool_usage()
    assert usage["t/a"] == PoolUsage(held=gpu, demand=Resources(gpus=2, cpus=1), jobs=2)
    assert usage["t/b"] == PoolUsage(demand=Resources(gpus=3, memory_mb=30), jobs=3)
    assert "default" not in usage and "t" not in usage


def test_ended_jobs_are_not_usage(store):
    (item,) = submit(store, JobSpec(command="true", pool="x", resources=Resources(gpus=1)))
    protocol.cancel(store, item.job.id, NOW + 1)
    assert store.pools.pool_usage() == {}


def test_a_submit_to_an_unknown_pool_creates_it_and_its_ancestors_and_says_so(store):
    single, gang = submit(
        store, JobSpec(command="true", pool="team/x"), JobSpec(command="true", pool="team/x", gang_size=2)
    )
    assert set(store.pools.pools()) == {"default", "team", "team/x"}
    assert store.pools.pools()["team/x"] == PoolSettings()
    note = "pool 'team/x' created with defaults"
    assert single.job.reason.code == "queued"
    assert single.job.reason.message.endswith("; " + note)
    assert all(task.reason.message.endswith("; " + note) for task in gang.tasks)
    stored = store.jobs.get_job(single.job.id)
    assert stored.reason == single.job.reason
    (event,) = store.jobs.job_events(single.job.id)
    assert (event.to_status, event.reason) == (Status.PENDING, single.job.reason)
    (later,) = submit(store, JobSpec(command="true", pool="team/x"), now=NOW + 1)
    assert "created" not in later.job.reason.message
    (child,) = submit(store, JobSpec(command="true", pool="team/y"), now=NOW + 2)
    assert child.job.reason.message.endswith("pool 'team/y' created with defaults")
    (default,) = submit(store, JobSpec(command="true"), now=NOW + 3)
    assert "created" not in default.job.reason.message


def test_a_replayed_submit_creates_no_pool_and_keeps_its_first_answer(store):
    first = protocol.submit(store, [JobSpec(command="true", pool="new")], NOW, "key-1", "f").items[0]
    protocol.cancel(store, first.job.id, NOW)
    store.pools.delete_pool("new")
    again = protocol.submit(store, [JobSpec(command="true", pool="new")], NOW + 1, "key-1", "f")
    assert again.replayed
    assert again.items[0].job.id == first.job.id
    assert set(store.pools.pools()) == {"default"}


def test_a_batch_of_ten_thousand_jobs_in_one_new_pool_is_one_creation(store):
    items = submit(store, *[JobSpec(command="true", pool="big/batch")] * 10_000)
    assert len(items) == 10_000
    assert all("created" in item.job.reason.message for item in items)
    assert set(store.pools.pools()) == {"default", "big", "big/batch"}
    assert store.pools.pool_usage()["big/batch"].jobs == 10_000


#: the jobs' columns added by migrations after 5
LATER_JOB_COLUMNS = {
    "workdir",
    "array_id",
    "array_index",
    "array_size",
    "array_throttle",
    "depends_on",
    "awaiting_dependencies",
    "topology",
}


def test_migration_6_gives_the_pools_of_existing_jobs_a_row(store_url, monkeypatch):
    from corral.store import schema, sql

    monkeypatch.setattr(sql, "MIGRATIONS", schema.MIGRATIONS[:5])
    before = open_store(store_url)
    try:
        jobs = lifecycle.submitted(
            [JobSpec(command="true", pool=pool) for pool in ("old/a", "default", "old/a")], NOW
        )
        # A submit of the time: no pools table yet, and none of the columns later migrations add
        # (workdir: 12; the arrays' and dependencies': 17; topology: 18).
        columns = INSERT_JOB.split("(", 1)[1].split(")", 1)[0].replace(" ", "").split(",")
        kept = [index for index, column in enumerate(columns) if column not in LATER_JOB_COLUMNS]
        statement = (
            f"INSERT INTO jobs ({', '.join(columns[index] for index in kept)})"
            f" VALUES ({', '.join('?' for _ in kept[:-1])}, 1)"
        )
        with before._transaction() as tx:
            tx.executemany(
                statement,
                [tuple(insert_row(job)[index] for index in kept[:-1]) for _, tasks in jobs for job in tasks],
            )
        monkeypatch.setattr(sql, "MIGRATIONS", schema.MIGRATIONS)
        before.migrate()
        assert set(before.pools.pools()) == {"default", "old/a"}
    finally:
        before.close()


def test_starvation_timers_round_trip_and_only_what_changed_is_written(store):
    starving = StarvationState(Starvation.STARVING, NOW - 40, NOW - 10)
    timer = StarvationState(Starvation.NON_STARVING, NOW - 5)
    store.pools.put_pool_starvation({"team/a": starving, "team/b": timer})
    assert store.pools.pool_starvation() == {"team/a": starving, "team/b": timer}
    aggressive = StarvationState(Starvation.AGGRESSIVELY_STARVING, NOW - 40, NOW)
    store.pools.put_pool_starvation({"team/a": aggressive})
    assert store.pools.pool_starvation() == {"team/a": aggressive}, "a pool left out is not starving any more"
    store.pools.put_pool_starvation({})
    assert store.pools.pool_starvation() == {}


def test_pending_in_pools_reads_a_subtrees_single_jobs_in_queue_order(store):
    submit(
        store,
        JobSpec(command="true", pool="team/a", priority=1),
        JobSpec(command="true", pool="team/a/x"),
        JobSpec(command="true", pool="team-b"),
        JobSpec(command="true", pool="team"),
    )
    found = store.gangs.pending_in_pools(["team/a"])
    assert [job.spec.pool for job in found] == ["team/a", "team/a/x"], "the subtree, never team-b"
    assert [job.spec.pool for job in store.gangs.pending_in_pools(["team-b", "team"], limit=1)] == ["team/a"]
