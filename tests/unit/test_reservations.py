"""Reservations (backfill as Slurm does it): the cycle plans the first waiting gangs and jobs at
their earliest start from the running work's deadlines, and the claim starts other work on their
room only when it ends before they start (``corral.core.reservations``, ``placement.holds_in_way``)."""

from __future__ import annotations

from dataclasses import replace

from corral.core.admission import decide
from corral.core.claim import Claim
from corral.core.explain import explain_pending
from corral.core.placement import free_capacity
from corral.core.reservations import Ask, Booking, Timelines, WorkerLine, book
from corral.domain.records import Allocation, Hold, Job, Worker
from corral.domain.resources import Resources
from corral.protocol.wire import job_to_wire
from corral.testing.factories import admission_snapshot, allocation_on, gang, gpu_job, gpu_workers

NOW = 1_000.0


def two_workers() -> tuple[list[Worker], Allocation]:
    """Two workers of 2 GPUs; a 2-GPU job with a 30 s limit runs on the first."""
    workers = gpu_workers(2, gpus=2)
    running = allocation_on(workers[0], gpus=2, job_id="j-limited")
    return workers, running


def with_walltime(job: Job, walltime_s: float | None) -> Job:
    return replace(job, spec=replace(job.spec, walltime_s=walltime_s))


def claim_on(worker: Worker, allocations: list[Allocation], holds: tuple[Hold, ...], job: Job) -> Job | None:
    on_worker = [hold for hold in holds if hold.worker_id == worker.id]
    mine = [allocation for allocation in allocations if allocation.worker_id == worker.id]
    chosen = Claim().choose(worker, free_capacity(worker, mine), [job], on_worker, NOW)
    return None if chosen is None else chosen[0]


def test_a_blocked_gang_behind_a_job_with_a_limit_is_planned_at_that_limit() -> None:
    workers, running = two_workers()
    blocked = gang(size=2, gpus=2, gang_id="g-big")
    decisions = decide(
        admission_snapshot(workers, [blocked], [running], now=NOW, expected_ends={"j-limited": NOW + 30}),
        30.0,
    )
    assert decisions.reservations == ()
    assert sorted((hold.worker_id, hold.expected_at, hold.resources.gpus) for hold in decisions.holds) == [
        (workers[0].id, NOW + 30, 2),
        (workers[1].id, NOW + 30, 2),
    ]
    (waiting,) = decisions.waiting
    assert waiting.reason.code == "reserved_for_later"
    assert "1970-01-01T00:17:10.000Z" in waiting.reason.message  # NOW + 30
    assert "when jobs j-limited reach their limits" in waiting.reason.message
    wire = job_to_wire(blocked.tasks[0], decisions.holds)
    assert wire["estimated_start_at"] == "1970-01-01T00:17:10.000Z"
    assert wire["planned_workers"] == sorted(worker.id for worker in workers)


def test_a_short_job_backfills_onto_the_reserved_worker_and_one_without_walltime_does_not() -> None:
    workers, running = two_workers()
    blocked = gang(size=2, gpus=2, gang_id="g-big")
    decisions = decide(
        admission_snapshot(workers, [blocked], [running], now=NOW, expected_ends={"j-limited": NOW + 30}),
        30.0,
    )
    short = with_walltime(gpu_job(1, job_id="j-short"), 5)
    endless = gpu_job(1, job_id="j-endless")
    too_long = with_walltime(gpu_job(1, job_id="j-long"), 31)
    assert claim_on(workers[1], [running], decisions.holds, short) is short
    assert claim_on(workers[1], [running], decisions.holds, endless) is None
    assert claim_on(workers[1], [running], decisions.holds, too_long) is None
    assert claim_on(workers[1], [running], decisions.holds, with_walltime(too_long, 30)) is not None, (
        "ending exactly at the start is before it"
    )
    (reason,) = explain_pending(endless, workers, [running], decisions.holds, NOW)
    assert reason.code == "backfill_refused"
    assert "would delay gang g-big planned for 1970-01-01T00:17:10.000Z" in reason.message


def test_room_the_reservation_does_not_take_is_free_for_any_work() -> None:
    workers = gpu_workers(2, gpus=4)
    running = allocation_on(workers[0], gpus=2, job_id="j-limited")
    blocked = gang(size=2, gpus=3, gang_id="g-big")
    decisions = decide(
        admission_snapshot(workers, [blocked], [running], now=NOW, expected_ends={"j-limited": NOW + 30}),
        30.0,
    )
    assert {hold.worker_id: hold.resources.gpus for hold in decisions.holds} == {
        workers[0].id: 3,
        workers[1].id: 3,
    }
    assert claim_on(workers[1], [running], decisions.holds, gpu_job(1, job_id="j-one")) is not None
    assert claim_on(workers[1], [running], decisions.holds, gpu_job(2, job_id="j-two")) is None


def test_a_gang_whose_room_depends_on_work_without_a_deadline_gets_no_estimated_start() -> None:
    workers, running = two_workers()
    blocked = gang(size=2, gpus=2, gang_id="g-big")
    decisions = decide(admission_snapshot(workers, [blocked], [running], now=NOW), 30.0)
    assert decisions.holds, "the head still keeps the room it will need"
    assert {hold.expected_at for hold in decisions.holds} == {None}
    assert decisions.waiting[0].reason.code == "head_of_queue"
    assert job_to_wire(blocked.tasks[0], decisions.holds)["estimated_start_at"] is None
    short = with_walltime(gpu_job(1, job_id="j-short"), 5)
    assert claim_on(workers[1], [running], decisions.holds, short) is None, (
        "nothing backfills an unknown start"
    )


