"""Topology-aware gang placement (issue 25): the pure domain search, and the admission cycle with
workers labelled into blocks and racks."""

from __future__ import annotations

import random

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


def test_the_planner_never_preempts_for_a_rack_required_gang_across_racks() -> None:
    """Four busy workers, racks alternating by id; the cheapest victims (the newest jobs) sit on
    w1 (r1) and w2 (r2): a rack-required gang of two waits with topology instead."""
    workers = [labelled(f"w{index}", "b1", f"r{(index - 1) % 2 + 1}") for index in range(1, 5)]
    holding = [
        Job(
            id=f"j-run-{worker.id}",
            spec=JobSpec(command="true", resources=Resources(gpus=8), preemption_class=2),
            status=Status.RUNNING,
            submitted_at=0.0,
            worker_id=worker.id,
            gpu_indices=tuple(range(8)),
            started_at=1_000.0 - (60 if worker.id in ("w1", "w2") else 6_000),
            attempts=1,
        )
        for worker in workers
    ]
    allocations = tuple(
        Allocation(job.id, job.worker_id or "", job.spec.resources, job.gpu_indices, job.status)
        for job in holding
    )

    def decided(asked: TopologyRequest | None):  # type: ignore[no-untyped-def]
        wanted = gang(size=2, gpus=8, gang_id="g-hi", preemption_class=7, topology=asked)
        snapshot = Snapshot(1_000.0, tuple(workers), allocations, (wanted,), holding=tuple(holding))
        return decide(snapshot, 30.0, PreemptionSettings())

    free = decided(None)
    (found,) = free.preemptions
    assert {place.worker_id for place in found.placements} == {"w1", "w2"}
    confined = decided(RACK)
    assert confined.preemptions == ()
    (waiting,) = confined.waiting
    assert waiting.reason.code == "topology" and "across 2" in waiting.reason.message
