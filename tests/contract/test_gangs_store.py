"""Gang operations of the store (seeds 001 and 000), on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from corral.core import drain
from corral.core.claim import Claim
from corral.core.drain import DrainStarted
from corral.domain import errors
from corral.domain.records import Hold, JobSpec
from corral.domain.resources import Resources
from corral.domain.status import Status
from corral.domain.transitions import Plan
from corral.server import changes
from corral.store import open_store
from corral.store.base import WorkerRegistration
from tests.contract import protocol
from tests.helpers import assert_history_is_legal

NOW = 1_800_000_000.0
POLICY = Claim()


def workers(store, count, gpus=1, address="10.0.0.{}"):
    for index in range(count):
        store.workers.register_worker(
            WorkerRegistration(f"w{index}", address.format(index), Resources(gpus, 1000, 8192, 8)), NOW
        )


def submit_gang(store, size=3, gpus=1, max_retries=3, now=NOW):
    item = protocol.submit(
        store,
        [JobSpec(command="train", gang_size=size, resources=Resources(gpus=gpus), max_retries=max_retries)],
        now,
    ).items[0]
    return item.gang_id, [task.id for task in item.tasks]


def reserve(store, gang_id, task_ids, now=NOW):
    placements = [(task_id, f"w{index}", (0,)) for index, task_id in enumerate(task_ids)]
    return protocol.reserve_gang(store, gang_id, placements, now, POLICY)


def run_gang(store, gang_id, task_ids, now=NOW):
    reserve(store, gang_id, task_ids, now)
    return [store.claims.claim(f"w{index}", now, POLICY) for index in range(len(task_ids))]


def statuses(store, gang_id):
    return [task.status for task in store.jobs.gang_tasks(gang_id)]


def test_reserve_is_all_or_nothing(store):
    workers(store, 3)
    gang_id, task_ids = submit_gang(store)
    reserved = reserve(store, gang_id, task_ids)
    assert [job.status for job in reserved] == [Status.RESERVED] * 3
    assert [job.worker_id for job in reserved] == ["w0", "w1", "w2"]
    assert {job.reservation_epoch for job in reserved} == {1}
    assert {job.master_port for job in reserved} == {29500}
    assert reserve(store, gang_id, task_ids) is None, "tasks no longer blocked: nothing written"


def test_reserve_refuses_capacity_taken_since_the_snapshot(store):
    workers(store, 3)
    protocol.submit(store, [JobSpec(command="single", resources=Resources(gpus=1))], NOW)
    store.claims.claim("w2", NOW, POLICY)
    gang_id, task_ids = submit_gang(store, now=NOW + 1)
    assert reserve(store, gang_id, task_ids) is None
    assert statuses(store, gang_id) == [Status.BLOCKED] * 3


def test_reserved_tasks_are_claimed_only_by_their_worker(store):
    workers(store, 2)
    gang_id, task_ids = submit_gang(store, size=2)
    reserve(store, gang_id, task_ids)
    first = store.claims.claim("w1", NOW, POLICY)
    assert (first.id, first.status, first.attempts) == (task_ids[1], Status.RUNNING, 1)
    assert store.claims.claim("w1", NOW, POLICY) is None


def test_second_gang_gets_the_next_master_port_on_a_shared_worker(store):
    store.workers.register_worker(WorkerRegistration("w0", "h", Resources(2, 1000, 8192, 8)), NOW)
    first_id, first_tasks = submit_gang(store, size=1 + 1)
    placements = [(first_tasks[0], "w0", (0,)), (first_tasks[1], "w0", (1,))]
    assert {job.master_port for job in protocol.reserve_gang(store, first_id, placements, NOW, POLICY)} == {
        29500
    }
    store.workers.register_worker(WorkerRegistration("w0", "h", Resources(4, 1000, 8192, 8)), NOW)
    second_id, second_tasks = submit_gang(store, size=2)
    placements = [(second_tasks[0], "w0", (2,)), (second_tasks[1], "w0", (3,))]
    assert {job.master_port for job in protocol.reserve_gang(store, second_id, placements, NOW, POLICY)} == {
        29501
    }


def test_stale_reservation_rolls_back_to_blocked(store):
    workers(store, 3)
    gang_id, task_ids = submit_gang(store)
    reserve(store, gang_id, task_ids)
    assert protocol.rollback_gang(store, gang_id, NOW + 10, 30) == ()
    rolled = protocol.rollback_gang(store, gang_id, NOW + 31, 30)
    assert [job.status for job in rolled] == [Status.BLOCKED] * 3
    assert {job.worker_id for job in rolled} == {None}
    for task_id in task_ids:
        assert_history_is_legal(store, task_id)


def test_stale_reservation_with_running_siblings_drains_the_gang(store):
    """Seed 001's stuck state: two ranks run, the third was never claimed."""
    workers(store, 3)
    gang_id, task_ids = submit_gang(store)
    reserve(store, gang_id, task_ids)
    store.claims.claim("w0", NOW, POLICY)
    store.claims.claim("w1", NOW, POLICY)
    drain = protocol.rollback_gang(store, gang_id, NOW + 31, 30)
    assert isinstance(drain, DrainStarted)
    assert drain.trigger.id == task_ids[2]
    assert statuses(store, gang_id) == [Status.PREEMPTING, Status.PREEMPTING, Status.BLOCKED]


