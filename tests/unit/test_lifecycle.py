"""The rules of ``corral.core.lifecycle`` and ``corral.core.drain`` on plain values: no store, no
clock. Each test names the seed rule it checks; the walk at the end drives random reports through
a gang and checks that every plan keeps the history legal."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from corral.core import drain, lifecycle
from corral.domain import errors
from corral.domain.records import Job, JobSpec
from corral.domain.resources import Resources
from corral.domain.status import TERMINAL, Status, is_allowed
from corral.domain.transitions import Plan, applied

NOW = 1_000.0


def job(job_id: str = "j-1", max_retries: int = 3, **fields: object) -> Job:
    spec = JobSpec(command="true", max_retries=max_retries, resources=Resources(gpus=1))
    return Job(id=job_id, spec=spec, status=Status.PENDING, submitted_at=0.0, **fields)  # type: ignore[arg-type]


def gang(size: int = 2, max_retries: int = 3) -> tuple[Job, ...]:
    spec = JobSpec(command="train", gang_size=size, max_retries=max_retries, resources=Resources(gpus=1))
    return tuple(
        Job(
            id=f"j-{index}",
            spec=spec,
            status=Status.BLOCKED,
            submitted_at=0.0,
            gang_id="g-1",
            gang_index=index,
        )
        for index in range(size)
    )


def running(task: Job, worker_id: str = "w1", now: float = NOW) -> Job:
    return lifecycle.start(task, worker_id, (0,), now).after


def run_gang(tasks: tuple[Job, ...]) -> tuple[Job, ...]:
    return tuple(running(task, f"w{task.gang_index}") for task in tasks)


def apply(jobs: tuple[Job, ...], plan: Plan[object]) -> tuple[Job, ...]:
    for transition in plan.transitions:
        current = {each.id: each for each in jobs}[transition.before.id]
        assert transition.before == current, "a plan's transitions chain on the rows they change"
        if transition.changes_status:
            assert is_allowed(transition.before.status, transition.after.status)
            assert transition.after.version == transition.before.version + 1
        jobs = applied(jobs, (transition,))
    return jobs


# --- the claim and the fence ----------------------------------------------------------------------


def test_a_claim_starts_a_new_attempt_the_fence_of_its_reports():
    started = running(job())
    assert (started.status, started.attempts, started.worker_id, started.reason) == (
        Status.RUNNING,
        1,
        "w1",
        None,
    )
    with pytest.raises(errors.StaleAttempt):
        lifecycle.report_done(started, (), "w1", 2, NOW)
    with pytest.raises(errors.StaleAttempt):
        lifecycle.report_done(started, (), "w2", 1, NOW)


# --- seed 000's retry rule ---------------------------------------------------------------------------


@pytest.mark.parametrize(("max_retries", "runs"), [(0, 1), (1, 1), (3, 3)])
def test_a_failed_attempt_is_retried_while_counted_attempts_are_under_max_retries(max_retries, runs):
    current = job(max_retries=max_retries)
    outcomes = []
    for attempt in range(1, runs + 1):
        current = running(current)
        current = lifecycle.report_failure(current, (), "w1", attempt, NOW, 1, "boom", "tail").outcome.job
        outcomes.append(current.status)
    assert outcomes == [Status.PENDING] * (runs - 1) + [Status.FAILED]


def test_a_release_gives_the_attempt_back():
    started = running(job(max_retries=1))
    released = lifecycle.report_failure(
        started, (), "w1", 1, NOW, None, "worker shut down", None, release=True
    )
    assert (released.outcome.job.status, released.outcome.job.attempts_used) == (Status.PENDING, 0)


# --- seed 004's watchdog rule ---------------------------------------------------------------------------


def test_a_trip_requeues_at_the_front_without_spending_an_attempt_then_fails_past_the_cap():
    current = job(max_retries=1)
    for attempt, expected in ((1, Status.PENDING), (2, Status.PENDING), (3, Status.FAILED)):
        current = running(current)
        plan = lifecycle.report_trip(current, (), "w1", attempt, NOW, "stall", "idle", max_retries=2)
        current = plan.outcome.job
        assert current.status == expected
    assert (current.watchdog_retries, current.attempts_used) == (2, 1)
    assert plan.outcome.trip_outcome == "failed"


def test_a_rank_trip_drains_the_gang_and_its_completion_puts_the_gang_at_the_front():
    tasks = run_gang(gang())
    plan = lifecycle.report_trip(tasks[0], tasks, "w0", 1, NOW, "stall", "idle", max_retries=3)
    assert plan.outcome.trip_outcome is None, "the drain's completion decides it"
    tasks = apply(tasks, plan)
    assert [task.status for task in tasks] == [Status.PREEMPTED, Status.PREEMPTING]
    acked = lifecycle.acknowledge_stop(tasks[1], tasks, "w1", 1, 1, NOW + 1)
    tasks = apply(tasks, acked)
    assert acked.outcome.completion is not None
    assert (acked.outcome.completion.outcome, acked.outcome.completion.watchdog_trips) == (
        "blocked",
        ("stall",),
    )
    assert [(task.status, task.queue_front) for task in tasks] == [(Status.BLOCKED, True)] * 2
    assert [task.attempts_used for task in tasks] == [0, 0], (
        "the trip spent no attempt, the peer was refunded"
    )


# --- seed 000's drain and completion rule ------------------------------------------------------------------


def test_the_trigger_keeps_its_attempt_and_running_peers_are_refunded():
    tasks = run_gang(gang(3))
    plan = lifecycle.report_failure(tasks[1], tasks, "w1", 1, NOW, 1, "crash", None)
    tasks = apply(tasks, plan)
    assert [task.status for task in tasks] == [Status.PREEMPTING, Status.PREEMPTED, Status.PREEMPTING]
    assert [task.attempts_used for task in tasks] == [0, 1, 0]
    assert {task.preemption_epoch for task in tasks} == {1}
    assert plan.outcome.drain is not None and plan.outcome.drain.trigger.id == "j-1"


def test_a_gang_fails_once_any_task_is_out_of_retries():
    tasks = gang(2, max_retries=1)
    tasks = run_gang(tasks)
    tasks = apply(tasks, lifecycle.report_failure(tasks[0], tasks, "w0", 1, NOW, 1, None, None))
    plan = lifecycle.acknowledge_stop(tasks[1], tasks, "w1", 1, 1, NOW)
    tasks = apply(tasks, plan)
    assert plan.outcome.completion is not None and plan.outcome.completion.outcome == "failed"
    assert {task.status for task in tasks} == {Status.FAILED}


def test_a_rank_done_beside_a_reserved_peer_completes_nothing():
    """The peer is in flight: it is claimed next (or its reservation expires and drains the gang)."""
    tasks = gang()
    tasks = (
        running(tasks[0], "w0"),
        replace(tasks[1], status=Status.RESERVED, worker_id="w1", reserved_at=NOW),
    )
    plan = lifecycle.report_done(tasks[0], tasks, "w0", 1, NOW)
    assert plan.outcome.completion is None
    assert [task.status for task in apply(tasks, plan)] == [Status.DONE, Status.RESERVED]


def test_a_stale_reservation_beside_a_finished_rank_drains_and_fails_the_gang():
    tasks = gang()
    tasks = (
        replace(running(tasks[0], "w0"), status=Status.DONE),
        replace(tasks[1], status=Status.RESERVED, worker_id="w1", reserved_at=NOW - 31),
    )
    plan = drain.stale_reservation(tasks, NOW, 30)
    started, completion, rolled = plan.outcome
    assert started is not None and completion is not None and rolled == ()
    assert completion.outcome == "failed"
    assert [task.status for task in apply(tasks, plan)] == [Status.DONE, Status.FAILED]


def test_a_stale_reservation_alone_rolls_back_and_the_admission_sees_the_same_staleness():
    tasks = tuple(
        replace(task, status=Status.RESERVED, worker_id="w", reserved_at=NOW - 31) for task in gang()
    )
    assert drain.stale_tasks(tasks, NOW, 30) == tasks
    assert drain.stale_tasks(tasks, NOW - 2, 30) == ()
    plan = drain.stale_reservation(tasks, NOW, 30)
    assert [task.status for task in apply(tasks, plan)] == [Status.BLOCKED] * 2


def test_a_lease_expiry_treats_every_silent_peer_as_gone():
    tasks = run_gang(gang(3))
    tasks = (replace(tasks[0], last_heartbeat_at=NOW + 25), *tasks[1:])
    plan = lifecycle.lease_expired(tasks[1], tasks, NOW + 31, 30)
    tasks = apply(tasks, plan)
    assert [task.status for task in tasks] == [Status.PREEMPTING, Status.PREEMPTED, Status.PREEMPTED]


# --- a random walk: whatever happens, every plan is legal and the gang ends once ------------------------


def test_random_reports_keep_every_history_legal_and_end_the_gang_once():
    rng = random.Random(7)
    for _ in range(300):
        tasks = run_gang(gang(rng.randint(2, 4), max_retries=rng.randint(1, 3)))
        now = NOW
        for _step in range(12):
            now += 1
            live = [task for task in tasks if task.status in (Status.RUNNING, Status.PREEMPTING)]
            if not live:
                break
            task = rng.choice(live)
            worker = task.worker_id or ""
            action = rng.choice(["done", "fail", "trip", "ack", "lease"])
            try:
                if action == "done":
                    plan = lifecycle.report_done(task, tasks, worker, task.attempts, now)
                elif action == "fail":
                    plan = lifecycle.report_failure(task, tasks, worker, task.attempts, now, 1, None, None)
                elif action == "trip":
                    plan = lifecycle.report_trip(task, tasks, worker, task.attempts, now, "stall", "", 2)
                elif action == "ack":
                    plan = lifecycle.acknowledge_stop(
                        task, tasks, worker, task.attempts, task.preemption_epoch, now
                    )
                else:
                    plan = lifecycle.lease_expired(task, tasks, now + 100, 30)  # type: ignore[assignment]
            except errors.Conflict:
                continue
            tasks = apply(tasks, plan)
        statuses = {task.status for task in tasks}
        if statuses & {Status.RUNNING, Status.PREEMPTING, Status.RESERVED}:
            continue
        # nothing in flight: the gang is wholly back in the queue, or it has ended
        assert statuses <= {Status.BLOCKED} or statuses <= TERMINAL, statuses
