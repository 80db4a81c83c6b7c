"""A claim retried with its Idempotency-Key (``claim_key``) after its answer was lost, on SQLite and
PostgreSQL: it is answered the runs the first claim started, still running on the worker, with
their leases renewed, and starts nothing new."""

from __future__ import annotations

import pytest

from corral.domain.resources import Resources
from corral.domain.status import Status
from tests.contract import protocol
from tests.helpers import NOW, POLICY, assert_history_is_legal, plan_nodes, register, spec, submit_one


def test_a_retried_claim_is_answered_the_runs_the_first_started(store):
    register(store, cpus=4)
    jobs = [submit_one(store) for _ in range(3)]
    first = store.claims.claim_many("w1", NOW, POLICY, 2, claim_key="k1")
    assert [job.id for job in first] == [jobs[0].id, jobs[1].id]
    again = store.claims.claim_many("w1", NOW + 4, POLICY, 2, claim_key="k1")
    assert [(job.id, job.attempts, job.gpu_indices) for job in again] == [
        (job.id, job.attempts, job.gpu_indices) for job in first
    ], "the same runs, in the order they were submitted"
    assert all(job.last_heartbeat_at == NOW + 4 for job in again), "the lease counts from the retry"
    assert store.jobs.get_job(jobs[2].id).status == Status.PENDING, "a retry starts nothing new"
    for job in again:
        assert_history_is_legal(store, job.id)
        assert [event.to_status for event in store.jobs.job_events(job.id)].count(Status.RUNNING) == 1


def test_a_single_claim_retried_answers_the_same_run(store):
    register(store, cpus=4)
    job = submit_one(store)
    claimed = store.claims.claim("w1", NOW, POLICY, claim_key="k1")
    assert claimed is not None and claimed.id == job.id
    assert store.claims.claim("w1", NOW + 1, POLICY, claim_key="k1") == store.jobs.get_job(job.id)


def test_another_key_or_no_key_claims_afresh(store):
    register(store, cpus=4)
    jobs = [submit_one(store) for _ in range(3)]
    (first,) = store.claims.claim_many("w1", NOW, POLICY, 1, claim_key="k1")
    (second,) = store.claims.claim_many("w1", NOW, POLICY, 1, claim_key="k2")
    (third,) = store.claims.claim_many("w1", NOW, POLICY, 1)
    assert [first.id, second.id, third.id] == [job.id for job in jobs]


def test_a_key_answers_nothing_once_its_runs_ended_or_on_another_worker(store):
    register(store, "w1", cpus=4)
    register(store, "w2", cpus=4)
    done, later = submit_one(store), submit_one(store)
    (claimed,) = store.claims.claim_many("w1", NOW, POLICY, 1, claim_key="k1")
    assert claimed.id == done.id
    (other,) = store.claims.claim_many("w2", NOW, POLICY, 1, claim_key="k1")
    assert other.id == later.id, "a key is the worker's own"
    protocol.complete(store, done.id, "w1", 1, NOW + 1)
    assert store.claims.claim_many("w1", NOW + 2, POLICY, 1, claim_key="k1") == []
    assert store.jobs.get_job(done.id).status == Status.DONE


@pytest.mark.postgres
def test_postgres_finds_a_claim_key_by_its_index_whatever_the_worker_runs(postgres_store):
    store = postgres_store
    register(store, cpus=3000)
    protocol.submit(store, [spec(resources=Resources(cpus=1)) for _ in range(2000)], NOW)
    assert len(store.claims.claim_many("w1", NOW, POLICY, 64)) == 64
    plan = store.explain(store.claims.claiming_worker_sql(), ("k1", "w1"))
    assert "jobs_claim_key" in {node.get("Index Name") for node in plan_nodes(plan)}, plan
