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
    """``task`` claimed by ``worker_id`` (a gang task, as if reserved there first)."""
    if task.status == Status.BLOCKED:
        task = replace(task, status=Status.RESERVED, worker_id=worker_id, reserved_at=now)
    started = lifecycle.start(task, worker_id, (0,), now)
    assert started is not None
    return started.after


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


def _step(tasks: tuple[Job, ...], rng: random.Random, now: float) -> Plan[object] | None:
    """One random thing happening to a gang: a report from a live rank, a cancel, a reaper pass, a
    stale reservation, or (once it is wholly blocked) the admission cycle and the claims."""
    statuses = {task.status for task in tasks}
    if statuses == {Status.BLOCKED}:
        placements = {task.id: (f"w{task.gang_index}", (0,)) for task in tasks}
        return drain.reserve(tasks, placements, 29500, now)
    reserved = [task for task in tasks if task.status == Status.RESERVED]
    if reserved and rng.random() < 0.7:
        task = rng.choice(reserved)
        started = lifecycle.start(task, task.worker_id or "", (0,), now)
        return Plan((started,), None) if started else None
    if reserved and rng.random() < 0.5:
        return drain.stale_reservation(tasks, now + 1000, 30)
    live = [task for task in tasks if task.status in (Status.RUNNING, Status.PREEMPTING)]
    if not live or rng.random() < 0.05:
        return lifecycle.cancel(tasks[0], tasks, now) if not statuses <= TERMINAL else None
    task = rng.choice(live)
    worker, attempt = task.worker_id or "", task.attempts
    action = rng.choice(["done", "fail", "release", "trip", "ack", "lease", "force"])
    if action == "done":
        return lifecycle.report_done(task, tasks, worker, attempt, now)
    if action in ("fail", "release"):
        return lifecycle.report_failure(task, tasks, worker, attempt, now, 1, None, None, action == "release")
    if action == "trip":
        return lifecycle.report_trip(task, tasks, worker, attempt, now, "stall", "", 2)
    if action == "ack":
        return lifecycle.acknowledge_stop(task, tasks, worker, attempt, task.preemption_epoch, now)
    if action == "lease":
        return lifecycle.lease_expired(task, tasks, now + 100, 30)  # type: ignore[return-value]
    return lifecycle.force_drain(task, tasks, now + 100, 45, task.preemption_epoch)  # type: ignore[return-value]


def test_random_histories_stay_legal_and_every_gang_ends_once():
    """Gangs run, fail, trip, drain, get cancelled, re-run, many times over: every plan is legal
    and chains on its rows, ``attempts`` never shrinks, a gang with nothing in flight is wholly
    back in the queue or ended, and every gang ends within its retries and watchdog cap."""
    rng = random.Random(7)
    for _ in range(400):
        tasks = gang(rng.randint(2, 4), max_retries=rng.randint(0, 3))
        now = NOW
        for _step_number in range(200):
            now += 1
            before = {task.id: task.attempts for task in tasks}
            try:
                plan = _step(tasks, rng, now)
            except errors.Conflict:
                continue
            if plan is None:
                continue
            tasks = apply(tasks, plan)
            assert all(task.attempts >= before[task.id] for task in tasks), "attempts only grow"
            statuses = {task.status for task in tasks}
            if not statuses & {Status.RUNNING, Status.PREEMPTING, Status.RESERVED}:
                assert statuses <= {Status.BLOCKED} or statuses <= TERMINAL, statuses
            if statuses <= TERMINAL:
                break
        assert {task.status for task in tasks} <= TERMINAL, "every gang ends: retries and the cap bound it"


# --- found in review -------------------------------------------------------------------------------


def test_a_claim_starts_only_a_pending_job_or_one_reserved_on_this_worker():
    """Seed 001: a reservation rolled back, or moved to another worker, is not claimed."""
    pending = job()
    reserved = replace(job(), status=Status.RESERVED, worker_id="w1", reserved_at=NOW)
    assert lifecycle.start(pending, "w9", (), NOW) is not None
    assert lifecycle.start(reserved, "w1", (), NOW) is not None
    assert lifecycle.start(reserved, "w2", (), NOW) is None
    assert lifecycle.start(replace(reserved, status=Status.BLOCKED), "w1", (), NOW) is None
    assert lifecycle.start(replace(reserved, status=Status.CANCELLED), "w1", (), NOW) is None


