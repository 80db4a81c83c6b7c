"""Reports applied together (``Jobs.change_many``, the server's group commit), on SQLite and
PostgreSQL: each report gets its own outcome or its own error, and one that fails is rolled back
alone."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest

from corral.core import lifecycle
from corral.domain import errors
from corral.domain.records import JobSpec, Reason
from corral.domain.resources import Resources
from corral.domain.status import Status
from corral.server import changes
from corral.testing import history
from tests.contract import protocol
from tests.helpers import NOW, POLICY, assert_history_is_legal, register, submit_one


def running_jobs(store, count):
    register(store, cpus=1000)
    for _ in range(count):
        submit_one(store)
    return [store.claims.claim("w1", NOW, POLICY) for _ in range(count)]


def test_each_report_of_a_group_gets_its_own_outcome(store):
    first, second, third = running_jobs(store, 3)
    results = store.jobs.change_many(
        [
            (first.id, changes.done_decision("w1", first.attempts, NOW + 1)),
            (second.id, changes.failure_decision("w1", second.attempts, NOW + 1, exit_code=3)),
            (third.id, changes.done_decision("w1", third.attempts, NOW + 1)),
        ]
    )
    assert [result.job.status for result in results] == [Status.DONE, Status.PENDING, Status.DONE]
    for job, result in zip((first, second, third), results, strict=True):
        assert store.jobs.get_job(job.id) == result.job
        assert_history_is_legal(store, job.id)


def test_a_refused_or_failing_report_is_rolled_back_alone(store):
    first, second, third = running_jobs(store, 3)

    def broken(job, gang):
        raise RuntimeError("a fault in this report's decision")

    def writes_then_fails(job, gang):  # applied, then refused: its write must not stay
        plan = lifecycle.report_done(job, gang, worker_id="w1", attempt=job.attempts, now=NOW + 1)
        return replace(plan, transitions=(*plan.transitions, plan.transitions[0]))

    results = store.jobs.change_many(
        [
            (first.id, changes.done_decision("w1", first.attempts + 1, NOW + 1)),  # stale attempt
            ("j-unknown", changes.done_decision("w1", 1, NOW + 1)),
            (second.id, broken),
            (third.id, writes_then_fails),
            (second.id, changes.done_decision("w1", second.attempts, NOW + 2)),
        ]
    )
    assert isinstance(results[0], errors.StaleAttempt)
    assert isinstance(results[1], errors.NotFound)
    assert isinstance(results[2], RuntimeError)
    assert isinstance(results[3], errors.Conflict)
    assert results[4].job.status == Status.DONE
    assert store.jobs.get_job(first.id).status == Status.RUNNING
    assert store.jobs.get_job(third.id) == third
    assert [event.to_status for event in store.jobs.job_events(third.id)] == [Status.PENDING, Status.RUNNING]
    assert store.jobs.get_job(second.id).status == Status.DONE


def test_the_same_job_twice_in_a_group_applies_once(store):
    (job,) = running_jobs(store, 1)
    decide = changes.done_decision("w1", job.attempts, NOW + 1)
    first, second = store.jobs.change_many([(job.id, decide), (job.id, decide)])
    assert first.job.status == Status.DONE
    assert isinstance(second, errors.NotRunning)
    assert [event.to_status for event in store.jobs.job_events(job.id)].count(Status.DONE) == 1


def test_a_gang_task_in_a_group_starts_its_drain(store):
    for index in range(2):
        register(store, f"w{index}", gpus=1, vram_mb=1000)
    (single,) = [submit_one(store)]
    item = protocol.submit(store, [JobSpec(command="t", gang_size=2, resources=Resources(gpus=1))], NOW)
    tasks = [task.id for task in item.items[0].tasks]
    placements = [(tasks[0], "w0", (0,)), (tasks[1], "w1", (0,))]
    protocol.reserve_gang(store, item.items[0].gang_id, placements, NOW)
    rank0, rank1 = store.claims.claim("w0", NOW, POLICY), store.claims.claim("w1", NOW, POLICY)
    assert {rank0.id, rank1.id} == set(tasks)
    own = store.claims.claim("w0", NOW, POLICY)
    assert own.id == single.id
    failed, done = store.jobs.change_many(
        [
            (rank0.id, changes.failure_decision(rank0.worker_id, rank0.attempts, NOW + 1, exit_code=1)),
            (own.id, changes.done_decision("w0", own.attempts, NOW + 1)),
        ]
    )
    assert failed.drain is not None
    assert done.job.status == Status.DONE
    verdict = history.check_store(store)
    assert verdict.ok, verdict.summary()


@pytest.mark.parametrize("count", [1, 20])
def test_a_group_leaves_a_legal_history(store, count):
    jobs = running_jobs(store, count)
    decide = partial(changes.done_decision, "w1")
    results = store.jobs.change_many([(job.id, decide(job.attempts, NOW + 1)) for job in jobs])
    assert {result.job.status for result in results} == {Status.DONE}
    verdict = history.check_store(store)
    assert verdict.ok, verdict.summary()


def test_why_notes_of_a_pass_are_written_in_groups_and_a_refused_one_is_skipped(store):
    register(store, cpus=1)
    pending = [
        submit_one(store, resources=Resources(cpus=1)) for _ in range(changes.NOTES_PER_TRANSACTION + 6)
    ]
    (claimed,) = store.claims.claim_many("w1", NOW, POLICY, 1)
    reason = Reason("no_victim_set", "nothing this job may preempt frees enough")
    notes = [(job.id, reason) for job in pending] + [("j-gone", reason)]
    changes.note_singles_waiting(store.jobs, notes, NOW + 1)
    assert claimed.id == pending[0].id
    assert store.jobs.get_job(claimed.id).reason != reason, "a running job's note is not written"
    assert {store.jobs.get_job(job.id).reason for job in pending[1:]} == {reason}
    assert {store.jobs.get_job(job.id).status for job in pending[1:]} == {Status.PENDING}
