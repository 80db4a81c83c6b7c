"""The gang admission cycle as a pure function: scenarios in a table, built from shape-named factories."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.core.admission import decide
from corral.core.decisions import AdmissionDecisions
from corral.core.ordering import in_gang_order
from corral.core.placement import Placement, free_capacity, place
from corral.core.snapshot import Gang, Snapshot
from corral.domain.records import Constraints
from corral.domain.status import Status, WorkerStatus
from corral.testing.factories import (
    admission_snapshot,
    allocation_on,
    cpu_worker,
    gang,
    gpu_worker,
    gpu_workers,
)
from tests.helpers import Drawn, examples, missing_shapes, shapes_drawn

NOW = 1_000.0
TIMEOUT_S = 30.0


def run(snapshot: Snapshot) -> AdmissionDecisions:
    return decide(snapshot, TIMEOUT_S)


@dataclass
class Expect:
    """What a scenario checks: gang id -> worker ids (task order) for reservations, gang id -> code
    for waiting reasons, the rolled-back gang ids, and the held worker ids (None: not checked)."""

    reserved: dict[str, list[str]] = field(default_factory=dict)
    waiting: dict[str, str] = field(default_factory=dict)
    rolled_back: list[str] = field(default_factory=list)
    held: list[str] | None = None


def outcome(decisions: AdmissionDecisions) -> Expect:
    return Expect(
        reserved={r.gang_id: [p.worker_id for p in r.placements] for r in decisions.reservations},
        waiting={w.gang_id: w.reason.code for w in decisions.waiting},
        rolled_back=[r.gang_id for r in decisions.rollbacks],
        held=[h.worker_id for h in decisions.holds],
    )


def ids(workers: list[Any]) -> list[str]:
    return [worker.id for worker in workers]


# --- the scenario table --------------------------------------------------------------------------
# Each scenario builds its snapshot (ids come from counters) and says what must come out.


def largest_gang_first() -> tuple[Snapshot, Expect]:
    """Seed 001: four workers, A of 3 submitted first, B of 4: B is placed, A waits at the head."""
    workers = gpu_workers(4, gpus=8)
    a = gang(size=3, gpus=8, submitted_at=1.0, gang_id="g-a")
    b = gang(size=4, gpus=8, submitted_at=2.0, gang_id="g-b")
    return admission_snapshot(workers, [a, b]), Expect(
        reserved={"g-b": ids(workers)}, waiting={"g-a": "head_of_queue"}, held=ids(workers[:3])
    )


def reserved_capacity_counts() -> tuple[Snapshot, Expect]:
    """Two gangs that each fill both workers: only the first (by id) is promised them."""
    workers = gpu_workers(2, gpus=8)
    first = gang(size=2, gpus=8, gang_id="g-1")
    second = gang(size=2, gpus=8, gang_id="g-2")
    return admission_snapshot(workers, [second, first]), Expect(
        reserved={"g-1": ids(workers)}, waiting={"g-2": "head_of_queue"}
    )


def earlier_reservation_counts() -> tuple[Snapshot, Expect]:
    """A fresh reservation from an earlier cycle holds its workers: the new gang goes elsewhere."""
    workers = gpu_workers(4, gpus=8)
    earlier = gang(
        size=2, gpus=8, status=Status.RESERVED, workers=workers[:2], reserved_at=NOW - 10, gang_id="g-old"
    )
    new = gang(size=2, gpus=8, gang_id="g-new")
    return admission_snapshot(workers, [earlier, new]), Expect(reserved={"g-new": ids(workers[2:])})


def single_jobs_count() -> tuple[Snapshot, Expect]:
    """workron B7: a worker running single jobs is not idle."""
    workers = gpu_workers(3, gpus=8)
    busy = allocation_on(workers[0], gpus=8)
    g = gang(size=3, gpus=8, gang_id="g-3")
    return admission_snapshot(workers, [g], [busy]), Expect(waiting={"g-3": "head_of_queue"})


def preempting_counts() -> tuple[Snapshot, Expect]:
    """A preempting job still holds its GPUs until it has exited (B7)."""
    workers = gpu_workers(2, gpus=8)
    draining = allocation_on(workers[1], gpus=4, status=Status.PREEMPTING)
    g = gang(size=2, gpus=8, gang_id="g-p")
    return admission_snapshot(workers, [g], [draining]), Expect(waiting={"g-p": "reserved_for_later"})


def all_or_nothing() -> tuple[Snapshot, Expect]:
    """A gang of 3 with 2 workers gets nothing and uses nothing: the gang of 2 behind it runs."""
    workers = gpu_workers(2, gpus=8)
    three = gang(size=3, gpus=8, gang_id="g-three")
    two = gang(size=2, gpus=8, gang_id="g-two")
    return admission_snapshot(workers, [three, two]), Expect(
        reserved={"g-two": ids(workers)}, waiting={"g-three": "unschedulable"}, held=[]
    )


def one_task_per_worker_when_a_task_fills_it() -> tuple[Snapshot, Expect]:
    workers = gpu_workers(3, gpus=8)
    g = gang(size=3, gpus=8, gang_id="g-full")
    return admission_snapshot(workers, [g]), Expect(reserved={"g-full": ids(workers)})


def several_tasks_per_worker_when_they_fit() -> tuple[Snapshot, Expect]:
    workers = gpu_workers(2, gpus=8)
    g = gang(size=4, gpus=2, gang_id="g-pack")
    return admission_snapshot(workers, [g]), Expect(reserved={"g-pack": [workers[0].id] * 4})


def best_fit_prefers_the_fuller_worker() -> tuple[Snapshot, Expect]:
    workers = gpu_workers(3, gpus=8)
    busy = [allocation_on(workers[1], gpus=6), allocation_on(workers[2], gpus=4)]
    g = gang(size=3, gpus=2, gang_id="g-fit")
    # w1 has 2 free (least), then w2 has 4 free: it takes two tasks
    return admission_snapshot(workers, [g], busy), Expect(
        reserved={"g-fit": [workers[1].id, workers[2].id, workers[2].id]}
    )


def gpu_model_and_labels() -> tuple[Snapshot, Expect]:
    workers = [
        gpu_worker(gpu_model="A100", labels={"rack": "r1"}),
        gpu_worker(gpu_model="H100"),
        gpu_worker(gpu_model="H100", labels={"rack": "r1"}),
        gpu_worker(gpu_model="H100", labels={"rack": "r1", "zone": "a"}),
    ]
    g = gang(size=2, gpus=8, constraints=Constraints(gpu_model="H100", labels={"rack": "r1"}), gang_id="g-c")
    never = gang(size=2, gpus=1, constraints=Constraints(gpu_model="B200"), gang_id="g-never")
    return admission_snapshot(workers, [g, never]), Expect(
        reserved={"g-c": ids(workers[2:])}, waiting={"g-never": "unschedulable"}
    )


def vram_per_gpu() -> tuple[Snapshot, Expect]:
    small = gpu_workers(2, gpus=8, vram_mb=40_960)
    large = gpu_workers(2, gpus=8, vram_mb=81_920)
    g = gang(size=2, gpus=4, vram_mb=80_000, gang_id="g-vram")
    h = gang(size=2, gpus=8, vram_mb=40_000, gang_id="g-any")
    # g-any (larger tasks, same size) goes first and best fit puts it on the first two workers
    return admission_snapshot(small + large, [g, h]), Expect(
        reserved={"g-any": ids(small), "g-vram": [large[0].id, large[0].id]}
    )


def stale_reservation_rolled_back_and_replaced() -> tuple[Snapshot, Expect]:
    """Its worker went offline before claiming: rolled back and re-placed in the same cycle."""
    workers = gpu_workers(3, gpus=8)
    gone = replace(workers[0], status=WorkerStatus.OFFLINE.value)
    stale = gang(
        size=2, gpus=8, status=Status.RESERVED, workers=workers[:2], reserved_at=NOW - 31, gang_id="g-s"
    )
    return admission_snapshot([gone, *workers[1:]], [stale]), Expect(
        rolled_back=["g-s"], reserved={"g-s": ids(workers[1:])}
    )


def fresh_reservation_left_alone() -> tuple[Snapshot, Expect]:
    workers = gpu_workers(2, gpus=8)
    fresh = gang(size=2, gpus=8, status=Status.RESERVED, workers=workers, reserved_at=NOW - 29, gang_id="g-f")
    return admission_snapshot(workers, [fresh]), Expect()


def partially_started_gang_is_not_a_candidate() -> tuple[Snapshot, Expect]:
    """A stale task with started siblings is rolled back, but the gang is not placed again (it
    must drain first); a gang with one running and one blocked task is no candidate either."""
    workers = gpu_workers(4, gpus=8)
    stuck = gang(
        size=2,
        gpus=8,
        statuses=[Status.RUNNING, Status.RESERVED],
        workers=workers[:2],
        reserved_at=NOW - 60,
        started_at=NOW - 50,
        gang_id="g-stuck",
    )
    half = gang(
        size=2, gpus=8, statuses=[Status.RUNNING, Status.BLOCKED], workers=workers[2:], gang_id="g-half"
    )
    return admission_snapshot(workers, [stuck, half]), Expect(rolled_back=["g-stuck"])


def _held_cluster(walltime_s: float | None, end: float | None) -> tuple[Snapshot, list[Any]]:
    """Three workers, the third busy until ``end``; the head needs all three, a gang of 2 follows."""
    workers = gpu_workers(3, gpus=8)
    busy = allocation_on(workers[2], gpus=8, job_id="j-busy")
    head = gang(size=3, gpus=8, gang_id="g-head")
    small = gang(size=2, gpus=8, walltime_s=walltime_s, gang_id="g-small")
    ends = {} if end is None else {"j-busy": end}
    return admission_snapshot(workers, [head, small], [busy], expected_ends=ends), workers


def hold_blocks_a_smaller_gang() -> tuple[Snapshot, Expect]:
    snapshot, workers = _held_cluster(walltime_s=None, end=NOW + 3600)
    return snapshot, Expect(
        waiting={"g-head": "reserved_for_later", "g-small": "backfill_refused"}, held=ids(workers)
    )


def backfill_when_it_ends_before_the_hold() -> tuple[Snapshot, Expect]:
    snapshot, workers = _held_cluster(walltime_s=600, end=NOW + 3600)
    return snapshot, Expect(
        reserved={"g-small": ids(workers[:2])}, waiting={"g-head": "reserved_for_later"}, held=ids(workers)
    )


def backfill_that_ends_exactly_at_the_hold() -> tuple[Snapshot, Expect]:
    snapshot, workers = _held_cluster(walltime_s=3600, end=NOW + 3600)
    return snapshot, Expect(reserved={"g-small": ids(workers[:2])}, waiting={"g-head": "reserved_for_later"})


def no_backfill_when_it_ends_after_the_hold() -> tuple[Snapshot, Expect]:
    snapshot, _ = _held_cluster(walltime_s=3601, end=NOW + 3600)
    return snapshot, Expect(waiting={"g-head": "reserved_for_later", "g-small": "backfill_refused"})


def no_backfill_when_the_hold_time_is_unknown() -> tuple[Snapshot, Expect]:
    snapshot, _ = _held_cluster(walltime_s=1, end=None)
    return snapshot, Expect(waiting={"g-head": "head_of_queue", "g-small": "held_for_gang"})


def partial_failure_gives_everything_back() -> tuple[Snapshot, Expect]:
    """The head fits 2 of its 3 tasks (the third worker's memory is taken): the speculative takes
    are given back, and a short gang backfills onto exactly those GPUs."""
    workers = gpu_workers(3, gpus=8, memory_mb=100_000)
    hog = allocation_on(workers[2], memory_mb=100_000, job_id="j-hog")
    head = gang(size=3, gpus=8, memory_mb=50_000, gang_id="g-head")
    short = gang(size=2, gpus=8, memory_mb=50_000, walltime_s=60, gang_id="g-short")
    snapshot = admission_snapshot(workers, [head, short], [hog], expected_ends={"j-hog": NOW + 600})
    return snapshot, Expect(reserved={"g-short": ids(workers[:2])}, waiting={"g-head": "reserved_for_later"})


def too_big_even_without_the_hold() -> tuple[Snapshot, Expect]:
    workers = gpu_workers(4, gpus=8)
    busy = [allocation_on(workers[2], gpus=8), allocation_on(workers[3], gpus=8)]
    head = gang(size=4, gpus=8, gang_id="g-head")
    three = gang(size=3, gpus=8, gang_id="g-three")
    return admission_snapshot(workers, [head, three], busy), Expect(
        waiting={"g-head": "head_of_queue", "g-three": "insufficient_capacity"}
    )


def draining_and_offline_workers_get_nothing() -> tuple[Snapshot, Expect]:
    active = gpu_worker(gpus=8)
    draining = gpu_worker(gpus=8, status=WorkerStatus.DRAINING)
    offline = gpu_worker(gpus=8, status=WorkerStatus.OFFLINE)
    g = gang(size=2, gpus=4, gang_id="g-d")
    wide = gang(size=2, gpus=8, gang_id="g-wide")
    return admission_snapshot([draining, offline, active], [g, wide]), Expect(
        reserved={"g-d": [active.id, active.id]}, waiting={"g-wide": "unschedulable"}
    )


def flagged_dead_workers_get_nothing() -> tuple[Snapshot, Expect]:
    """A worker whose heartbeat froze while it holds running jobs is flagged dead: a reservation
    there would only sit until it expires."""
    alive = gpu_worker(gpus=8)
    flagged = replace(gpu_worker(gpus=8), flagged_dead_at=NOW - 5)
    g = gang(size=2, gpus=8, gang_id="g-alive")
    one = gang(size=1 + 1, gpus=4, gang_id="g-half")
    return admission_snapshot([flagged, alive], [g, one]), Expect(
        reserved={"g-half": [alive.id, alive.id]}, waiting={"g-alive": "unschedulable"}
    )


def tripped_gang_before_an_older_one() -> tuple[Snapshot, Expect]:
    """A gang put back at the front by a watchdog trip goes before an older gang of its size,
    class and priority (as a tripped single job does in its queue)."""
    workers = gpu_workers(2, gpus=8)
    older = gang(size=2, gpus=8, submitted_at=NOW - 100, gang_id="g-older")
    tripped = gang(size=2, gpus=8, submitted_at=NOW - 10, gang_id="g-tripped")
    front = Gang(tripped.gang_id, tuple(replace(task, queue_front=True) for task in tripped.tasks))
    return admission_snapshot(workers, [older, front]), Expect(
        reserved={"g-tripped": ids(workers)}, waiting={"g-older": "head_of_queue"}
    )


def no_active_worker() -> tuple[Snapshot, Expect]:
    g = gang(size=2, gpus=1, gang_id="g-alone")
    return admission_snapshot([gpu_worker(status=WorkerStatus.OFFLINE)], [g]), Expect(
        waiting={"g-alone": "no_workers"}
    )


def empty_request_spreads_one_per_worker() -> tuple[Snapshot, Expect]:
    workers = gpu_workers(3, gpus=8)
    g = gang(size=3, gang_id="g-empty")
    return admission_snapshot(workers, [g]), Expect(reserved={"g-empty": ids(workers)})


def cpu_gang_on_cpu_workers() -> tuple[Snapshot, Expect]:
    cpus = [cpu_worker(cpus=16), cpu_worker(cpus=16)]
    gpus = gpu_worker(gpus=8)
    g = gang(size=2, cpus=16, gang_id="g-cpu")
    gpu_gang = gang(size=2, gpus=4, gang_id="g-gpu")
    # best fit: a CPU task prefers the worker with the fewest free GPUs
    return admission_snapshot([gpus, *cpus], [g, gpu_gang]), Expect(
        reserved={"g-cpu": ids(cpus), "g-gpu": [gpus.id, gpus.id]}
    )


SCENARIOS: list[Callable[[], tuple[Snapshot, Expect]]] = [
    largest_gang_first,
    reserved_capacity_counts,
    earlier_reservation_counts,
    single_jobs_count,
    preempting_counts,
    all_or_nothing,
    one_task_per_worker_when_a_task_fills_it,
    several_tasks_per_worker_when_they_fit,
    best_fit_prefers_the_fuller_worker,
    gpu_model_and_labels,
    vram_per_gpu,
    stale_reservation_rolled_back_and_replaced,
    fresh_reservation_left_alone,
    partially_started_gang_is_not_a_candidate,
    hold_blocks_a_smaller_gang,
    backfill_when_it_ends_before_the_hold,
    backfill_that_ends_exactly_at_the_hold,
    no_backfill_when_it_ends_after_the_hold,
    no_backfill_when_the_hold_time_is_unknown,
    partial_failure_gives_everything_back,
    too_big_even_without_the_hold,
    draining_and_offline_workers_get_nothing,
    flagged_dead_workers_get_nothing,
    tripped_gang_before_an_older_one,
    no_active_worker,
    empty_request_spreads_one_per_worker,
    cpu_gang_on_cpu_workers,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[scenario.__name__ for scenario in SCENARIOS])
def test_scenario(scenario: Callable[[], tuple[Snapshot, Expect]]) -> None:
    snapshot, expected = scenario()
    decisions = run(snapshot)
    got = outcome(decisions)
    assert got.reserved == expected.reserved
    assert got.waiting == expected.waiting
    assert got.rolled_back == expected.rolled_back
    if expected.held is not None:
        assert got.held == expected.held
    assert_consistent(snapshot, decisions)


# --- invariants every decision set must keep -----------------------------------------------------


def assert_consistent(snapshot: Snapshot, decisions: AdmissionDecisions) -> None:
    """No worker is promised more than it has; GPU indices are never handed out twice; every task
    fits its worker by the single-job rule (``place``); only active workers are used."""
    workers = {worker.id: worker for worker in snapshot.workers}
    rolled = {job_id for rollback in decisions.rollbacks for job_id in rollback.job_ids}
    allocations = [a for a in snapshot.allocations if a.job_id not in rolled]
    specs = {task.id: task.spec for g in snapshot.gangs for task in g.tasks}
    for reservation in decisions.reservations:
        for placement in reservation.placements:
            worker = workers[placement.worker_id]
            assert worker.status == WorkerStatus.ACTIVE
            spec = specs[placement.job_id]
            on_worker = [a for a in allocations if a.worker_id == worker.id]
            decision = place(spec.resources, spec.constraints, worker, free_capacity(worker, on_worker))
            assert isinstance(decision, Placement), (placement, decision)
            assert decision.gpu_indices == placement.gpu_indices
            allocations.append(
                allocation_on(
                    worker,
                    spec.resources.gpus,
                    spec.resources.cpus,
                    spec.resources.memory_mb,
                    job_id=placement.job_id,
                    indices=placement.gpu_indices,
                    status=Status.RESERVED,
                )
            )
        indices = [p.job_id for p in reservation.placements]
        assert indices == [t.id for g in snapshot.gangs if g.gang_id == reservation.gang_id for t in g.tasks]
    reserved_gangs = {r.gang_id for r in decisions.reservations}
    assert not reserved_gangs & {w.gang_id for w in decisions.waiting}


# --- details -------------------------------------------------------------------------------------


def test_gang_order_size_class_priority_time_id() -> None:
    gangs = [
        gang(size=2, gang_id="g-late", submitted_at=9),
        gang(size=2, gang_id="g-early", submitted_at=1),
        gang(size=2, gang_id="g-b", submitted_at=1),
        gang(size=2, gang_id="g-prio", submitted_at=9, priority=3),
        gang(size=2, gang_id="g-class", submitted_at=9, preemption_class=7),
        gang(size=3, gang_id="g-big", submitted_at=9, preemption_class=0, priority=-5),
    ]
    assert [g.gang_id for g in in_gang_order(gangs)] == [
        "g-big",
        "g-class",
        "g-prio",
        "g-b",
        "g-early",
        "g-late",
    ]


def test_gpu_indices_are_the_lowest_free_ones() -> None:
    worker = gpu_worker(gpus=8, worker_id="w-holes")
    worker = replace(worker, unhealthy_gpus=(1,))
    busy = allocation_on(worker, gpus=2, indices=(0, 3))
    g = gang(size=2, gpus=2)
    decisions = run(admission_snapshot([worker], [g], [busy]))
    assert [p.gpu_indices for p in decisions.reservations[0].placements] == [(2, 4), (5, 6)]


def test_rollback_names_the_reserved_tasks_in_index_order() -> None:
    workers = gpu_workers(3, gpus=8)
    stale = gang(size=3, gpus=8, status=Status.RESERVED, workers=workers, reserved_at=NOW - 45)
    (rollback,) = run(admission_snapshot(workers, [stale])).rollbacks
    assert rollback.gang_id == stale.gang_id
    assert rollback.job_ids == tuple(task.id for task in stale.tasks)
    assert rollback.reason.code == "reservation_expired"
    assert "30 s" in rollback.reason.message


def test_stale_task_with_started_siblings_says_the_gang_must_drain() -> None:
    workers = gpu_workers(2, gpus=8)
    stuck = gang(
        size=2, gpus=8, statuses=[Status.RUNNING, Status.RESERVED], workers=workers, reserved_at=NOW - 60
    )
    (rollback,) = run(admission_snapshot(workers, [stuck])).rollbacks
    assert rollback.job_ids == (stuck.tasks[1].id,)
    assert "must drain" in rollback.reason.message


def test_hold_resources_and_expected_at_is_the_latest_end_needed() -> None:
    """Each held worker names what the head would use there; ``expected_at`` is the end of the last
    allocation that must go, not of every allocation on the held workers."""
    workers = gpu_workers(3, gpus=8)
    busy = [
        allocation_on(workers[1], gpus=4, job_id="j-soon", indices=range(4)),
        allocation_on(workers[1], gpus=2, job_id="j-later", indices=(4, 5)),
        allocation_on(workers[2], gpus=8, job_id="j-never"),  # no walltime: avoided
    ]
    head = gang(size=4, gpus=4, gang_id="g-head")
    ends = {"j-soon": NOW + 100, "j-later": NOW + 5_000}
    decisions = run(admission_snapshot(workers, [head], busy, expected_ends=ends))
    assert [(h.worker_id, h.resources.gpus) for h in decisions.holds] == [
        (workers[0].id, 8),
        (workers[1].id, 8),
    ]
    assert {h.expected_at for h in decisions.holds} == {NOW + 5_000}
    assert decisions.waiting[0].reason.code == "reserved_for_later"


def test_hold_prefers_workers_that_free_soonest_over_lower_ids() -> None:
    workers = gpu_workers(4, gpus=8)
    busy = [
        allocation_on(workers[0], gpus=8, job_id="j-a"),
        allocation_on(workers[1], gpus=8, job_id="j-b"),
        allocation_on(workers[2], gpus=8, job_id="j-c"),
    ]
    ends = {"j-a": NOW + 900, "j-b": NOW + 300}
    head = gang(size=2, gpus=8)
    decisions = run(admission_snapshot(workers, [head], busy, expected_ends=ends))
    assert [h.worker_id for h in decisions.holds] == [workers[1].id, workers[3].id]
    assert decisions.holds[0].expected_at == NOW + 300


def test_preempting_allocations_count_as_ending_now() -> None:
    workers = gpu_workers(2, gpus=8)
    draining = allocation_on(workers[1], gpus=8, status=Status.PREEMPTING)
    head = gang(size=2, gpus=8)
    decisions = run(admission_snapshot(workers, [head], [draining]))
    assert {h.expected_at for h in decisions.holds} == {NOW}


def test_only_the_first_unfit_gang_holds() -> None:
    workers = gpu_workers(4, gpus=8)
    busy = [allocation_on(worker, gpus=4) for worker in workers]
    first = gang(size=4, gpus=8, gang_id="g-1")
    second = gang(size=4, gpus=6, gang_id="g-2")
    decisions = run(admission_snapshot(workers, [first, second], busy))
    assert {h.gang_id for h in decisions.holds} == {"g-1"}
    assert outcome(decisions).waiting == {"g-1": "head_of_queue", "g-2": "insufficient_capacity"}


def test_unschedulable_never_holds_and_says_why() -> None:
    workers = gpu_workers(2, gpus=8)
    huge = gang(size=2, gpus=16, gang_id="g-huge")
    decisions = run(admission_snapshot(workers, [huge]))
    assert decisions.holds == ()
    (waiting,) = decisions.waiting
    assert waiting.reason.code == "unschedulable"
    assert "needs 16 GPU(s)" in waiting.reason.message
    assert "the largest worker has 8 GPU(s)" in waiting.reason.message


def test_waiting_message_counts_the_room_there_is() -> None:
    """Exact after a search; an upper bound (GPUs only) when the cheap bound turned the gang away."""
    workers = gpu_workers(4, gpus=8, memory_mb=100_000)
    busy = [allocation_on(workers[2], gpus=7), allocation_on(workers[3], memory_mb=100_000)]
    searched = gang(size=3, gpus=8, memory_mb=10)
    (waiting,) = run(admission_snapshot(workers, [searched], busy)).waiting
    assert waiting.reason.message.startswith(
        "first in line: needs 3 tasks of 8 GPU(s), 10 MB memory at once; room for 2 now; "
        "capacity held on 3 worker(s), expected free at an unknown time"
    )
    busy = [allocation_on(workers[2], gpus=7), allocation_on(workers[3], gpus=7)]
    bounded = gang(size=3, gpus=8)
    (waiting,) = run(admission_snapshot(workers, [bounded], busy)).waiting
    assert "; room for at most 2 now;" in waiting.reason.message


def test_a_gang_that_would_fit_but_for_the_hold_is_told_so() -> None:
    snapshot, _ = _held_cluster(walltime_s=None, end=NOW + 3600)
    reasons = {w.gang_id: w.reason for w in run(snapshot).waiting}
    assert reasons["g-small"].message.startswith("would delay gang g-head planned for 1970-01-01T01:16:40")
    assert "a walltime_s ending before 1970-01-01T01:16:40.000Z lets it start" in reasons["g-small"].message


def random_cluster(rng: random.Random | Drawn, workers: int = 60, gangs: int = 40) -> Snapshot:
    """A mixed cluster: busy workers, reservations fresh and stale, constraints, walltimes."""
    pool = [
        gpu_worker(
            gpus=rng.choice([4, 8]),
            vram_mb=rng.choice([40_960, 81_920]),
            memory_mb=512_000,
            cpus=64,
            gpu_model=rng.choice(["H100", "A100"]),
            labels={"rack": rng.choice(["r1", "r2"])},
            status=rng.choice([WorkerStatus.ACTIVE] * 8 + [WorkerStatus.DRAINING, WorkerStatus.OFFLINE]),
        )
        for _ in range(workers)
    ]
    allocations = []
    ends: dict[str, float] = {}
    for worker in pool:
        used = rng.randint(0, worker.resources.gpus)
        if used:
            allocation = allocation_on(worker, gpus=used, cpus=used * 4, memory_mb=used * 16_000)
            allocations.append(allocation)
            if rng.random() < 0.7:
                ends[allocation.job_id] = NOW + rng.randint(60, 7200)
    built = []
    for index in range(gangs):
        gpus = rng.choice([1, 2, 4, 8])
        constraints = Constraints(gpu_model="A100") if rng.random() < 0.2 else None
        built.append(
            gang(
                size=rng.randint(2, 8),
                gpus=gpus,
                cpus=gpus * 4,
                memory_mb=gpus * 16_000,
                vram_mb=rng.choice([0, 40_000, 80_000]),
                constraints=constraints,
                priority=rng.randint(0, 2),
                preemption_class=rng.randint(4, 6),
                submitted_at=float(index),
                walltime_s=rng.choice([None, 300.0, 3600.0]),
            )
        )
    stale = gang(size=2, gpus=1, status=Status.RESERVED, workers=pool[:2], reserved_at=NOW - 100)
    return admission_snapshot(pool, [*built, stale], allocations, expected_ends=ends)


def shuffled(snapshot: Snapshot, rng: Drawn) -> Snapshot:

    def mix(items: tuple[Any, ...]) -> tuple[Any, ...]:
        items_list = list(items)
        rng.shuffle(items_list)
        return tuple(items_list)

    return replace(
        snapshot,
        workers=mix(snapshot.workers),
        allocations=mix(snapshot.allocations),
        gangs=mix(snapshot.gangs),
        expected_ends=dict(reversed(list(snapshot.expected_ends.items()))),
    )


@st.composite
def orders(draw: st.DrawFn) -> tuple[Snapshot, Snapshot]:
    """A random cluster, and the same in another order (workers, allocations, gangs, ends)."""
    snapshot = random_cluster(Drawn(draw))
    return snapshot, shuffled(snapshot, Drawn(draw))


def shapes_of_cluster(case: tuple[Snapshot, Snapshot]) -> list[str]:
    snapshot, _ = case
    shapes = []
    statuses = {worker.status for worker in snapshot.workers}
    if WorkerStatus.DRAINING.value in statuses or WorkerStatus.OFFLINE.value in statuses:
        shapes.append("a worker not active")
    if any(one.tasks[0].spec.constraints.gpu_model for one in snapshot.gangs):
        shapes.append("a gang asking for a GPU model")
    if any(one.tasks[0].spec.walltime_s for one in snapshot.gangs):
        shapes.append("a gang with a walltime")
    if snapshot.expected_ends:
        shapes.append("an allocation with an expected end")
    decisions = run(snapshot)
    if decisions.reservations:
        shapes.append("a reservation")
    if decisions.rollbacks:
        shapes.append("a stale reservation rolled back")
    if decisions.waiting:
        shapes.append("a gang waiting")
    if decisions.holds:
        shapes.append("capacity held for the head of the queue")
    return shapes


def test_the_random_clusters_have_every_shape_the_property_claims() -> None:
    claimed = [
        "a worker not active",
        "a gang asking for a GPU model",
        "a gang with a walltime",
        "an allocation with an expected end",
        "a reservation",
        "a stale reservation rolled back",
        "a gang waiting",
        "capacity held for the head of the queue",
    ]
    seen = shapes_drawn(orders(), shapes_of_cluster, 6)
    assert not missing_shapes(seen, claimed), (missing_shapes(seen, claimed), seen)


@examples(5)
@given(orders())
def test_deterministic_and_independent_of_input_order(case: tuple[Snapshot, Snapshot]) -> None:
    snapshot, reordered = case
    decisions = run(snapshot)
    assert run(snapshot) == decisions
    assert run(reordered) == decisions
    assert_consistent(snapshot, decisions)


def test_decide_reads_no_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_clock() -> float:
        raise AssertionError("the core read the clock")

    for name in ("time", "monotonic", "perf_counter", "time_ns", "monotonic_ns"):
        monkeypatch.setattr(time, name, no_clock)
    run(random_cluster(random.Random(4)))
