"""Seed 002's third preemption trigger as a pure function: a pool whose ``limits`` were lowered below
what its subtree runs is preempted back under them (``corral.core.preemption.limits``), with the
usual protection rules, the one victim order, a minimal set, and reason ``pool_limit``."""

from __future__ import annotations

from dataclasses import replace

from corral.core.preemption import PreemptionSettings, Preemptor, start_preemption
from corral.core.preemption.limits import excess, limited_pool
from corral.domain.pools import UNLIMITED, PoolDefaults, PoolKind, PoolSettings, resolve
from corral.domain.records import Allocation
from corral.domain.resources import Resources
from corral.domain.status import Status
from corral.testing.factories import gpu_worker
from tests.unit.test_preemption import NOW, gang_tasks, planned, running, single, waiting


def gpus(count: int) -> Resources:
    return Resources(count, UNLIMITED, UNLIMITED, UNLIMITED)


def limited(**limits: int) -> dict:
    return resolve({path: PoolSettings(limits=gpus(count)) for path, count in limits.items()}, PoolDefaults())


def test_excess_counts_gpus_memory_and_cpus_never_vram() -> None:
    assert excess(Resources(3, 80, 100, 4), Resources(1, 10, 100, 8)) == Resources(2, 0, 0, 0)
    assert excess(Resources(1, 80, 100, 4), Resources(1, 10, 200, 8)) is None
    assert excess(Resources(1, 0, 300, 9), Resources(1, 0, 200, 8)) == Resources(0, 0, 100, 1)


def test_a_pool_whose_limit_was_lowered_is_preempted_back_under_it_cheapest_first() -> None:
    """Team runs 3 GPUs, its limit is now 1: two of its jobs are stopped, the newest (cheapest)
    first, reason ``pool_limit``, with no preemptor; the other pool's job is never touched."""
    worker = gpu_worker(gpus=4, worker_id="w1")
    old = running(worker, [0], cls=2, started=NOW - 900, pool="team", job_id="j-old")
    mid = running(worker, [1], cls=2, started=NOW - 600, pool="team/a", job_id="j-mid")
    new = running(worker, [2], cls=2, started=NOW - 60, pool="team", job_id="j-new")
    other = running(worker, [3], cls=0, started=NOW - 10, pool="other", job_id="j-other")
    result = planned([worker], [old, mid, new, other], [], pools=limited(team=1))
    (found,) = result.preemptions
    assert (found.preemptor, found.job_ids, found.placements, found.worker_ids) == ("pool:team", (), (), ())
    assert limited_pool(found.preemptor) == "team"
    assert [(victim.key, victim.reason) for victim in found.victims] == [
        ("j-new", "pool_limit"),
        ("j-mid", "pool_limit"),
    ]
    assert planned([worker], [old, mid, new, other], [], pools=limited(team=3)).preemptions == ()


def test_the_set_is_minimal_and_protection_holds() -> None:
    """A 2-GPU excess: the cheapest job alone (1 GPU) is not enough, the 2-GPU one is, so the
    1-GPU one is put back. Class 10 and class 7 without checkpoints are never stopped, even if the
    pool stays over its limits."""
    worker = gpu_worker(gpus=8, worker_id="w1")
    small = running(worker, [0], cls=1, started=NOW - 30, pool="team", job_id="j-small")
    big = running(worker, [1, 2], cls=2, started=NOW - 40, pool="team", job_id="j-big")
    keep = running(worker, [3], cls=3, started=NOW - 50, pool="team", job_id="j-keep")
    (found,) = planned([worker], [small, big, keep], [], pools=limited(team=2)).preemptions
    assert [victim.key for victim in found.victims] == ["j-big"]

    crown = running(worker, [4], cls=10, pool="team", job_id="j-class-10")
    precious = running(worker, [5], cls=7, pool="team", job_id="j-no-checkpoint", checkpoint_mode="none")
    (found,) = planned([worker], [crown, precious, small], [], pools=limited(team=0)).preemptions
    assert [victim.key for victim in found.victims] == ["j-small"], "only what may be preempted"


def test_a_sensitive_or_service_pools_own_work_is_not_stopped_for_its_limits() -> None:
    worker = gpu_worker(gpus=2, worker_id="w1")
    pools = resolve(
        {
            "vault": PoolSettings(kind=PoolKind.SENSITIVE, limits=gpus(0)),
            "web": PoolSettings(kind=PoolKind.SERVICE, limits=gpus(0), guarantee=Resources(gpus=1)),
        },
        PoolDefaults(),
    )
    secret = running(worker, [0], pool="vault", job_id="j-secret")
    served = running(worker, [1], pool="web", job_id="j-served")
    assert planned([worker], [secret, served], [], pools=pools).preemptions == ()