def test_a_failing_rank_drains_its_gang_and_keeps_its_attempt(store):
    workers(store, 3)
    gang_id, task_ids = submit_gang(store)
    run_gang(store, gang_id, task_ids)
    trigger = protocol.fail(store, task_ids[1], "w1", 1, NOW + 5, 1, "rank 1 crashed", "Traceback...")
    assert (trigger.status, trigger.preemption_epoch, trigger.attempts) == (Status.PREEMPTED, 1, 1)
    assert trigger.exit_code == 1
    tasks = store.jobs.gang_tasks(gang_id)
    assert [task.status for task in tasks] == [Status.PREEMPTING, Status.PREEMPTED, Status.PREEMPTING]
    assert [task.refunds for task in tasks] == [1, 0, 1]
    assert [task.attempts_used for task in tasks] == [0, 1, 0], "peers are refunded, the trigger is not"
    assert {task.preemption_epoch for task in tasks} == {1}
    beat = protocol.heartbeat_job(store, task_ids[0], "w0", 1, NOW + 6, None)
    assert beat.status == Status.PREEMPTING, "the peer's worker still reports with the attempt it claimed"
    with pytest.raises(errors.StaleEpoch):
        protocol.ack_preempted(store, task_ids[0], "w0", 1, 2, NOW + 7)
    first_ack = changes.acknowledge_stop(store.jobs, task_ids[0], "w0", 1, 1, NOW + 7)
    assert first_ack.completion is None, "task 2 is still stopping"
    last_ack = changes.acknowledge_stop(store.jobs, task_ids[2], "w2", 1, 1, NOW + 8)
    completion = last_ack.completion
    assert (completion.outcome, completion.drain_seconds) == ("blocked", 3.0), "the last ack ends the drain"
    assert statuses(store, gang_id) == [Status.BLOCKED] * 3
    assert [task.attempts_used for task in store.jobs.gang_tasks(gang_id)] == [0, 1, 0], (
        "peers refunded, trigger not"
    )
    assert protocol.complete_drains(store, NOW + 9) == []
    for task_id in task_ids:
        assert_history_is_legal(store, task_id)


def test_the_same_rank_failing_max_retries_times_fails_the_gang(store):
    workers(store, 2)
    gang_id, task_ids = submit_gang(store, size=2, max_retries=2)
    outcomes = []
    for round_number in (1, 2):
        claimed = run_gang(store, gang_id, task_ids, NOW + round_number)
        attempt = claimed[0].attempts
        protocol.fail(store, task_ids[0], "w0", attempt, NOW + round_number, 1, None, None)
        acked = changes.acknowledge_stop(
            store.jobs, task_ids[1], "w1", claimed[1].attempts, round_number, NOW + round_number
        )
        outcomes.append(acked.completion.outcome)
    assert outcomes == ["blocked", "failed"]
    assert statuses(store, gang_id) == [Status.FAILED, Status.FAILED]


