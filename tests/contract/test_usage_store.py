"""Usage accounting in the store (API.md "Usage"), on SQLite and PostgreSQL: every transition that
ends an attempt's hold of resources writes its ``attempt_usage`` row in the same transaction, by
whichever path applies it (the locked change, PostgreSQL's one-statement change and group commit,
the reaper), and a window sums the rows clipped to it. Job retention leaves the rows alone."""

from __future__ import annotations

import pytest

from corral.core import retention
from corral.domain import errors
from corral.domain.resources import Resources
from corral.domain.status import Status
from corral.domain.usage import UsageTotals
from corral.server import changes
from tests.contract import protocol
from tests.contract.test_gangs_store import reserve, run_gang, submit_gang, workers
from tests.helpers import NOW, POLICY, register, spec

BOTH = ("user", "pool")
ALL_TIME = (NOW - 10_000, NOW + 10_000)


def submit(store, at=NOW, **fields):
    fields.setdefault("user", "alice")
    fields.setdefault("resources", Resources(gpus=2, cpus=4))
    return protocol.submit(store, [spec(**fields)], at).items[0].job


def totals(store, window=ALL_TIME, by=BOTH, user=None, now=NOW + 10_000):
    return store.usage.usage_totals(*window, by, now, user)


def waits(store, now=NOW + 10_000):
    return store.usage.usage_waits(*ALL_TIME, BOTH, now)


def test_a_finished_attempt_is_counted_from_its_start_to_its_end(store):
    register(store, gpus=4)
    job = submit(store, pool="team/a")
    store.claims.claim("w1", NOW + 10, POLICY)
    assert totals(store, now=NOW + 60) == [UsageTotals("alice", "team/a", 100.0, 200.0, 1, 1)], (
        "a running attempt holds its resources until now"
    )
    assert waits(store, now=NOW + 60) == [("alice", "team/a", 10.0)]
    assert totals(store, (NOW + 20, NOW + 30), now=NOW + 60)[0].gpu_seconds == 20.0
    assert totals(store, (NOW - 100, NOW + 10), now=NOW + 60) == [], "it started at the window's end"
    protocol.complete(store, job.id, "w1", 1, NOW + 110)
    assert totals(store) == [UsageTotals("alice", "team/a", 200.0, 400.0, 1, 1)]
    assert waits(store) == [("alice", "team/a", 10.0)]


def test_every_attempt_that_held_resources_counts_failed_released_and_cancelled(store):
    register(store, gpus=4)
    job = submit(store, max_retries=5)
    store.claims.claim("w1", NOW, POLICY)
    protocol.fail(store, job.id, "w1", 1, NOW + 10, 1)  # retried: running -> pending
    store.claims.claim("w1", NOW + 20, POLICY)
    protocol.fail(store, job.id, "w1", 2, NOW + 30, 143, "worker shut down", None, release=True)  # refunded
    store.claims.claim("w1", NOW + 40, POLICY)
    protocol.cancel(store, job.id, NOW + 50)  # running -> preempting: still held
    stopping = totals(store, now=NOW + 55)[0]
    assert (stopping.attempts, stopping.gpu_seconds) == (3, 2 * (10 + 10 + 15)), "a stopping job still holds"
    protocol.ack_preempted(store, job.id, "w1", 3, 1, NOW + 60)  # -> cancelled
    assert store.jobs.get_job(job.id).status == Status.CANCELLED
    (counted,) = totals(store)
    assert (counted.attempts, counted.jobs) == (3, 1)
    assert counted.gpu_seconds == 2 * (10 + 10 + 20)
    assert [wait for _, _, wait in waits(store)] == [0.0], "first attempt only"


def test_a_lost_lease_ends_the_hold(store):
    register(store, gpus=4)
    job = submit(store, max_retries=2)
    store.claims.claim("w1", NOW, POLICY)
    assert [lost.id for lost in protocol.reap(store, NOW + 31, 30, 45, 600).requeued] == [job.id]
    (counted,) = totals(store)
    assert (counted.attempts, counted.gpu_seconds) == (1, 2 * 31.0)


def test_reports_applied_together_write_their_usage(store):
    register(store, gpus=4, cpus=100)
    first, second = submit(store), submit(store, user="bob")
    store.claims.claim("w1", NOW, POLICY)
    store.claims.claim("w1", NOW, POLICY)
    results = store.jobs.change_many(
        [
            (first.id, changes.done_decision("w1", 1, NOW + 5)),
            (second.id, changes.failure_decision("w1", 1, NOW + 7, exit_code=3)),
        ]
    )
    assert [result.job.status for result in results] == [Status.DONE, Status.PENDING]
    assert [(row.user, row.gpu_seconds) for row in totals(store)] == [("alice", 10.0), ("bob", 14.0)]


