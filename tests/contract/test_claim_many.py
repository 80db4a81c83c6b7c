"""Claims of several jobs in one transaction (``Claims.claim_many``, ``GET /jobs/next?max=N``), on
SQLite and PostgreSQL: the jobs single claims would start one after another, never more than the
worker holds."""

from __future__ import annotations

import threading

import pytest

from corral.domain import errors
from corral.domain.records import Constraints, Hold, JobSpec
from corral.domain.resources import Resources
from corral.domain.status import Status
from corral.store import open_store
from corral.store.base import JobFilter
from corral.store.dialect import ALLOCATIONS_AND_CANDIDATES
from corral.testing import history
from tests.contract import protocol
from tests.helpers import NOW, POLICY, assert_history_is_legal, plan_nodes, register, spec, submit_one


def running(store, worker_id="w1"):
    return store.jobs.list_jobs(JobFilter(status=("running",), worker_id=worker_id), 1000, None)


def test_claim_many_takes_the_jobs_single_claims_would_in_queue_order(store_url, store):
    register(store, cpus=1000)
    low = submit_one(store, priority=0)
    high = submit_one(store, priority=5)
    top_class = submit_one(store, preemption_class=9)
    claimed = store.claims.claim_many("w1", NOW + 5, POLICY, 2)
    assert [job.id for job in claimed] == [top_class.id, high.id]
    for job in claimed:
        assert (job.status, job.attempts, job.worker_id, job.started_at) == (Status.RUNNING, 1, "w1", NOW + 5)
        assert store.jobs.get_job(job.id) == job
        assert_history_is_legal(store, job.id)
    assert [job.id for job in store.claims.claim_many("w1", NOW, POLICY, 64)] == [low.id]
    assert store.claims.claim_many("w1", NOW, POLICY, 64) == []


def test_claim_many_never_overfills_the_worker_and_gives_disjoint_gpus(store):
    register(store, gpus=4, vram_mb=1000, cpus=6, memory_mb=8192)
    two_gpus = submit_one(store, resources=Resources(gpus=2, cpus=1))
    too_many_cpus = submit_one(store, resources=Resources(gpus=1, cpus=6))  # would fit alone, not after
    one_gpu = [submit_one(store, resources=Resources(gpus=1, cpus=1)) for _ in range(4)]
    claimed = store.claims.claim_many("w1", NOW, POLICY, 64)
    assert [job.id for job in claimed] == [two_gpus.id, one_gpu[0].id, one_gpu[1].id]
    indices = [index for job in claimed for index in job.gpu_indices]
    assert sorted(indices) == [0, 1, 2, 3]
    assert store.jobs.get_job(too_many_cpus.id).status == Status.PENDING
    assert store.claims.claim_many("w1", NOW, POLICY, 64) == []
    protocol.complete(store, one_gpu[0].id, "w1", 1, NOW + 1)
    (next_one,) = store.claims.claim_many("w1", NOW + 2, POLICY, 64)
    assert (next_one.id, next_one.gpu_indices) == (one_gpu[2].id, claimed[1].gpu_indices)


def test_claim_many_skips_what_does_not_fit_for_what_does(store):
    register(store, cpus=4, labels={"rack": "r1"})
    wrong_rack = [submit_one(store, constraints=Constraints(labels={"rack": "r2"})) for _ in range(5)]
    fits = [submit_one(store, resources=Resources(cpus=1), constraints=Constraints(labels={"rack": "r1"}))]
    fits += [submit_one(store, resources=Resources(cpus=1)) for _ in range(5)]
    claimed = store.claims.claim_many("w1", NOW, POLICY, 10)
    assert [job.id for job in claimed] == [job.id for job in fits[:4]]
    assert {store.jobs.get_job(job.id).status for job in wrong_rack} == {Status.PENDING}


def test_claim_many_starts_the_reserved_tasks_first(store):
    register(store, "w1", gpus=2, vram_mb=1000, cpus=8)
    register(store, "w2", gpus=2, vram_mb=1000, cpus=8)
    pending = [submit_one(store, resources=Resources(cpus=1)) for _ in range(3)]
    gang = protocol.submit(store, [JobSpec(command="train", gang_size=3, resources=Resources(gpus=1))], NOW)
    gang_id, tasks = gang.items[0].gang_id, [task.id for task in gang.items[0].tasks]
    placements = [(tasks[0], "w1", (0,)), (tasks[1], "w2", (0,)), (tasks[2], "w1", (1,))]
    assert protocol.reserve_gang(store, gang_id, placements, NOW) is not None
    claimed = store.claims.claim_many("w1", NOW + 1, POLICY, 3)
    # the reserved tasks first (the lowest id first, as single claims take them), then the queue
    assert [job.id for job in claimed] == [*sorted([tasks[0], tasks[2]]), pending[0].id]
    assert {job.id: job.gpu_indices for job in claimed[:2]} == {tasks[0]: (0,), tasks[2]: (1,)}
    assert {job.status for job in claimed} == {Status.RUNNING}
    assert store.jobs.get_job(tasks[1]).status == Status.RESERVED
    assert [job.id for job in store.claims.claim_many("w2", NOW + 1, POLICY, 1)] == [tasks[1]]