def test_the_gangs_behind_the_first_are_planned_too() -> None:
    """The head needs both workers once both jobs end (at 60 s); a one-task gang behind it that
    ends by then is planned on the first worker at 30 s, one without a walltime after the head
    (which runs for good): no start."""
    workers = gpu_workers(2, gpus=2)
    busy = [
        allocation_on(workers[0], gpus=2, job_id="j-30"),
        allocation_on(workers[1], gpus=2, job_id="j-60"),
    ]
    head = gang(size=2, gpus=2, gang_id="g-head")
    fits_between = gang(size=1, gpus=2, walltime_s=20, gang_id="g-between")
    endless = gang(size=1, gpus=2, gang_id="g-endless", submitted_at=1.0)
    snapshot = admission_snapshot(
        workers,
        [head, fits_between, endless],
        busy,
        now=NOW,
        expected_ends={"j-30": NOW + 30, "j-60": NOW + 60},
    )
    decisions = decide(snapshot, 30.0)
    starts = {(hold.gang_id, hold.worker_id): hold.expected_at for hold in decisions.holds}
    assert starts == {
        ("g-head", workers[0].id): NOW + 60,
        ("g-head", workers[1].id): NOW + 60,
        ("g-between", workers[0].id): NOW + 30,
    }
    reasons = {waiting.gang_id: waiting.reason.code for waiting in decisions.waiting}
    assert reasons == {
        "g-head": "reserved_for_later",
        "g-between": "reserved_for_later",
        "g-endless": "insufficient_capacity",
    }
    only_head = decide(snapshot, 30.0, backfill_depth=1)
    assert {hold.gang_id for hold in only_head.holds} == {"g-head"}


def test_a_depth_of_zero_keeps_only_the_head_hold() -> None:
    workers, running = two_workers()
    blocked = gang(size=2, gpus=2, gang_id="g-big")
    snapshot = admission_snapshot(
        workers, [blocked], [running], now=NOW, expected_ends={"j-limited": NOW + 30}
    )
    decisions = decide(snapshot, 30.0, backfill_depth=0)
    assert {hold.expected_at for hold in decisions.holds} == {NOW + 30}
    assert decisions.waiting[0].reason.code == "head_of_queue"


def test_a_pending_job_that_fits_nowhere_now_is_planned_and_its_own_claim_may_use_the_room() -> None:
    workers = gpu_workers(2, gpus=2)
    busy = [
        allocation_on(workers[0], gpus=1, job_id="j-30"),
        allocation_on(workers[1], gpus=1, job_id="j-60"),
    ]
    big = gpu_job(2, job_id="j-big")
    snapshot = admission_snapshot(
        workers, [], busy, now=NOW, expected_ends={"j-30": NOW + 30, "j-60": NOW + 60}, pending=[big]
    )
    decisions = decide(snapshot, 30.0)
    assert [(hold.gang_id, hold.worker_id, hold.expected_at) for hold in decisions.holds] == [
        ("j-big", workers[0].id, NOW + 30)
    ]
    assert claim_on(workers[0], busy, decisions.holds, gpu_job(1, job_id="j-small")) is None
    (reason,) = explain_pending(big, workers, busy, decisions.holds, NOW)
    assert reason.code == "reserved_for_later"
    assert job_to_wire(big, decisions.holds)["planned_workers"] == [workers[0].id]


def test_a_booking_that_starts_later_shrinks_the_room_of_work_that_would_outlast_it() -> None:
    line = WorkerLine("w", 0, (2, 0, 0), (2, 0, 0), [], [Booking("g-later", NOW + 50, None, (2, 0, 0))])
    assert book([line], Ask("g-endless", Resources(gpus=2), 1, None), NOW) is None, "booked for good"
    assert book([line], Ask("g-short", Resources(gpus=2), 1, 40.0), NOW) is not None
    line = WorkerLine("w", 0, (2, 0, 0), (2, 0, 0), [], [Booking("g-later", NOW + 50, NOW + 80, (2, 0, 0))])
    planned = book([line], Ask("g-long", Resources(gpus=2), 1, 60.0), NOW)
    assert planned is not None and planned.start == NOW + 80


def test_asks_with_other_constraints_never_read_offers_kept_for_an_earlier_asks_constraints() -> None:
    """The offers are kept per constraints object; an earlier ask's list, once freed, may leave its
    address (its ``id``) to the next ask's list: each ask still lands on a worker it may use."""
    lines = [
        WorkerLine(worker_id=f"w{order}", order=order, empty=(2, 8, 1024), free=(2, 8, 1024), releases=[])
        for order in range(4)
    ]
    timelines = Timelines(lines)
    for wanted in (3, 2, 1, 0):
        eligible = [order == wanted for order in range(4)]
        ask = Ask(f"j{wanted}", Resources(gpus=1, cpus=1, memory_mb=1), 1, 60.0, eligible)
        del eligible  # the ask holds the only reference: freed with it below
        planned = timelines.book(ask, NOW)
        del ask
        assert planned is not None, f"j{wanted} found no room"
        assert planned.tasks == ((wanted, 1),)
