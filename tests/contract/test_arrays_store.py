"""Arrays and dependencies in the store (migration 17), on SQLite and PostgreSQL: the columns kept,
the reads by array, the statuses the dependency rule decides on, and the claim passing over a job
that waits on its dependencies or whose array runs its %N throttle's worth."""

from __future__ import annotations

from corral.core import dependencies
from corral.domain.records import ArraySpec, Dependency
from corral.domain.status import Status
from corral.server import changes
from corral.store.base import JobFilter
from tests.contract import protocol
from tests.helpers import NOW, POLICY, register, spec, submit_one


def _array(store, indices=(0, 1, 2), throttle=None):
    item = protocol.submit(store, [spec(array=ArraySpec(tuple(indices), throttle))], NOW).items[0]
    return item


def test_an_array_is_stored_with_its_tasks_and_read_back(store):
    item = _array(store, (2, 4, 6), throttle=2)
    assert item.array_id.startswith("a-") and item.job is None
    tasks = store.jobs.array_tasks(item.array_id, 10)
    assert tasks == list(item.tasks)
    assert [(task.array_index, task.array_size, task.array_throttle) for task in tasks] == [
        (2, 3, 2),
        (4, 3, 2),
        (6, 3, 2),
    ]
    assert store.jobs.array_tasks(item.array_id, 1) == tasks[:1]
    assert store.jobs.array_counts(item.array_id) == {"pending": 3}
    assert store.jobs.array_counts("a-none") == {}
    listed = store.jobs.list_jobs(JobFilter(array_id=item.array_id), 10, None)
    assert {job.id for job in listed} == {task.id for task in tasks}


def test_a_replayed_array_submit_answers_the_array(store):
    first = protocol.submit(store, [spec(array=ArraySpec((0, 1)))], NOW, "key", "fp").items[0]
    again = protocol.submit(store, [spec(array=ArraySpec((0, 1)))], NOW, "key", "fp")
    assert again.replayed and again.items[0].array_id == first.array_id
    assert [task.id for task in again.items[0].tasks] == [task.id for task in first.tasks]


def test_a_jobs_conditions_are_kept_and_it_waits(store):
    before = submit_one(store)
    after = submit_one(store, after=(Dependency(before.id, "ok"), Dependency("g-x", "any")))
    stored = store.jobs.get_job(after.id)
    assert stored == after
    assert stored.spec.after == (Dependency(before.id, "ok"), Dependency("g-x", "any"))
    assert stored.awaiting_dependencies
    assert [job.id for job in store.jobs.awaiting_dependencies(10)] == [after.id]


def test_task_statuses_of_jobs_gangs_and_arrays(store):
    job = submit_one(store)
    gang = protocol.submit(store, [spec(gang_size=2)], NOW).items[0]
    array = _array(store, (0, 1))
    found = store.jobs.task_statuses([job.id, gang.gang_id, array.array_id, "j-unknown"])
    assert found == {
        job.id: (Status.PENDING,),
        gang.gang_id: (Status.BLOCKED, Status.BLOCKED),
        array.array_id: (Status.PENDING, Status.PENDING),
    }


def test_the_claim_passes_over_a_waiting_job_until_it_is_released(store):
    register(store, cpus=8)
    before = submit_one(store, max_retries=1)
    waiting = submit_one(store, after=(Dependency(before.id, "ok"),))
    running = changes.claim(store.claims, "w1", NOW + 1, policy=POLICY)
    assert running.id == before.id
    assert changes.claim(store.claims, "w1", NOW + 1, policy=POLICY) is None
    protocol.complete(store, before.id, "w1", running.attempts, NOW + 2)
    statuses = store.jobs.task_statuses([before.id])
    found = dependencies.verdict(waiting.spec.after, statuses)
    assert found == dependencies.Verdict.SATISFIED
    released = store.jobs.change(waiting.id, lambda job, gang: dependencies.settle(job, found, NOW + 3))
    assert released.status == Status.PENDING and not released.awaiting_dependencies
    assert store.jobs.awaiting_dependencies(10) == []
    assert changes.claim(store.claims, "w1", NOW + 4, policy=POLICY).id == waiting.id


def test_the_claim_holds_an_array_to_its_throttle(store):
    register(store, cpus=8)
    array = _array(store, (0, 1, 2, 3), throttle=2)
    claimed = changes.claim_many(store.claims, "w1", NOW + 1, 8, policy=POLICY)
    assert [job.array_index for job in claimed] == [0, 1]
    assert changes.claim(store.claims, "w1", NOW + 1, policy=POLICY) is None
    protocol.complete(store, claimed[0].id, "w1", claimed[0].attempts, NOW + 2)
    third = changes.claim(store.claims, "w1", NOW + 3, policy=POLICY)
    assert third.array_id == array.array_id and third.array_index == 2
    assert store.jobs.array_counts(array.array_id) == {"done": 1, "running": 2, "pending": 1}