def test_claim_many_keeps_held_capacity_for_the_waiting_gang(store):
    register(store, gpus=4, vram_mb=1000, cpus=8)
    jobs = [submit_one(store, resources=Resources(gpus=1)) for _ in range(4)]
    store.gangs.replace_holds([Hold("g-waiting", "w1", Resources(gpus=2), None)])
    claimed = store.claims.claim_many("w1", NOW, POLICY, 64)
    assert [job.id for job in claimed] == [jobs[0].id, jobs[1].id]


def test_claim_many_by_unknown_or_draining_worker(store):
    submit_one(store)
    with pytest.raises(errors.NotFound):
        store.claims.claim_many("ghost", NOW, POLICY, 4)
    register(store)
    store.workers.drain_worker("w1")
    assert store.claims.claim_many("w1", NOW, POLICY, 4) == []


def test_concurrent_claim_many_for_one_worker_never_overfill_it(store):
    """Several threads claiming several jobs at once for one worker, beside single claims: each
    transaction sees the others' jobs, so the worker never holds more than it offers."""
    protocol.submit(store, [spec(resources=Resources(cpus=1)) for _ in range(40)], NOW)
    register(store, "w1", cpus=5)
    start = threading.Barrier(8)
    claimed: list[str] = []
    lock = threading.Lock()

    def claim_some(index: int) -> None:
        start.wait(10)
        for _ in range(3):
            jobs = (
                store.claims.claim_many("w1", NOW, POLICY, 3)
                if index % 2
                else [store.claims.claim("w1", NOW, POLICY)]
            )
            with lock:
                claimed.extend(job.id for job in jobs if job is not None)

    threads = [threading.Thread(target=claim_some, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(claimed) == len(set(claimed)) == 5
    assert len(running(store)) == 5


def test_concurrent_claim_many_by_several_workers_never_share_a_job(store_url, store):
    protocol.submit(store, [spec() for _ in range(150)], NOW)
    for index in range(4):
        register(store, f"w{index}", cpus=1000)
    claimed: list[str] = []
    lock = threading.Lock()

    def claim_all(worker_id: str) -> None:
        own = open_store(store_url, migrate=False)
        try:
            while jobs := own.claims.claim_many(worker_id, NOW, POLICY, 7):
                with lock:
                    claimed.extend(job.id for job in jobs)
        finally:
            own.close()

    threads = [threading.Thread(target=claim_all, args=(f"w{index}",)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(claimed) == len(set(claimed)) == 150
    verdict = history.check_store(store)
    assert verdict.ok, verdict.summary()


@pytest.mark.postgres
def test_postgres_claim_reads_allocations_and_candidates_walking_the_queue_index(postgres_store):
    """The PostgreSQL claim's one-round-trip read (allocations and the first candidates) keeps the
    candidate query's plan: the queue index gives the order, nothing is sorted."""
    store = postgres_store
    register(store, cpus=64)
    protocol.submit(store, [spec(resources=Resources(cpus=index % 3)) for index in range(5000)], NOW)
    store.claims.claim_many("w1", NOW, POLICY, 8)
    plan = store.explain(ALLOCATIONS_AND_CANDIDATES, ("w1", "w1", 8))
    nodes = list(plan_nodes(plan))
    assert not [node["Node Type"] for node in nodes if "Sort" in node["Node Type"]], nodes
    assert "jobs_queue" in {node.get("Index Name") for node in nodes}, plan


@pytest.mark.parametrize("limit", [1, 4])
def test_a_candidate_only_the_looser_first_read_admits_does_not_hide_the_next(store, limit):
    """With an unhealthy GPU the worker has less free than its resources say: a job that would
    fit only on paper is read first (PostgreSQL's first read filters by resources alone) and
    refused, and the job behind it still starts."""
    register(store, gpus=2, vram_mb=1000, cpus=8)
    store.workers.worker_heartbeat("w1", NOW, None, unhealthy_gpus=[1])
    two = submit_one(store, resources=Resources(gpus=2))
    one = submit_one(store, resources=Resources(gpus=1))
    claimed = store.claims.claim_many("w1", NOW, POLICY, limit)
    assert [(job.id, job.gpu_indices) for job in claimed] == [(one.id, (0,))]
    assert store.jobs.get_job(two.id).status == Status.PENDING
