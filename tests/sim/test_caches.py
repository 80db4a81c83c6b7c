"""The simulator's caches against a count from scratch, over randomized sequences of cycles: the
workers' free capacity kept between cycles (``admission.CycleMemo``), the planner's room kept
up to date within a plan (``preemption.room.Room.tasks_on``), and whole runs with and without them."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from corral.core import preemption
from corral.core.placement import CapacityKept, free_capacity
from corral.core.preemption import PlanInputs, Preemptor
from corral.core.preemption.memo import PlannerMemo
from corral.core.preemption.planner import Planner
from corral.core.preemption.units import Unit
from corral.domain.pools import PoolSettings
from corral.domain.records import Allocation, Job, JobSpec, Worker
from corral.domain.resources import Resources
from corral.domain.status import Status
from corral.sim import engine
from corral.sim.policy import CORRAL, FIFO
from corral.sim.readers import uniform_cluster
from corral.sim.workload import Scenario, SimSettings, Workload, WorkloadJob
from corral.testing.factories import gpu_worker
from tests.helpers import Drawn, examples, missing_shapes, shapes_drawn

NOW = 10_000.0
#: changes to the workers' records in one run of the memo property, and plans in one run of the
#: units property: as many as one example's draws hold
MOVES = 100
PLANS = 10


def _allocation(rng: Drawn, worker: Worker, number: int) -> Allocation:
    gpus = rng.randint(0, 3)
    indices = tuple(sorted(rng.sample(range(worker.resources.gpus), min(gpus, worker.resources.gpus))))
    resources = Resources(gpus=len(indices), memory_mb=rng.choice([0, 1024, 4096]), cpus=rng.randint(0, 4))
    status = rng.choice([Status.RESERVED, Status.RUNNING, Status.PREEMPTING])
    return Allocation(f"j{number}", worker.id, resources, indices, status)


@examples(20)
@given(st.data())
def test_the_capacity_memo_answers_what_a_count_from_scratch_does(data: st.DataObject) -> None:
    """Cycle after cycle, each worker's records are kept, replaced by equal or different ones,
    reordered, added or removed, and the worker itself re-registers now and then: what the memo
    gives (or counts and keeps on a miss) is ``free_capacity`` of the records as they are."""
    for shape in _memo_run(Drawn(data.draw)):
        event(shape)


def test_the_memo_runs_have_every_shape_the_property_claims() -> None:
    claimed = ["added", "removed", "replaced by an equal record", "changed", "reordered", "re-registered"]
    claimed.append("a memo hit")
    seen = shapes_drawn(st.composite(lambda draw: _memo_run(Drawn(draw)))(), list, 10)
    assert not missing_shapes(seen, claimed), (missing_shapes(seen, claimed), seen)


def _memo_run(rng: Drawn) -> Counter[str]:
    """One run of the memo property; what it did (the moves, the hits)."""
    seen: Counter[str] = Counter()
    workers = {
        f"w{index}": gpu_worker(gpus=rng.choice([2, 4, 8]), worker_id=f"w{index}") for index in range(6)
    }
    records: dict[str, list[Allocation]] = {worker_id: [] for worker_id in workers}
    memos: dict[str, CapacityKept[Allocation]] = {"admission": CapacityKept(), "planner": CapacityKept()}
    number = 0
    for _ in range(MOVES):
        worker_id = rng.choice(sorted(workers))
        worker = workers[worker_id]
        held = records[worker_id]
        move = rng.random()
        if move < 0.25:
            number += 1
            held.append(_allocation(rng, worker, number))
            seen["added"] += 1
        elif move < 0.4 and held:
            held.pop(rng.randrange(len(held)))
            seen["removed"] += 1
        elif move < 0.5 and held:
            at = rng.randrange(len(held))
            held[at] = replace(held[at])  # an equal record, another object
            seen["replaced by an equal record"] += 1
        elif move < 0.6 and held:
            at = rng.randrange(len(held))
            held[at] = replace(held[at], status=Status.PREEMPTING, gpu_indices=())
            seen["changed"] += 1
        elif move < 0.65:
            rng.shuffle(held)
            seen["reordered"] += 1
        elif move < 0.7:
            workers[worker_id] = worker = replace(worker, unhealthy_gpus=(0,) if rng.random() < 0.5 else ())
            seen["re-registered"] += 1
        for memo in memos.values():
            given = list(held)  # the caller builds its list afresh each cycle
            kept = memo.get(worker, given)
            if kept is None:
                memo.put(worker, given, free_capacity(worker, given))
            else:
                seen["a memo hit"] += 1
            assert (kept or memo.get(worker, given)) == free_capacity(worker, given)
    return seen


def _running(worker: Worker, first: int, gpus: int, number: int, rng: Drawn) -> Job:
    return Job(
        id=f"r{number}",
        spec=JobSpec(
            command="true",
            resources=Resources(gpus=gpus, memory_mb=rng.choice([0, 2048]), cpus=rng.randint(0, 2)),
            preemption_class=rng.randint(0, 9),
            pool=rng.choice(["a", "b"]),
            checkpoint_mode=rng.choice(["none", "auto"]),
        ),
        status=Status.RUNNING,
        submitted_at=0.0,
        worker_id=worker.id,
        gpu_indices=tuple(range(first, first + gpus)),
        started_at=NOW - rng.uniform(10, 5000),
        attempts=1,
    )


def _waiting(number: int, rng: Drawn) -> Preemptor:
    job = Job(
        id=f"p{number}",
        spec=JobSpec(
            command="true",
            resources=Resources(
                gpus=rng.choice([1, 1, 2, 4]), memory_mb=rng.choice([0, 1024]), cpus=rng.randint(0, 2)
            ),
            preemption_class=rng.randint(3, 10),
            pool=rng.choice(["a", "b"]),
        ),
        status=Status.PENDING,
        submitted_at=NOW - rng.uniform(1, 100),
    )
    return Preemptor(job.id, (job,))


@st.composite
def planner_cases(draw: st.DrawFn) -> PlanInputs:
    """2-10 workers of 4 or 8 GPUs, most GPUs held by jobs of classes 0-9 in two pools (one of
    them guaranteeing 8 GPUs or nothing), 3-20 single preemptors of classes 3-10."""
    rng = Drawn(draw)
    workers = [
        gpu_worker(gpus=rng.choice([4, 8]), worker_id=f"w{index:02d}") for index in range(rng.randint(2, 10))
    ]
    holding: list[Job] = []
    for worker in workers:
        index = 0
        while index < worker.resources.gpus:
            gpus = min(rng.choice([1, 2, 4]), worker.resources.gpus - index)
            if rng.random() < 0.7:
                holding.append(_running(worker, index, gpus, len(holding), rng))
            index += gpus
    preemptors = [_waiting(number, rng) for number in range(rng.randint(3, 20))]
    guarantee = Resources(gpus=rng.choice([0, 8]))
    pools = {"a": _Pool(guarantee), "b": _Pool(Resources())}
    return PlanInputs(
        now=NOW, workers=tuple(workers), holding=tuple(holding), preemptors=tuple(preemptors), pools=pools
    )


def shapes_of_planner_case(inputs: PlanInputs) -> list[str]:
    shapes = []
    if inputs.pools["a"].guarantee.gpus:
        shapes.append("a pool with a guarantee")
    if len(inputs.preemptors) >= 10:
        shapes.append("ten preemptors or more")
    planner = Planner(inputs)
    found = [planner.place(preemptor) for preemptor in inputs.preemptors]
    if any(isinstance(one, preemption.Preemption) and one.victims for one in found):
        shapes.append("a preemption")
    if any(not isinstance(one, preemption.Preemption) for one in found):
        shapes.append("a preemptor left waiting")
    return shapes


def test_the_planner_cases_have_every_shape_the_property_claims() -> None:
    claimed = ["a pool with a guarantee", "ten preemptors or more", "a preemption"]
    claimed.append("a preemptor left waiting")
    seen = shapes_drawn(planner_cases(), shapes_of_planner_case, 60)
    assert not missing_shapes(seen, claimed), (missing_shapes(seen, claimed), seen)


@examples(60)
@given(planner_cases())
def test_the_planners_room_kept_up_to_date_is_the_room_counted_again(inputs: PlanInputs) -> None:
    """Preemptor after preemptor (each setting room aside or preempting, so that workers change
    under the kept answers), every kept ``_room`` answer is the one counted over the cluster now."""
    planner = Planner(inputs)
    placed = 0
    for preemptor in inputs.preemptors:
        if isinstance(planner.place(preemptor), preemption.Preemption):
            placed += 1
        for (_, request), entry in planner.room.answers.items():
            assert planner.room.tasks_on(entry.eligible, request) == planner.room.tasks_counted(
                entry.eligible, request
            )
    assert planner.room.answers


class _Pool:
    kind = "batch"
    mode = "fair_share"

    def __init__(self, guarantee: Resources) -> None:
        self.guarantee = guarantee


def _workload(rng: Drawn) -> Scenario:
    """120 jobs over 10 minutes (one in seven a gang of 2-3 x 8 GPUs) of classes 3-8 in three pools
    (one guaranteeing 16 GPUs), on 4-10 workers of 8 GPUs."""
    jobs = []
    for number in range(120):
        gang = rng.random() < 0.15
        jobs.append(
            WorkloadJob(
                f"j{number:03d}",
                rng.uniform(0, 600),
                rng.uniform(5, 400),
                8 if gang else rng.choice([1, 2, 4, 8]),
                gang_size=rng.choice([2, 3]) if gang else 1,
                preemption_class=rng.choice([3, 5, 5, 8]),
                pool=rng.choice(["a", "b", "c"]),
                checkpoint=rng.choice(["none", "auto"]),
            )
        )
    settings = SimSettings(heartbeat_s=5.0, checkpoint_save_s=10.0, stop_s=1.0)
    pools = {"a": PoolSettings(weight=2, guarantee=Resources(gpus=16)), "b": PoolSettings(weight=1)}
    return Scenario(Workload(tuple(jobs)), uniform_cluster(rng.randint(4, 10), 8), pools, settings=settings)


workloads = st.composite(lambda draw: _workload(Drawn(draw)))


def test_the_workloads_have_every_shape_the_property_claims() -> None:
    def shapes(case: Scenario) -> list[str]:
        jobs = case.workload.jobs
        found = []
        if any(job.gang_size > 1 for job in jobs):
            found.append("a gang")
        if len({job.preemption_class for job in jobs}) >= 3:
            found.append("three classes or more")
        if len({job.pool for job in jobs}) == 3:
            found.append("three pools")
        if any(job.checkpoint == "auto" for job in jobs):
            found.append("a job that checkpoints")
        if sum(job.gpus * job.gang_size for job in jobs) > 8 * len(case.cluster.workers):
            found.append("more asked for than the cluster holds")
        return found

    claimed = ["a gang", "three classes or more", "three pools", "a job that checkpoints"]
    claimed.append("more asked for than the cluster holds")
    seen = shapes_drawn(workloads(), shapes, 10)
    assert not missing_shapes(seen, claimed), (missing_shapes(seen, claimed), seen)


@pytest.mark.parametrize("policy", [CORRAL, FIFO], ids=["corral", "fifo"])
@examples(3)
@given(case=workloads())
def test_a_run_with_the_memo_decides_what_a_run_counting_every_cycle_decides(
    policy: object, case: Scenario
) -> None:
    """Whole runs: every status change at the same time, with the memo and without it (every
    worker's capacity counted from scratch every cycle, as the server does)."""
    kept = engine.Engine(case, policy, record_decisions=True, verify_shortcuts=True)  # type: ignore[arg-type]
    counted = engine.Engine(case, policy, record_decisions=True)  # type: ignore[arg-type]
    counted.memo = None
    assert kept.run().decisions == counted.run().decisions
    assert kept.record.cycles > 10


def _unit_job(
    rng: Drawn, worker: Worker, first: int, gpus: int, key: str, gang: tuple[str, int] | None
) -> Job:
    """A holding job for the units test: single or a gang's task, running (now and then reserved,
    stopping or with a walltime near its end), on ``gpus`` GPUs of ``worker`` from ``first``."""
    started = NOW - rng.uniform(10, 5000)
    status = rng.choice([Status.RUNNING] * 8 + [Status.RESERVED, Status.PREEMPTING])
    return Job(
        id=key,
        spec=JobSpec(
            command="true",
            resources=Resources(gpus=gpus, memory_mb=rng.choice([0, 2048]), cpus=rng.randint(0, 2)),
            preemption_class=rng.choice([0, 3, 5, 8, 10]),
            pool=rng.choice(["a", "b", "s"]),
            checkpoint_mode=rng.choice(["none", "auto"]),
            walltime_s=rng.choice([None, None, 6000.0]),
            gang_size=gang[1] if gang is not None else 1,
        ),
        status=status,
        submitted_at=0.0,
        worker_id=worker.id,
        gpu_indices=tuple(range(first, first + gpus)),
        started_at=None if status == Status.RESERVED else started,
        reserved_at=started - 1.0,
        attempts=1,
        gang_id=gang[0] if gang is not None else None,
        last_checkpoint_at=started + rng.uniform(0, 100) if rng.random() < 0.5 else None,
    )


class _SensitivePool(_Pool):
    kind = "sensitive"


@examples(6)
@given(st.data())
def test_the_victim_units_kept_across_plans_are_the_units_built_from_scratch(data: st.DataObject) -> None:
    """Plan after plan (the clock moving on, job records replaced by equal or changed ones, jobs
    and gang tasks ending or arriving, records reordered), the planner's victim units built with
    the memo (reused where their records are the same objects) are the units built without it:
    the same units, field by field, in the same order on every worker, and the same reach."""
    for shape in _units_run(Drawn(data.draw)):
        event(shape)


def test_the_units_runs_have_every_shape_the_property_claims() -> None:
    claimed = ["a running gang", "a partial gang", "a reserved job", "a stopping job", "an equal record"]
    claimed += ["a job restarted", "a deadline set", "a checkpoint", "a job gone", "reordered"]
    claimed += ["a worker left out", "a unit reused"]
    seen = shapes_drawn(st.composite(lambda draw: _units_run(Drawn(draw)))(), list, 6)
    assert not missing_shapes(seen, claimed), (missing_shapes(seen, claimed), seen)


def _units_run(rng: Drawn) -> Counter[str]:
    """One run of the units property; what it did."""
    seen: Counter[str] = Counter()
    workers = [gpu_worker(gpus=8, worker_id=f"w{index:02d}") for index in range(rng.randint(2, 8))]
    holding: list[Job] = []
    number = 0

    def fill() -> None:
        nonlocal number
        for worker in workers:
            used = {index for job in holding if job.worker_id == worker.id for index in job.gpu_indices}
            free = [index for index in range(8) if index not in used]
            while free and rng.random() < 0.6:
                number += 1
                gpus = 1 if len(free) < 2 else rng.choice([1, 2])
                if gpus == 2 and free[1] != free[0] + 1:
                    gpus = 1
                size = rng.choice([1, 1, 1, 2, 3])
                gang = (f"g{number}", size) if size > 1 else None
                holding.append(_unit_job(rng, worker, free[0], gpus, f"j{number}", gang))
                free = free[gpus:]
                if gang is not None:  # the other tasks, wherever there is room (or missing: a partial gang)
                    for task in range(1, size):
                        other = rng.choice(workers)
                        taken = {i for job in holding if job.worker_id == other.id for i in job.gpu_indices}
                        room = [index for index in range(8) if index not in taken]
                        if room and rng.random() < 0.9:
                            holding.append(_unit_job(rng, other, room[0], 1, f"j{number}t{task}", gang))
                            if other is worker:
                                free = [index for index in free if index != room[0]]

    fill()
    memo = PlannerMemo()
    pools = {"a": _Pool(Resources(gpus=8)), "b": _Pool(Resources()), "s": _SensitivePool(Resources())}
    now = NOW
    previous: dict[str, object] = {}
    for _ in range(PLANS):
        now += rng.choice([0.0, 1.0, 30.0, 600.0])
        for at in range(len(holding)):
            move = rng.random()
            if move < 0.1:
                holding[at] = replace(holding[at])  # an equal record, another object
                seen["an equal record"] += 1
            elif move < 0.15:
                holding[at] = replace(holding[at], status=Status.PREEMPTING)
                seen["a stopping job"] += 1
            elif move < 0.2:
                holding[at] = replace(holding[at], status=Status.RUNNING, started_at=now - 5.0)
                seen["a job restarted"] += 1
            elif move < 0.23:
                holding[at] = replace(holding[at], victims_deadline=now + 60.0)
                seen["a deadline set"] += 1
            elif move < 0.26:
                holding[at] = replace(holding[at], last_checkpoint_at=now - 1.0)
                seen["a checkpoint"] += 1
        before = len(holding)
        holding[:] = [job for job in holding if rng.random() > 0.08]
        if len(holding) < before:
            seen["a job gone"] += 1
        if rng.random() < 0.2:
            rng.shuffle(holding)
            seen["reordered"] += 1
        fill()
        unusable = {rng.choice(workers).id} if rng.random() < 0.2 else set()
        if unusable:
            seen["a worker left out"] += 1
        gangs = Counter(job.gang_id for job in holding if job.gang_id is not None)
        sizes = {job.gang_id: job.spec.gang_size for job in holding if job.gang_id is not None}
        if any(count == sizes[gang] for gang, count in gangs.items()):
            seen["a running gang"] += 1
        if any(count < sizes[gang] for gang, count in gangs.items()):
            seen["a partial gang"] += 1
        if any(job.status == Status.RESERVED for job in holding):
            seen["a reserved job"] += 1
        usable = tuple(worker for worker in workers if worker.id not in unusable)
        preemptor = Preemptor("p", (_waiting(0, rng).first,))
        built = []
        for kept_in in (memo, None):
            inputs = PlanInputs(
                now=now,
                workers=usable,
                holding=tuple(holding),
                preemptors=(preemptor,),
                pools=pools,
                memo=kept_in,
            )
            planner = Planner(inputs)
            victims = planner.units.built()
            built.append(
                (
                    {
                        worker_id: [_fields(unit) for unit in units]
                        for worker_id, units in victims.units_on.items()
                    },
                    victims.reach,
                    [_fields(unit) for unit in victims.units],
                )
            )
            if kept_in is memo:
                seen["a unit reused"] += sum(1 for unit in victims.units if previous.get(unit.key) is unit)
                previous = {unit.key: unit for unit in victims.units}
        assert built[0] == built[1]
    return seen


def _fields(unit: Unit) -> tuple[object, ...]:
    return (
        unit.key,
        unit.jobs,
        unit.preemption_class,
        unit.cost,
        unit.started_at,
        unit.pool,
        unit.frees,
        unit.borrowed,
        unit.held,
        unit.group,
    )
