"""Topology-aware gang placement (issue 25): the pure domain search, and the admission cycle with
workers labelled into blocks and racks."""

from __future__ import annotations

import random
from dataclasses import replace

from corral.core import topology
from corral.core.admission import decide
from corral.core.preemption import PreemptionSettings
from corral.core.snapshot import Snapshot
from corral.domain.records import Allocation, Job, JobSpec, TopologyRequest, Worker
from corral.domain.resources import Resources
from corral.domain.status import Status
from corral.testing.factories import admission_snapshot, allocation_on, gang, gpu_worker, gpu_workers

LEVELS = topology.DEFAULT_LEVELS
RACK = TopologyRequest("topology.rack", required=True)


def labelled(worker_id: str, block: str, rack: str, gpus: int = 8) -> Worker:
    return gpu_worker(gpus=gpus, worker_id=worker_id, labels={"topology.block": block, "topology.rack": rack})


def three_racks_of_two() -> list[Worker]:
    """w1..w6: the lowest ids sit in different racks (w1 r1, w2 r2, w3 r3, w4 r1, w5 r2, w6 r3)."""
    return [labelled(f"w{index}", "b1", f"r{(index - 1) % 3 + 1}") for index in range(1, 7)]


def placed(decisions, gang_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    (reservation,) = [r for r in decisions.reservations if r.gang_id == gang_id]
    return [place.worker_id for place in reservation.placements]


# --- the pure search -----------------------------------------------------------------------------


def test_levels_are_parsed_widest_first_and_a_repeated_name_is_refused() -> None:
    assert topology.parse_levels(" topology.block, topology.rack ,") == LEVELS
    try:
        topology.parse_levels("a,a")
    except ValueError as error:
        assert "twice" in str(error)
    else:
        raise AssertionError("a repeated level was accepted")


def test_the_narrowest_domain_that_holds_the_gang_wins_over_worker_id_order() -> None:
    paths = [("b1", "r1"), ("b1", "r2"), ("b1", "r1"), ("b1", "r2")]
    units = [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert topology.Domains(paths).choose(units, 2) == [(0, 1), (2, 1)]


def test_a_single_host_beats_a_rack_and_the_best_fitting_rack_is_taken() -> None:
    paths = [("b1", "r1"), ("b1", "r1"), ("b1", "r2"), ("b1", "r2"), ("b1", "r2"), ("b2", "r3")]
    # r1 has room for 2, r2 for 3: a gang of 2 takes the fuller rack r1, keeping r2 whole
    assert topology.Domains(paths).choose([(0, 1), (1, 1), (2, 1), (3, 1), (4, 1)], 2) == [(0, 1), (1, 1)]
    # a host with room for the whole gang wins over any rack
    assert topology.Domains(paths).choose([(0, 1), (1, 1), (5, 2)], 2) == [(5, 2)]


def test_a_gang_too_large_for_one_rack_spans_the_fewest_and_ranks_follow_racks() -> None:
    paths = [("b1", f"r{index // 4}") for index in range(12)]  # three racks of four hosts
    units = [(index, 1) for index in range(12) if index not in (0, 5)]  # r0 and r1 have 3 free
    plan = topology.Domains(paths).choose(units, 6)
    assert plan is not None
    racks = [paths[order][1] for order, _ in plan]
    assert len(set(racks)) == 2  # the whole r2 (4) and 2 more from one other rack, never three
    assert racks == sorted(racks, key=racks.index)  # consecutive ranks share a rack


def test_inside_a_rack_the_fullest_hosts_fill_first_keeping_roomy_hosts_for_larger_tasks() -> None:
    paths = [("b1", "r1")] * 3
    # no host holds 5 tasks: a host with room for 1 fills first, then the remainder (4) goes to
    # the host that best fits it; the other host with room for 1 is left alone
    assert topology.Domains(paths).choose([(0, 4), (1, 1), (2, 1)], 5) == [(1, 1), (0, 4)]


def test_required_refuses_what_no_single_domain_holds_and_names_the_closest() -> None:
    paths = [("b1", "r1"), ("b1", "r2"), ("b1", "r3"), ("b1", "r3")]
    units = [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert topology.Domains(paths).choose(units, 3, required=1) is None
    assert topology.Domains(paths).choose(units, 3, required=0) is not None  # one block holds it
    domains = topology.Domains(paths)
    node, room = domains.closest(units, 1)  # type: ignore[misc]
    assert (domains.path_name(node), room) == ("b1/r3", 2)


def test_a_worker_without_the_label_is_a_domain_of_its_own() -> None:
    paths = [(None, None), (None, None)]
    assert topology.Domains(paths).choose([(0, 1), (1, 1)], 2, required=1) is None
    assert topology.Domains(paths).choose([(0, 2), (1, 1)], 2, required=1) == [(0, 2)]


# --- the admission cycle -------------------------------------------------------------------------


def test_a_required_rack_gang_lands_inside_one_rack_though_the_lowest_ids_are_in_different_racks() -> None:
    workers = three_racks_of_two()
    wanted = gang(size=2, gpus=8, gang_id="g-a", topology=RACK)
    decisions = decide(admission_snapshot(workers, [wanted]), 30.0)
    chosen = placed(decisions, "g-a")
    racks = {worker.labels["topology.rack"] for worker in workers if worker.id in chosen}
    assert len(racks) == 1, chosen


def test_labels_alone_make_every_gang_topology_aware() -> None:
    workers = three_racks_of_two()
    decisions = decide(admission_snapshot(workers, [gang(size=2, gpus=8, gang_id="g-a")]), 30.0)
    assert placed(decisions, "g-a") == ["w1", "w4"]  # rack r1, not w1 and w2 (id order)


def test_a_required_gang_waits_with_topology_when_only_racks_together_hold_it() -> None:
    workers = three_racks_of_two()
    busy = [allocation_on(workers[index], gpus=8, job_id=f"j-busy-{index}") for index in (3, 4, 5)]
    snapshot = admission_snapshot(
        workers,
        [
            gang(size=2, gpus=8, gang_id="g-req", topology=RACK),
            gang(size=2, gpus=8, gang_id="g-any", submitted_at=1.0),
        ],
        busy,
    )
    decisions = decide(snapshot, 30.0)
    waiting = {entry.gang_id: entry.reason for entry in decisions.waiting}
    assert waiting["g-req"].code == "topology"
    assert "topology.rack=r1" in waiting["g-req"].message
    assert "j-busy-3" in waiting["g-req"].message
    # a gang without the requirement is placed across racks on the same room
    assert len(placed(decisions, "g-any")) == 2


def test_a_required_level_with_no_labels_means_one_host() -> None:
    workers = gpu_workers(2, gpus=8)
    snapshot = admission_snapshot(workers, [gang(size=2, gpus=8, gang_id="g-a", topology=RACK)])
    (waiting,) = decide(snapshot, 30.0).waiting
    assert waiting.reason.code == "topology"
    snapshot = admission_snapshot(workers, [gang(size=2, gpus=4, gang_id="g-b", topology=RACK)])
    assert len(set(placed(decide(snapshot, 30.0), "g-b"))) == 1


def test_without_labels_the_decisions_do_not_depend_on_the_levels() -> None:
    """No label anywhere: the id-order best fit of before, whatever CORRAL_TOPOLOGY_LEVELS says."""
    rng = random.Random(7)
    for _ in range(30):
        workers = gpu_workers(rng.randint(2, 12), gpus=8)
        busy = [allocation_on(worker, gpus=rng.choice((1, 2, 4))) for worker in workers if rng.random() < 0.5]
        gangs = [
            gang(size=rng.randint(2, 6), gpus=rng.choice((1, 2, 4, 8))) for _ in range(rng.randint(1, 5))
        ]
        snapshot = admission_snapshot(workers, gangs, busy)
        assert decide(snapshot, 30.0) == decide(snapshot, 30.0, topology_levels=())


def busy_racks(
    classes: dict[str, int] | None = None, checkpoint: str = "auto"
) -> tuple[list[Worker], list[Job]]:
    """w1..w4, racks alternating by id (w1, w3 in r1; w2, w4 in r2), each running one 8-GPU job;
    the cheapest victims (the newest jobs) sit on w1 (r1) and w2 (r2). ``classes``: a job's class
    by worker id (else 2). With ``checkpoint`` auto every job costs the same (its expected
    checkpoint); with none, the time it has run (w3's and w4's 100 times w1's and w2's)."""
    workers = [labelled(f"w{index}", "b1", f"r{(index - 1) % 2 + 1}") for index in range(1, 5)]
    holding = [
        Job(
            id=f"j-run-{worker.id}",
            spec=JobSpec(
                command="true",
                resources=Resources(gpus=8),
                preemption_class=(classes or {}).get(worker.id, 2),
                checkpoint_mode=checkpoint,
            ),
            status=Status.RUNNING,
            submitted_at=0.0,
            worker_id=worker.id,
            gpu_indices=tuple(range(8)),
            started_at=1_000.0 - (60 if worker.id in ("w1", "w2") else 6_000),
            attempts=1,
        )
        for worker in workers
    ]
    return workers, holding


def preempted_for(  # type: ignore[no-untyped-def]
    workers: list[Worker],
    holding: list[Job],
    asked: TopologyRequest | None,
    levels: tuple[str, ...] = LEVELS,
):
    allocations = tuple(
        Allocation(job.id, job.worker_id or "", job.spec.resources, job.gpu_indices, job.status)
        for job in holding
    )
    wanted = gang(size=2, gpus=8, gang_id="g-hi", preemption_class=7, topology=asked)
    snapshot = Snapshot(1_000.0, tuple(workers), allocations, (wanted,), holding=tuple(holding))
    return decide(snapshot, 30.0, PreemptionSettings(), topology_levels=levels)


def preempted_workers(decisions) -> set[str]:  # type: ignore[no-untyped-def]
    (found,) = decisions.preemptions
    return {place.worker_id for place in found.placements}


def test_the_planner_takes_a_gangs_victims_inside_one_rack_not_the_cheapest_across_racks() -> None:
    """The cheapest victims across the cluster (w1 in r1, w2 in r2) would split the gang over two
    racks, as they do with the topology off; with it on the planner takes both victims in r1."""
    workers, holding = busy_racks()
    assert preempted_workers(preempted_for(workers, holding, None, levels=())) == {"w1", "w2"}
    on = preempted_for(workers, holding, None)
    assert preempted_workers(on) == {"w1", "w3"}
    (found,) = on.preemptions
    assert {victim.key for victim in found.victims} == {"j-run-w1", "j-run-w3"}
    assert preempted_workers(preempted_for(workers, holding, RACK)) == {"w1", "w3"}


def test_locality_may_lose_more_work_but_never_stops_a_higher_class() -> None:
    """Without checkpoints r1's set (w1 + w3) loses 100 times the work of w1 + w2, same class:
    the gang still takes its rack (the worth rule is the only bound on cost)."""
    workers, holding = busy_racks(checkpoint="none")
    assert preempted_workers(preempted_for(workers, holding, None, levels=())) == {"w1", "w2"}
    assert preempted_workers(preempted_for(workers, holding, None)) == {"w1", "w3"}


def test_locality_never_stops_a_higher_class_than_the_cluster_wide_set_needs() -> None:
    """Rack r1's second job (w3) is class 5 and r2's (w4) class 6: either rack's set stops a higher
    class than the cluster-wide w1 + w2 (class 2), so the gang spans the two racks; a rack-required
    gang pays for its rack instead (r1: its worst class is the lower)."""
    workers, holding = busy_racks({"w3": 5, "w4": 6})
    assert preempted_workers(preempted_for(workers, holding, None)) == {"w1", "w2"}
    assert preempted_workers(preempted_for(workers, holding, RACK)) == {"w1", "w3"}


def test_a_rack_required_gang_waits_with_topology_when_no_rack_has_a_victim_set() -> None:
    """w3 and w4 run class 8 work a class 7 gang may not take: every rack holds one victim, not
    two. Unconstrained the gang spans r1 and r2; rack-required it waits, nobody stopped."""
    workers, holding = busy_racks({"w3": 8, "w4": 8})
    assert preempted_workers(preempted_for(workers, holding, None)) == {"w1", "w2"}
    confined = preempted_for(workers, holding, RACK)
    assert confined.preemptions == ()
    (waiting,) = confined.waiting
    assert waiting.reason.code == "topology" and "inside one topology.rack" in waiting.reason.message


def test_a_gang_placed_on_room_victims_are_freeing_takes_it_inside_one_rack() -> None:
    """w1 (r1) is free; w2 (r2) and w3 (r1) hold victims of an earlier preemption still stopping.
    The gang fits once they have left: in id order it would take w1 and w2 (two racks), with the
    topology on it takes w1 and w3 (r1), stopping nobody more."""
    workers, holding = busy_racks()
    stopping = {"w2", "w3"}
    holding = [
        replace(job, status=Status.PREEMPTING, preempted_for="g-earlier")
        if job.worker_id in stopping
        else job
        for job in holding
        if job.worker_id != "w1"
    ]
    off = preempted_for(workers, holding, None, levels=())
    assert preempted_workers(off) == {"w1", "w2"}
    on = preempted_for(workers, holding, None)
    assert preempted_workers(on) == {"w1", "w3"}
    (found,) = on.preemptions
    assert found.victims == ()


def test_a_block_required_gang_takes_victims_in_one_block_though_they_span_more_racks() -> None:
    """b1 holds w1, w2, w3 in three racks; b2 holds w4 and w5 in one rack. The cheapest victims
    (w1, w4, w5: the newest, no checkpoints) span two blocks, which a block-required gang may not;
    b1's set spans three racks, more than the cluster-wide set's two, yet it is the one set inside
    one block: the gang takes it rather than waiting."""
    workers = [
        labelled("w1", "b1", "r1"),
        labelled("w2", "b1", "r2"),
        labelled("w3", "b1", "r3"),
        labelled("w4", "b2", "r4"),
        labelled("w5", "b2", "r4"),
    ]
    holding = [
        Job(
            id=f"j-run-{worker.id}",
            spec=JobSpec(
                command="true", resources=Resources(gpus=8), preemption_class=2, checkpoint_mode="none"
            ),
            status=Status.RUNNING,
            submitted_at=0.0,
            worker_id=worker.id,
            gpu_indices=tuple(range(8)),
            started_at=1_000.0 - (60 if worker.id in ("w1", "w4", "w5") else 6_000),
            attempts=1,
        )
        for worker in workers
    ]
    allocations = tuple(
        Allocation(job.id, job.worker_id or "", job.spec.resources, job.gpu_indices, job.status)
        for job in holding
    )
    block = TopologyRequest("topology.block", required=True)
    wanted = gang(size=3, gpus=8, gang_id="g-hi", preemption_class=7, topology=block)
    snapshot = Snapshot(1_000.0, tuple(workers), allocations, (wanted,), holding=tuple(holding))
    unconstrained = gang(size=3, gpus=8, gang_id="g-hi", preemption_class=7)
    free_choice = Snapshot(1_000.0, tuple(workers), allocations, (unconstrained,), holding=tuple(holding))
    assert preempted_workers(decide(free_choice, 30.0, PreemptionSettings(), topology_levels=())) == {
        "w1",
        "w4",
        "w5",
    }
    assert preempted_workers(decide(snapshot, 30.0, PreemptionSettings(), topology_levels=LEVELS)) == {
        "w1",
        "w2",
        "w3",
    }


def test_when_the_first_racks_set_fails_the_worth_rule_the_next_racks_set_is_taken() -> None:
    """No checkpoints: w1 (r1) and w2 (r2) ran 60 s, w4 (r2) 600 s, w3 (r1) 6,000 s. The gang (2 x 8
    GPUs, walltime 1,000 s) is worth 16,000 GPU-seconds: r1's set (w1 + w3, 48,480) is too dear,
    r2's (w2 + w4, 5,280) is not. r1 is tried first (the racks tie on room, then go by name); its
    failing the worth rule sends the search to r2, for a rack-required gang and an unconstrained one
    alike (the cluster-wide w1 + w2 spans two racks)."""
    workers, holding = busy_racks(checkpoint="none")
    ran = {"w1": 60.0, "w2": 60.0, "w3": 6_000.0, "w4": 600.0}
    holding = [replace(job, started_at=1_000.0 - ran[job.worker_id or ""]) for job in holding]
    allocations = tuple(
        Allocation(job.id, job.worker_id or "", job.spec.resources, job.gpu_indices, job.status)
        for job in holding
    )
    for asked in (RACK, None):
        wanted = gang(size=2, gpus=8, gang_id="g-hi", preemption_class=7, topology=asked, walltime_s=1_000.0)
        snapshot = Snapshot(1_000.0, tuple(workers), allocations, (wanted,), holding=tuple(holding))
        decisions = decide(snapshot, 30.0, PreemptionSettings(), topology_levels=LEVELS)
        assert preempted_workers(decisions) == {"w2", "w4"}, asked
