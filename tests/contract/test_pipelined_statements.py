"""PostgreSQL sends a transaction's ``BEGIN`` with its first statement and a claim's starts with its
``COMMIT`` (``store.postgres``: the statements of one pipeline, each prepared on the connection,
every value a bound parameter). The same answers on both backends; what can only go wrong on
PostgreSQL is tested on PostgreSQL alone."""

from __future__ import annotations

from dataclasses import replace

import psycopg
import pytest

from corral.domain import errors
from corral.domain.status import Status
from corral.domain.transitions import Transition
from corral.store.base import JobReport, LeaseRenewed
from tests.helpers import NOW, POLICY, register, submit_one

#: values that must reach the database exactly: quotes, backslashes, a percent sign, a question mark
#: (the shared placeholder), non-ASCII text, an attempt at SQL
AWKWARD = "k'1\\'; SELECT 1; --%s?\u00e9\u2603"


def test_a_claim_key_of_any_text_finds_its_runs_again(store):
    register(store)
    job = submit_one(store)
    (claimed,) = store.claims.claim_many("w1", NOW, POLICY, 1, claim_key=AWKWARD)
    assert (claimed.id, claimed.claim_key) == (job.id, AWKWARD)
    assert store.claims.claim_many("w1", NOW + 1, POLICY, 1, claim_key=AWKWARD) == [
        store.jobs.get_job(job.id)
    ]
    assert store.claims.claim_many("w1", NOW + 2, POLICY, 1, claim_key=AWKWARD + "x") == []


def test_claims_after_refused_ones_still_claim(store):
    """A refused claim rolls its transaction back (past psycopg, which would drop every prepared
    statement at a rollback it sees); the statements prepared on the connection stay usable."""
    for _ in range(3):
        submit_one(store)
    register(store)
    for attempt in range(3):
        with pytest.raises(errors.NotFound):
            store.claims.claim("ghost", NOW + attempt, POLICY)
        assert store.claims.claim("w1", NOW + attempt, POLICY) is not None
    assert store.claims.claim("w1", NOW + 4, POLICY) is None


def test_postgres_refuses_a_nul_in_a_bound_value(postgres_store):
    register(postgres_store)
    submit_one(postgres_store)
    with pytest.raises(psycopg.DataError):
        postgres_store.claims.claim("w1", NOW, POLICY, claim_key="k\x00")
    assert postgres_store.claims.claim("w1", NOW, POLICY, claim_key="k") is not None


def test_postgres_a_deferred_start_that_misses_rolls_the_whole_transaction_back(postgres_store):
    """A claim's starts are sent with its ``COMMIT`` without waiting for their answer: one that
    matched no row fails its statement (SQLSTATE ``division_by_zero``), so nothing of the
    transaction is written and the store answers ``Conflict``."""
    register(postgres_store)
    first, second = submit_one(postgres_store), submit_one(postgres_store)
    started = replace(first, status=Status.RUNNING, worker_id="w1", attempts=1, version=first.version + 1)
    stale = replace(second, version=second.version + 5)  # not the row as it is
    moved = replace(stale, status=Status.RUNNING, worker_id="w1", attempts=1, version=stale.version + 1)
    with pytest.raises(errors.Conflict), postgres_store._transaction() as tx:
        postgres_store._apply_all(tx, [Transition(first, started, NOW), Transition(stale, moved, NOW)])
    assert postgres_store.jobs.get_job(first.id) == first
    assert postgres_store.jobs.get_job(second.id) == second
    assert [event.to_status for event in postgres_store.jobs.job_events(first.id)] == [Status.PENDING]
    # and the connection goes on: a claim starts the first job
    assert postgres_store.claims.claim("w1", NOW + 1, POLICY) == postgres_store.jobs.get_job(first.id)


def test_a_batched_heartbeat_keeps_awkward_reports_exactly(store):
    """PostgreSQL sends a batch's reports as array texts: quotes, backslashes, braces and commas
    in a progress report, and exact floats, come back as they were sent."""
    register(store)
    first, second = submit_one(store), submit_one(store)
    claimed = [store.claims.claim("w1", NOW, POLICY) for _ in range(2)]
    assert [job.id for job in claimed if job] == [first.id, second.id]
    progress = {"message": "a\"b\\c'd,{x} NULL", "values": [1, None], "é": "\u2603"}
    beats = [
        (
            first.id,
            1,
            JobReport(
                progress=progress, gpu_util_pct=12.345678901234567, rss_mb=1e3, checkpoint_at=NOW + 0.1
            ),
        ),
        (second.id, 1, JobReport(progress="NULL", gpu_util_pct=None, rss_mb=None, checkpoint_at=None)),
    ]
    assert store.jobs.heartbeat_jobs("w1", NOW + 1, beats) == [
        LeaseRenewed(first.id),
        LeaseRenewed(second.id),
    ]
    renewed = store.jobs.get_job(first.id)
    assert (renewed.progress, renewed.gpu_util_pct, renewed.rss_mb) == (progress, 12.345678901234567, 1e3)
    assert (renewed.last_checkpoint_at, renewed.last_heartbeat_at) == (NOW + 0.1, NOW + 1)
    assert store.jobs.get_job(second.id).progress == "NULL"


def test_postgres_a_failure_of_another_statement_is_not_a_conflict(postgres_store):
    """Only a checked compare-and-set's ``division_by_zero`` is a claim conflict: the same SQLSTATE
    from any other statement is the driver's own error, and the connection goes on."""
    with pytest.raises(psycopg.errors.DivisionByZero), postgres_store._transaction() as tx:
        tx.execute("SELECT 1 / (SELECT count(*) FROM jobs)")
    register(postgres_store)
    submit_one(postgres_store)
    assert postgres_store.claims.claim("w1", NOW, POLICY) is not None


def test_postgres_a_group_of_changes_whose_statement_fails_writes_none(postgres_store):
    """``together`` runs its statements between a ``BEGIN`` and a ``COMMIT`` of one pipeline: a
    failed statement skips the rest and the transaction rolls back whole."""
    register(postgres_store)
    job = submit_one(postgres_store)
    with pytest.raises(psycopg.errors.DivisionByZero):
        postgres_store.autocommit.together(
            [
                ("UPDATE jobs SET priority = 7 WHERE id = ?", (job.id,)),
                ("SELECT 1 / (SELECT count(*) FROM workers WHERE id = 'ghost')", ()),
            ]
        )
    assert postgres_store.jobs.get_job(job.id) == job
    assert postgres_store.claims.claim("w1", NOW, POLICY) is not None