def test_a_done_task_makes_the_drained_gang_fail_keeping_its_done(store):
    workers(store, 2)
    gang_id, task_ids = submit_gang(store, size=2)
    run_gang(store, gang_id, task_ids)
    protocol.complete(store, task_ids[0], "w0", 1, NOW + 1)
    failed = changes.report_failure(store.jobs, task_ids[1], "w1", 1, NOW + 2, 1)
    assert failed.drain is not None and failed.completion.outcome == "failed"
    assert statuses(store, gang_id) == [Status.DONE, Status.FAILED]


def test_reaper_drains_a_gang_whose_rank_went_silent_and_completes_in_one_pass(store):
    workers(store, 3)
    gang_id, task_ids = submit_gang(store)
    run_gang(store, gang_id, task_ids)
    protocol.heartbeat_job(store, task_ids[0], "w0", 1, NOW + 25, None)
    report = protocol.reap(store, NOW + 31, 30, 45, 600)
    (drain,) = report.drains
    assert drain.trigger.id in task_ids[1:]
    # Both silent ranks are gone: straight to preempted; the live one is told to stop.
    assert sorted(statuses(store, gang_id)) == sorted([Status.PREEMPTING, Status.PREEMPTED, Status.PREEMPTED])
    report = protocol.reap(store, NOW + 31 + 46, 1000, 45, 600)
    assert [job.id for job in report.force_drained] == [task_ids[0]]
    assert [completion.outcome for completion in report.completions] == ["blocked"]
    assert statuses(store, gang_id) == [Status.BLOCKED] * 3


def test_checkpoint_only_while_preempting_with_the_current_epoch(store):
    workers(store, 2)
    gang_id, task_ids = submit_gang(store, size=2)
    run_gang(store, gang_id, task_ids)
    payload = bytes(range(256)) * 10
    with pytest.raises(errors.NotPreempting):
        protocol.save_checkpoint(store, task_ids[0], "w0", 1, 0, payload, NOW)
    protocol.fail(store, task_ids[1], "w1", 1, NOW, 1, None, None)
    with pytest.raises(errors.StaleEpoch):
        protocol.save_checkpoint(store, task_ids[0], "w0", 1, 2, payload, NOW)
    with pytest.raises(errors.StaleAttempt):
        protocol.save_checkpoint(store, task_ids[0], "w1", 1, 1, payload, NOW)
    saved = protocol.save_checkpoint(store, task_ids[0], "w0", 1, 1, payload, NOW)
    assert saved.has_checkpoint
    assert store.jobs.get_checkpoint(task_ids[0]) == payload
    assert store.jobs.get_checkpoint(task_ids[1]) is None
    with pytest.raises(errors.NotFound):
        store.jobs.get_checkpoint("j-missing")


def test_holds_keep_capacity_for_a_gang_except_for_backfill(store):
    store.workers.register_worker(WorkerRegistration("w0", "h", Resources(2, 1000, 8192, 8)), NOW)
    store.gangs.replace_holds([Hold("g-head", "w0", Resources(gpus=2), expected_at=NOW + 100)])
    long_job = (
        protocol.submit(store, [JobSpec(command="long", resources=Resources(gpus=1), walltime_s=500)], NOW)
        .items[0]
        .job
    )
    assert store.claims.claim("w0", NOW, POLICY) is None
    short = (
        protocol.submit(
            store, [JobSpec(command="short", resources=Resources(gpus=1), walltime_s=50)], NOW + 1
        )
        .items[0]
        .job
    )
    assert store.claims.claim("w0", NOW, POLICY).id == short.id
    store.gangs.replace_holds([])
    assert store.claims.claim("w0", NOW, POLICY).id == long_job.id
    assert store.gangs.list_holds() == []