def test_a_deeper_pools_victims_count_for_its_parent_and_a_gang_goes_whole() -> None:
    """``org`` (limit 2) and ``org/ml`` (limit 2) both run over: ``org/ml``'s gang of two goes
    first (deepest pool first), which brings ``org`` back too: nothing else is stopped."""
    workers = [gpu_worker(gpus=2, worker_id=f"w{index}") for index in range(2)]
    gang = tuple(
        replace(task, spec=replace(task.spec, pool="org/ml")) for task in gang_tasks("g-ml", 2, 1, 2, workers)
    )
    single_ml = running(workers[0], [1], cls=2, started=NOW - 900, pool="org/ml", job_id="j-ml")
    other = running(workers[1], [1], cls=2, started=NOW - 900, pool="org", job_id="j-org")
    (found,) = planned(
        workers, [*gang, single_ml, other], [], pools=limited(org=2, **{"org/ml": 1})
    ).preemptions
    assert found.preemptor == "pool:org/ml"
    assert [(victim.key, victim.job_ids) for victim in found.victims] == [("g-ml", ("g-ml-t0", "g-ml-t1"))]


def test_jobs_already_stopping_are_not_counted_and_the_cycles_budget_holds() -> None:
    """A victim already leaving is not counted (else each cycle would stop more until it left),
    and a cycle stops at most ``max_preemptions_per_cycle`` victims, a preemptor's decisions
    after them."""
    worker = gpu_worker(gpus=4, worker_id="w1")
    jobs = [running(worker, [index], cls=2, started=NOW - 100 * index, pool="team") for index in range(4)]
    leaving = replace(jobs[0], status=Status.PREEMPTING, preempted_for="pool:team")
    (found,) = planned([worker], [leaving, *jobs[1:]], [], pools=limited(team=2)).preemptions
    assert len(found.victims) == 1, "3 stay, one over the limit of 2"
    settings = PreemptionSettings(max_preemptions_per_cycle=2)
    result = planned(
        [worker], jobs, [single(waiting(gpus=1, cls=9))], settings=settings, pools=limited(team=1)
    )
    assert [len(preemption.victims) for preemption in result.preemptions] == [2], "the budget is spent"


def test_a_preemptor_takes_nothing_the_limits_already_stop() -> None:
    """The same cycle's preemptor (of another pool) does not stop a unit the limits took."""
    worker = gpu_worker(gpus=2, worker_id="w1")
    team = running(worker, [0], cls=1, started=NOW - 10, pool="team", job_id="j-team")
    rest = running(worker, [1], cls=2, started=NOW - 900, pool="other", job_id="j-other")
    result = planned(
        [worker], [team, rest], [Preemptor("j-want", (waiting(gpus=1, cls=7),))], pools=limited(team=0)
    )
    keys = [[victim.key for victim in preemption.victims] for preemption in result.preemptions]
    assert keys[0] == ["j-team"]
    assert all("j-team" not in victims for victims in keys[1:])


def test_start_preemption_stops_the_victims_and_reserves_nothing() -> None:
    worker = gpu_worker(gpus=2, worker_id="w1")
    first = running(worker, [0], cls=2, started=NOW - 10, pool="team", job_id="j-a", checkpoint_mode="auto")
    second = running(worker, [1], cls=2, started=NOW - 900, pool="team", job_id="j-b")
    (found,) = planned([worker], [first, second], [], pools=limited(team=1)).preemptions
    jobs = {job.id: job for job in (first, second)}
    allocations = [Allocation(job.id, "w1", job.spec.resources, job.gpu_indices) for job in jobs.values()]
    started = start_preemption(found, jobs, {"w1": (worker, allocations)}, set(), NOW, 600)
    assert started.outcome is not None and started.outcome.reserved == ()
    (stopped,) = started.outcome.stopped
    assert (stopped.id, stopped.status, stopped.preempted_for) == ("j-a", Status.PREEMPTING, "pool:team")
    assert stopped.reason is not None and stopped.reason.code == "preempted_pool_limit"
    assert "bring pool team back within its limits" in stopped.reason.message
    assert stopped.checkpoint_deadline == NOW + 600, "a job that checkpoints is asked to first"
    moved = {**jobs, "j-a": replace(first, status=Status.PREEMPTING)}
    assert start_preemption(found, moved, {}, set(), NOW, 600).outcome is None, "moved since: nothing"
