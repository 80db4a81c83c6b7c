"""The planner's seed rules added with pool limits: a preemptor past its pool's limits takes no
victim (``pool_limit``), and a search the ``SEARCH_LIMIT`` cut short says so (``search_limited``)."""

from __future__ import annotations

from dataclasses import replace

from corral.core.explain import explain, preemptors_cut
from corral.core.preemption import Preemptor
from corral.core.preemption.rules import SEARCH_LIMIT, borrowed_discount
from corral.core.preemption.search import search_cut
from corral.domain.pools import UNLIMITED, PoolDefaults, PoolSettings, resolve
from corral.domain.queue_order import PREEMPTOR_CANDIDATES
from corral.domain.records import Allocation, Reason
from corral.domain.resources import Resources
from corral.testing.factories import gpu_job, gpu_worker
from tests.unit.test_preemption import NOW, gang_tasks, planned, running, single, waiting


def test_the_search_cut_needs_the_cap_reached_with_room_still_missing() -> None:
    assert search_cut(missing=1, examined=SEARCH_LIMIT)
    assert not search_cut(missing=0, examined=SEARCH_LIMIT)
    assert not search_cut(missing=1, examined=SEARCH_LIMIT - 1)


def test_a_search_cut_at_its_limit_is_reported_as_search_limited() -> None:
    """A gang of two 2-GPU tasks over workers each held by two 1-GPU jobs: the first set takes two
    victims, every other set would take two more (past max_victims, 3), and there are more sets
    than the search may look at."""
    workers = [gpu_worker(gpus=2, worker_id=f"w{index:03d}") for index in range(SEARCH_LIMIT + 8)]
    holding = [running(worker, [slot], cls=0) for worker in workers for slot in range(2)]
    gang = gang_tasks("g-want", 2, 2, cls=7)
    result = planned(workers, holding, [Preemptor("g-want", gang)])
    assert not result.preemptions
    ((key, reason),) = result.waiting
    assert key == "g-want" and reason.code == "search_limited"
    assert f"looked at {SEARCH_LIMIT} worker sets" in reason.message
    few = workers[:4]
    result = planned(
        few, [job for job in holding if job.worker_id in {w.id for w in few}], [Preemptor("g-want", gang)]
    )
    assert [reason.code for _, reason in result.waiting] == ["no_victim_set"], "every set looked at"


def test_a_preemptor_past_its_pools_limit_takes_no_victim() -> None:
    worker = gpu_worker(gpus=2, worker_id="w1")
    pools = resolve(
        {"team": PoolSettings(limits=Resources(1, UNLIMITED, UNLIMITED, UNLIMITED))}, PoolDefaults()
    )
    mine = running(worker, [0], cls=5, pool="team/a")
    low = running(worker, [1], cls=0)
    result = planned([worker], [mine, low], [single(waiting(gpus=1, cls=8, pool="team/b"))], pools=pools)
    assert not result.preemptions
    ((_, reason),) = result.waiting
    assert reason.code == "pool_limit" and reason.message.startswith("pool team runs 1 of its limit 1 GPUs")
    result = planned([worker], [mine, low], [single(waiting(gpus=1, cls=8, pool="other"))], pools=pools)
    assert [victim.job_ids for victim in result.preemptions[0].victims] == [(low.id,)]


def test_work_beyond_its_pools_guarantee_costs_half_and_goes_first_among_equals() -> None:
    assert borrowed_discount(300.0, bursting=True) == 150.0
    assert borrowed_discount(300.0, bursting=False) == 300.0
    worker = gpu_worker(gpus=3, worker_id="w1")
    pools = resolve({"burst": PoolSettings(guarantee=Resources(gpus=1))}, PoolDefaults())
    within = running(
        worker, [0], cls=2, started=NOW - 900, checkpoint_mode="auto", pool="burst", job_id="j-within"
    )
    beyond = running(
        worker, [1], cls=2, started=NOW - 800, checkpoint_mode="auto", pool="burst", job_id="j-beyond"
    )
    newest = running(
        worker, [2], cls=2, started=NOW - 100, checkpoint_mode="auto", pool="plain", job_id="j-newest"
    )
    wanted = single(waiting(gpus=1, cls=7))
    (found,) = planned([worker], [within, beyond, newest], [wanted], pools=pools).preemptions
    assert [victim.job_ids for victim in found.victims] == [("j-beyond",)]
    assert found.victims[0].cost == 150.0
    (found,) = planned([worker], [within, beyond, newest], [wanted]).preemptions
    assert [victim.job_ids for victim in found.victims] == [("j-newest",)], "no guarantee: newest first"


def test_a_second_preemptor_of_a_shape_whose_search_was_cut_is_told_search_limited_too() -> None:
    """The shape's memo of failures (room only shrinks within a cycle) must not turn a search the
    cap cut short into ``no_victim_set`` for the next preemptor of the shape: a set beyond the cut
    might exist for it as well."""
    workers = [gpu_worker(gpus=2, worker_id=f"w{index:03d}") for index in range(SEARCH_LIMIT + 8)]
    holding = [running(worker, [slot], cls=0) for worker in workers for slot in range(2)]
    first = gang_tasks("g-want", 2, 2, cls=7)
    second = tuple(
        replace(task, id=f"j-again-{index}", gang_id="g-again", submitted_at=task.submitted_at + 1)
        for index, task in enumerate(first)
    )
    result = planned(workers, holding, [Preemptor("g-want", first), Preemptor("g-again", second)])
    assert not result.preemptions
    assert sorted((key, reason.code) for key, reason in result.waiting) == [
        ("g-again", "search_limited"),
        ("g-want", "search_limited"),
    ]


def test_a_job_past_the_cycles_read_of_preemptors_is_told_so_in_place_of_an_old_no_victim_set() -> None:
    """The second cap (``PREEMPTOR_CANDIDATES`` pending jobs read per cycle): a job with that many
    ahead of it gets no plan, so the ``no_victim_set`` an earlier cycle recorded is stale; ``why``
    says ``search_limited`` instead. Within the read, or never read by class, nothing changes."""
    assert preemptors_cut(None) is None
    assert preemptors_cut(PREEMPTOR_CANDIDATES - 1) is None
    cut = preemptors_cut(PREEMPTOR_CANDIDATES)
    assert cut is not None and cut.code == "search_limited" and "1,000 pending jobs" in cut.message
    worker = gpu_worker(gpus=1, worker_id="w1")
    busy = [Allocation("j-busy", "w1", Resources(gpus=1), (0,))]
    stale = Reason("no_victim_set", "no set of at most 3 ...")
    job = gpu_job(gpus=1, job_id="j-late", reason=stale)
    codes = [reason.code for reason in explain(job, [worker], busy, preemptor_cut=cut)]
    assert codes == ["waiting_for_capacity", "search_limited"]
    uncut = [reason.code for reason in explain(job, [worker], busy)]
    assert uncut == ["waiting_for_capacity", "no_victim_set"]
    assert explain(job, [worker], [], preemptor_cut=cut)[0].code == "fits_now"
