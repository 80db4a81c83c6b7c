"""Claims started together (``Claims.claim_group``, the server's group commit of the claims of one
event-loop turn), on SQLite and PostgreSQL: the jobs single claims would start one after another,
never one job twice, and nothing written when one of the group fails."""

from __future__ import annotations

import pytest

from corral.domain import errors
from corral.domain.resources import Resources
from corral.domain.status import Status
from corral.store.base import ClaimAsk
from tests.helpers import NOW, POLICY, assert_history_is_legal, register, submit_one


def test_a_group_starts_what_claims_one_after_another_would(store):
    for worker_id in ("w1", "w2", "w3"):
        register(store, worker_id, cpus=2)
    jobs = [submit_one(store) for _ in range(6)]
    asks = [ClaimAsk("w3", 1), ClaimAsk("w1", 2), ClaimAsk("w2", 1)]
    third, first, second = store.claims.claim_group(asks, NOW, POLICY)
    # In worker id order, each claim seeing the ones before it: w1 the two oldest, w2 the next, w3 after.
    assert [job.id for job in first] == [jobs[0].id, jobs[1].id]
    assert [job.id for job in second] == [jobs[2].id]
    assert [job.id for job in third] == [jobs[3].id]
    for worker_id, claimed in (("w1", first), ("w2", second), ("w3", third)):
        for job in claimed:
            stored = store.jobs.get_job(job.id)
            assert (stored.status, stored.worker_id) == (Status.RUNNING, worker_id)
            assert_history_is_legal(store, job.id)
    assert {store.jobs.get_job(job.id).status for job in jobs[4:]} == {Status.PENDING}


def test_two_claims_of_one_worker_in_a_group_take_its_capacity_once(store):
    register(store, "w1", cpus=2)
    jobs = [submit_one(store, resources=Resources(cpus=1)) for _ in range(3)]
    first, second = store.claims.claim_group([ClaimAsk("w1", 2), ClaimAsk("w1", 2)], NOW, POLICY)
    assert [job.id for job in first] == [jobs[0].id, jobs[1].id]
    assert second == [], "the first claim filled the worker"
    assert store.jobs.get_job(jobs[2].id).status == Status.PENDING


def test_a_retried_claim_in_the_same_group_is_answered_the_same_runs(store):
    register(store, "w1", cpus=4)
    jobs = [submit_one(store) for _ in range(3)]
    first, again = store.claims.claim_group([ClaimAsk("w1", 2, "k1"), ClaimAsk("w1", 2, "k1")], NOW, POLICY)
    assert [job.id for job in first] == [jobs[0].id, jobs[1].id]
    assert [job.id for job in again] == [job.id for job in first]
    assert store.jobs.get_job(jobs[2].id).status == Status.PENDING


def test_a_draining_worker_in_a_group_gets_nothing(store):
    register(store, "w1", cpus=2)
    register(store, "w2", cpus=2)
    store.workers.drain_worker("w1")
    job = submit_one(store)
    drained, claimed = store.claims.claim_group([ClaimAsk("w1"), ClaimAsk("w2")], NOW, POLICY)
    assert drained == []
    assert [started.id for started in claimed] == [job.id]


def test_a_group_with_an_unknown_worker_writes_nothing(store):
    register(store, "w1", cpus=2)
    job = submit_one(store)
    with pytest.raises(errors.NotFound):
        store.claims.claim_group([ClaimAsk("w1"), ClaimAsk("w9-unknown")], NOW, POLICY)
    assert store.jobs.get_job(job.id).status == Status.PENDING, "the group rolled back whole"
    assert [started.id for started in store.claims.claim_many("w1", NOW, POLICY, 1)] == [job.id]