@pytest.mark.parametrize("end", ["trip", "release"])
def test_a_gang_with_max_retries_0_is_requeued_by_a_drain_that_cost_no_attempt(end):
    """0 and 1 both mean one attempt: a drain begun by a trip under the cap (or a worker handing
    its rank back) refunds everybody, so the gang goes back to the queue, as a single job does."""
    tasks = run_gang(gang(2, max_retries=0))
    if end == "trip":
        plan = lifecycle.report_trip(tasks[0], tasks, "w0", 1, NOW, "stall", "idle", max_retries=3)
    else:
        plan = lifecycle.report_failure(tasks[0], tasks, "w0", 1, NOW, None, "shutdown", None, release=True)
    tasks = apply(tasks, plan)
    acked = lifecycle.acknowledge_stop(tasks[1], tasks, "w1", 1, 1, NOW + 1)
    assert acked.outcome.completion is not None and acked.outcome.completion.outcome == "blocked"


def test_a_gang_re_queued_at_the_front_loses_the_spot_after_a_drain_without_a_trip():
    tasks = tuple(replace(task, queue_front=True) for task in run_gang(gang(2)))
    tasks = apply(tasks, lifecycle.report_failure(tasks[0], tasks, "w0", 1, NOW, 1, None, None))
    tasks = apply(tasks, lifecycle.acknowledge_stop(tasks[1], tasks, "w1", 1, 1, NOW + 1))
    assert [(task.status, task.queue_front) for task in tasks] == [(Status.BLOCKED, False)] * 2


def test_a_rank_that_ends_while_being_stopped_keeps_what_it_reported():
    tasks = run_gang(gang(2))
    tasks = apply(tasks, lifecycle.report_failure(tasks[0], tasks, "w0", 1, NOW, 3, "boom", None))
    plan = lifecycle.report_failure(tasks[1], tasks, "w1", 1, NOW, 1, "peer lost", "tail")
    stopped = next(t.after for t in plan.transitions if t.after.id == "j-1" and t.changes_status)
    assert (stopped.status, stopped.exit_code, stopped.error, stopped.output_tail) == (
        Status.PREEMPTED,
        1,
        "peer lost",
        "tail",
    )


def test_a_trip_past_the_cap_beside_finished_peers_tells_of_no_drain():
    tasks = run_gang(gang(2))
    tasks = (tasks[0], replace(tasks[1], status=Status.DONE))
    plan = lifecycle.report_trip(tasks[0], tasks, "w0", 1, NOW, "budget", "late", max_retries=0)
    assert (plan.outcome.job.status, plan.outcome.drain, plan.outcome.trip_outcome) == (
        Status.FAILED,
        None,
        "failed",
    )


# --- the busy ghost ---------------------------------------------------------------------------------


def test_the_ghost_cutoff_is_the_previous_heartbeat_and_at_least_a_third_of_the_lease():
    assert lifecycle.ghost_cutoff(None, NOW, 30) is None
    assert lifecycle.ghost_cutoff(NOW - 15, NOW, 30) == NOW - 15
    assert lifecycle.ghost_cutoff(NOW - 1, NOW, 30) == NOW - 10


def test_a_job_gone_from_its_worker_is_lost_unless_it_moved_on():
    silent = replace(running(job()), last_heartbeat_at=NOW - 20)
    lost = lifecycle.gone_from_worker(silent, (), "w1", NOW - 15, NOW)
    assert lost.outcome is not None and lost.outcome.job.status == Status.PENDING
    beating = replace(silent, last_heartbeat_at=NOW - 1)
    assert lifecycle.gone_from_worker(beating, (), "w1", NOW - 15, NOW).outcome is None
    assert lifecycle.gone_from_worker(silent, (), "w2", NOW - 15, NOW).outcome is None
    stopping = replace(silent, status=Status.PREEMPTING, preemption_epoch=1)
    stopped = lifecycle.gone_from_worker(stopping, (), "w1", NOW - 15, NOW)
    assert stopped.outcome is not None and stopped.outcome.job.status == Status.PREEMPTED


