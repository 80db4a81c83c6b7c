"""``PostgresStore.change`` decides a single job's report on a row read without a lock, and writes
it only while the row is still that version: a row that moved meanwhile is decided again, locked.
(SQLite decides under its write lock: the race cannot happen there.)"""

from __future__ import annotations

from functools import partial

import pytest

from corral.core import lifecycle
from corral.domain import errors
from corral.domain.status import Status
from corral.store import open_store
from corral.store.base import JobReport
from tests.helpers import NOW, POLICY, assert_history_is_legal, register, submit_one


def test_a_row_that_moves_under_the_decision_is_decided_again(store_url, store):
    if store.dialect != "postgresql":
        pytest.skip("SQLite decides under its write lock: another writer cannot come between")
    register(store)
    submit_one(store)
    job = store.claims.claim("w1", NOW, POLICY)
    other = open_store(store_url, migrate=False)
    seen: list[tuple[Status, float | None]] = []
    try:

        def decide(current, gang):
            seen.append((current.status, current.last_heartbeat_at))
            if len(seen) == 1:  # a heartbeat lands between the read and the write
                other.jobs.heartbeat_job(job.id, "w1", job.attempts, NOW + 7, JobReport(progress={"step": 3}))
            return lifecycle.report_done(current, gang, worker_id="w1", attempt=job.attempts, now=NOW + 8)

        reported = store.jobs.change(job.id, decide)
    finally:
        other.close()
    assert reported.job.status == Status.DONE
    stored = store.jobs.get_job(job.id)
    assert (stored.status, stored.last_heartbeat_at, stored.progress) == (Status.DONE, NOW + 7, {"step": 3})
    # decided first on the row as read, then again on the locked row the heartbeat left
    assert seen == [(Status.RUNNING, NOW), (Status.RUNNING, NOW + 7)]
    assert [event.to_status for event in assert_history_is_legal(store, job.id)][-1] == Status.DONE


def test_a_report_refused_on_the_unlocked_read_writes_nothing(store):
    register(store)
    submit_one(store)
    job = store.claims.claim("w1", NOW, POLICY)
    before = store.jobs.get_job(job.id)
    decide = partial(lifecycle.report_done, worker_id="w1", attempt=job.attempts + 1, now=NOW + 1)
    with pytest.raises(errors.Conflict):
        store.jobs.change(job.id, decide)
    assert store.jobs.get_job(job.id) == before