def test_a_refunded_peer_keeps_a_fence_no_later_attempt_reuses(store):
    """The old process of a drained rank must never pass for the rank's next attempt."""
    workers(store, 2)
    gang_id, task_ids = submit_gang(store, size=2)
    first = run_gang(store, gang_id, task_ids)
    report = protocol.reap(store, NOW + 31, 30, 45, 600)
    assert report.completions and report.completions[0].outcome == "blocked"
    again = run_gang(store, gang_id, task_ids, NOW + 40)
    assert again[1].attempts == first[1].attempts + 1, "the fence only grows"
    with pytest.raises(errors.StaleAttempt):
        protocol.heartbeat_job(store, task_ids[1], "w1", first[1].attempts, NOW + 41, None)
    with pytest.raises(errors.StaleAttempt):
        protocol.complete(store, task_ids[1], "w1", first[1].attempts, NOW + 41)


def test_a_gang_with_an_ended_rank_and_a_rolled_back_one_fails_instead_of_waiting_forever(store):
    workers(store, 2)
    gang_id, task_ids = submit_gang(store, size=2)
    reserve(store, gang_id, task_ids)
    store.claims.claim("w0", NOW, POLICY)
    protocol.complete(store, task_ids[0], "w0", 1, NOW + 1)
    drain, completion, rolled = changes.roll_back_stale(store.jobs, gang_id, NOW + 31, 30)
    assert drain is not None and rolled == ()
    assert completion.outcome == "failed", "a finished rank: the gang can never run whole again"
    assert statuses(store, gang_id) == [Status.DONE, Status.FAILED]


def test_an_expired_reservation_counts_as_the_triggers_attempt(store):
    workers(store, 2)
    gang_id, task_ids = submit_gang(store, size=2, max_retries=2)
    for round_number in (1, 2):
        now = NOW + 100 * round_number
        reserve(store, gang_id, task_ids, now)
        store.claims.claim("w0", now, POLICY)
        protocol.rollback_gang(store, gang_id, now + 31, 30)
        protocol.ack_preempted(store, task_ids[0], "w0", round_number, round_number, now + 32)
        protocol.complete_drain(store, gang_id, now + 32)
    assert statuses(store, gang_id) == [Status.FAILED, Status.FAILED], (
        "a worker that never claims cannot loop forever"
    )


def test_a_retried_watchdog_report_for_a_drained_rank_is_refused(store):
    workers(store, 2)
    gang_id, task_ids = submit_gang(store, size=2)
    run_gang(store, gang_id, task_ids)
    tripped = protocol.watchdog_trip(store, task_ids[0], "w0", 1, NOW, "stall", "idle", max_retries=3)
    assert (tripped.status, tripped.watchdog_retries, tripped.attempts_used) == (Status.PREEMPTED, 1, 0)
    with pytest.raises(errors.NotRunning):
        protocol.watchdog_trip(store, task_ids[0], "w0", 1, NOW, "stall", "idle", max_retries=3)


def test_a_peer_finishing_during_the_drain_completes_it_as_failed(store):
    workers(store, 2)
    gang_id, task_ids = submit_gang(store, size=2)
    run_gang(store, gang_id, task_ids)
    protocol.fail(store, task_ids[1], "w1", 1, NOW, 1, None, None)
    completion = changes.report_done(store.jobs, task_ids[0], "w0", 1, NOW + 1).completion
    assert completion is not None and completion.outcome == "failed"
    assert statuses(store, gang_id) == [Status.DONE, Status.FAILED]


class RacingPlacement(Claim):
    """The claim's policy, with another replica acting on the gang at the worst moment: after the
    claim has read the worker's allocations, before it locks the reserved task."""

    def __init__(self, act) -> None:
        super().__init__()
        self.act = act

    def reserved_task(self, worker, allocations):
        chosen = super().reserved_task(worker, allocations)
        if chosen is not None:
            self.act()
        return chosen