@pytest.mark.parametrize("code", ["walltime_exceeded", "no_such_account", "workdir_unavailable"])
def test_a_gang_whose_rank_failed_for_good_fails_at_its_drains_completion(code):
    """A rank at its walltime (or on a host that cannot run it): the next attempt would meet it
    again, so the gang is not re-queued, with all its retries left."""
    tasks = run_gang(gang(2, max_retries=3))
    plan = lifecycle.report_failure(tasks[0], tasks, "w0", 1, NOW, 143, "stopped", None, failure_code=code)
    tasks = apply(tasks, plan)
    assert tasks[0].reason is not None and tasks[0].reason.code == code
    assert [task.status for task in tasks] == [Status.PREEMPTED, Status.PREEMPTING]
    done = lifecycle.acknowledge_stop(tasks[1], tasks, "w1", 1, 1, NOW + 1)
    tasks = apply(tasks, done)
    assert done.outcome.completion is not None and done.outcome.completion.outcome == "failed"
    assert {task.status for task in tasks} == {Status.FAILED}
    assert code in (tasks[0].reason.message if tasks[0].reason else "")


def test_a_gang_whose_rank_was_killed_for_memory_is_re_queued():
    """``oom_killed`` is retried like any failure (API.md)."""
    tasks = run_gang(gang(2, max_retries=3))
    tasks = apply(
        tasks,
        lifecycle.report_failure(tasks[0], tasks, "w0", 1, NOW, 137, "oom", None, failure_code="oom_killed"),
    )
    done = lifecycle.acknowledge_stop(tasks[1], tasks, "w1", 1, 1, NOW + 1)
    assert done.outcome.completion is not None and done.outcome.completion.outcome == "blocked"


def test_a_claim_that_chose_an_older_reservation_does_not_start_the_one_made_since():
    """Seed 001's epoch check: a claim that chose the task's reservation under epoch 1 does not
    start it once it is reserved again (epoch 2), even on the same worker; the current epoch, or
    none given, starts it."""
    reserved = replace(job(), status=Status.RESERVED, worker_id="w1", reserved_at=NOW, reservation_epoch=2)
    assert lifecycle.start(reserved, "w1", (0,), NOW, reservation_epoch=1) is None
    assert lifecycle.start(reserved, "w1", (0,), NOW, reservation_epoch=2) is not None
    assert lifecycle.start(reserved, "w1", (0,), NOW) is not None
    assert lifecycle.start(job(), "w1", (0,), NOW, reservation_epoch=7) is not None, "pending: no epoch"


def test_a_rollback_found_stale_under_one_epoch_leaves_a_newer_reservation_alone():
    tasks = tuple(
        replace(task, status=Status.RESERVED, worker_id="w", reserved_at=NOW - 31, reservation_epoch=2)
        for task in gang()
    )
    read_before = {task.id: 1 for task in tasks}
    assert drain.stale_reservation(tasks, NOW, 30, read_before).transitions == ()
    current = {task.id: 2 for task in tasks}
    plan = drain.stale_reservation(tasks, NOW, 30, current)
    assert [task.status for task in apply(tasks, plan)] == [Status.BLOCKED] * 2
    single = replace(tasks[0], gang_id=None, gang_index=None)
    assert lifecycle.stale_single_reservation(single, (), NOW, 30, epoch=1).outcome is None
    assert lifecycle.stale_single_reservation(single, (), NOW, 30, epoch=2).outcome is not None


def test_the_phase_is_timed_from_the_first_checkpoint_answer_the_hint():
    """The decision starts the phase's clock; the first heartbeat answer asking for the checkpoint
    (the hint) is when the worker is told: the duration the job's expected checkpoint time and the
    histogram take counts from there. A checkpoint that came before any hint records no time."""
    victim = replace(
        running(job()), status=Status.PREEMPTING, checkpoint_deadline=100.0 + 600, preemption_epoch=1
    )
    hinted = lifecycle.heartbeat_action(victim, 130.0, None, 600, 300)
    assert hinted.outcome.action == "checkpoint"
    told = hinted.outcome.job
    assert told.checkpoint_requested_at == 130.0
    again = lifecycle.heartbeat_action(told, 135.0, None, 600, 300)
    assert again.transitions == () and again.outcome.job.checkpoint_requested_at == 130.0
    accepted = lifecycle.accept_checkpoint(told, (), told.worker_id or "", told.attempts, 1, 137.0)
    assert accepted.outcome.phase_seconds == 7.0
    assert accepted.outcome.job.checkpoint_durations == (7.0,)
    unasked = lifecycle.accept_checkpoint(victim, (), victim.worker_id or "", victim.attempts, 1, 137.0)
    assert unasked.outcome.phase_seconds is None and unasked.outcome.job.checkpoint_durations == ()