def test_a_refused_report_writes_no_usage(store):
    register(store, gpus=4)
    job = submit(store)
    store.claims.claim("w1", NOW, POLICY)
    with pytest.raises(errors.StaleAttempt):
        protocol.complete(store, job.id, "w1", 2, NOW + 5)
    assert store.read().execute("SELECT COUNT(*) FROM attempt_usage") == [(0,)]
    assert store.jobs.get_job(job.id).status == Status.RUNNING


def test_a_window_clips_each_attempt_and_groups_as_asked(store):
    register(store, gpus=8, cpus=100)
    jobs = [
        submit(store, user="alice", pool="a"),
        submit(store, user="alice", pool="b", resources=Resources(gpus=1, cpus=1)),
        submit(store, user="bob", pool="a", resources=Resources(gpus=1, cpus=0)),
    ]
    for _ in jobs:
        store.claims.claim("w1", NOW, POLICY)
    for job in jobs:
        protocol.complete(store, job.id, "w1", 1, NOW + 100)
    window = (NOW + 50, NOW + 80)  # 30 s of each attempt
    assert totals(store, window) == [
        UsageTotals("alice", "a", 60.0, 120.0, 1, 1),
        UsageTotals("alice", "b", 30.0, 30.0, 1, 1),
        UsageTotals("bob", "a", 30.0, 0.0, 1, 1),
    ]
    assert totals(store, window, ("pool",)) == [
        UsageTotals(None, "a", 90.0, 120.0, 2, 2),
        UsageTotals(None, "b", 30.0, 30.0, 1, 1),
    ]
    assert totals(store, window, ("user",), user="bob") == [UsageTotals("bob", None, 30.0, 0.0, 1, 1)]
    assert totals(store, (NOW + 100, NOW + 200)) == [], "ended at the window's start: nothing in it"
    assert totals(store, (NOW - 100, NOW)) == [], "started at the window's end: nothing in it"


def test_job_retention_keeps_usage_and_usage_has_its_own(store):
    register(store, gpus=4)
    submit(store)
    old = store.claims.claim("w1", NOW, POLICY)
    protocol.complete(store, old.id, "w1", 1, NOW + 10)
    submit(store, at=NOW + 50)
    recent = store.claims.claim("w1", NOW + 100, POLICY)
    protocol.complete(store, recent.id, "w1", 1, NOW + 200)
    purged = store.retention.purge_finished(NOW + 1_000, retention.BATCH)
    assert purged.jobs == 2
    assert totals(store)[0].attempts == 2, "the jobs are gone, their usage is not"
    assert store.usage.purge_usage(NOW + 50, retention.BATCH) == 1
    assert store.usage.purge_usage(NOW + 50, retention.BATCH) == 0
    (kept,) = totals(store)
    assert (kept.attempts, kept.gpu_seconds) == (1, 200.0)


def test_a_drained_gang_counts_every_rank_refunded_peers_too(store):
    workers(store, 3)
    gang_id, task_ids = submit_gang(store)
    run_gang(store, gang_id, task_ids)
    protocol.fail(store, task_ids[1], "w1", 1, NOW + 5, 1, "rank 1 crashed", None)  # running -> preempted
    stopping = totals(store, by=("pool",), now=NOW + 6)[0]
    assert (stopping.attempts, stopping.gpu_seconds) == (3, 5.0 + 6.0 + 6.0), "stopping peers still hold"
    changes.acknowledge_stop(store.jobs, task_ids[0], "w0", 1, 1, NOW + 7)
    changes.acknowledge_stop(store.jobs, task_ids[2], "w2", 1, 1, NOW + 8)
    (counted,) = totals(store, by=("pool",))
    assert (counted.attempts, counted.jobs, counted.gpu_seconds) == (3, 3, 7.0 + 5.0 + 8.0)


def test_a_reservation_never_claimed_writes_no_usage(store):
    workers(store, 2)
    gang_id, task_ids = submit_gang(store, size=2)
    reserve(store, gang_id, task_ids)
    assert protocol.rollback_gang(store, gang_id, NOW + 1_000, 60)  # reserved -> blocked
    assert totals(store) == []