@pytest.mark.postgres
def test_a_claim_does_not_start_a_reservation_cancelled_since_it_read_the_worker(postgres_store):
    store = postgres_store
    other = open_store(store.url, migrate=False)
    try:
        workers(store, 2)
        gang_id, task_ids = submit_gang(store, size=2)
        reserve(store, gang_id, task_ids)
        racing = RacingPlacement(lambda: protocol.cancel(other, task_ids[0], NOW))
        assert store.claims.claim("w0", NOW, racing) is None, "it was a 500: cancelled -> running"
        assert statuses(store, gang_id) == [Status.CANCELLED] * 2
    finally:
        other.close()


@pytest.mark.postgres
def test_a_claim_does_not_start_a_reservation_moved_to_another_worker(postgres_store):
    """Seed 001's stale claim: the reservation was rolled back and the rank re-reserved on w2; the
    old worker must not run it (it did, on the GPUs chosen for w2, and w2's reservation was lost)."""
    store = postgres_store
    other = open_store(store.url, migrate=False)
    try:
        workers(store, 3)
        gang_id, task_ids = submit_gang(store, size=2)
        reserve(store, gang_id, task_ids)

        def move_rank_zero() -> None:
            protocol.rollback_gang(other, gang_id, NOW + 31, 30)
            placements = [(task_ids[0], "w2", (0,)), (task_ids[1], "w1", (0,))]
            assert protocol.reserve_gang(other, gang_id, placements, NOW + 31) is not None

        assert store.claims.claim("w0", NOW + 32, RacingPlacement(move_rank_zero)) is None
        rank_zero = store.jobs.get_job(task_ids[0])
        assert (rank_zero.status, rank_zero.worker_id) == (Status.RESERVED, "w2")
        assert store.claims.claim("w2", NOW + 33, POLICY).id == task_ids[0]
    finally:
        other.close()


def test_a_rollback_decided_on_an_older_reservation_epoch_changes_nothing(store):
    """Seed 001's epoch check (DESIGN.md: ``reserved`` -> ``blocked`` undoes the reservation the
    cycle found stale): a cycle read the gang reserved under epoch 1; before its rollback applied,
    another replica rolled the gang back and reserved it again (epoch 2). The late rollback does
    not undo the new reservation, even one as old by then; a rollback of the current epoch does."""
    workers(store, 3)
    gang_id, task_ids = submit_gang(store)
    first = reserve(store, gang_id, task_ids)
    read = {job.id: job.reservation_epoch for job in first}
    assert set(read.values()) == {1}
    assert protocol.rollback_gang(store, gang_id, NOW + 31, 30)
    again = reserve(store, gang_id, task_ids, now=NOW + 31)
    assert {job.reservation_epoch for job in again} == {2}
    late = changes.roll_back_stale(store.jobs, gang_id, NOW + 62, 30, read)
    assert late == (None, None, ())
    assert statuses(store, gang_id) == [Status.RESERVED] * 3
    current = {job.id: job.reservation_epoch for job in again}
    _, _, rolled = changes.roll_back_stale(store.jobs, gang_id, NOW + 62, 30, current)
    assert [job.status for job in rolled] == [Status.BLOCKED] * 3


def test_a_preemptors_rollback_decided_on_an_older_reservation_epoch_changes_nothing(store):
    """The same check for a single job's reservation (a preemptor's): a late rollback of epoch 1
    leaves the job reserved again under epoch 2."""
    workers(store, 1)
    job = protocol.submit(store, [JobSpec(command="single", resources=Resources(gpus=1))], NOW).items[0].job

    def reserve_single(now):
        def decide(locked, gang):
            return Plan((drain.reserve_one(locked, "w0", (0,), now, "reserved on {worker}"),), None)

        store.jobs.change(job.id, decide)
        return store.jobs.get_job(job.id)

    assert reserve_single(NOW).reservation_epoch == 1
    assert changes.roll_back_single(store.jobs, job.id, NOW + 31, 30, epoch=1) is not None
    assert reserve_single(NOW + 31).reservation_epoch == 2
    assert changes.roll_back_single(store.jobs, job.id, NOW + 62, 30, epoch=1) is None
    assert store.jobs.get_job(job.id).status == Status.RESERVED
    assert changes.roll_back_single(store.jobs, job.id, NOW + 62, 30, epoch=2).status == Status.PENDING
