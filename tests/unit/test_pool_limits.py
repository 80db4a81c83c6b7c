"""Pool limits (``corral.core.pool_limits``) as values, and the claim's use of them: a pool's
subtree never holds more than its limits, the usage is read once a choice and only for work of a
limited pool, and the answers are kept per pool and request."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from corral.core import pool_limits
from corral.core.claim import Claim
from corral.core.explain import explain
from corral.core.preemption import Preemptor
from corral.core.preemption.rules import as_preemptor, preempting_class, value, worth_preempting
from corral.domain import pools
from corral.domain.pools import UNLIMITED, PoolSettings
from corral.domain.records import Job, JobSpec, Reason
from corral.domain.resources import Resources
from corral.domain.status import Status
from corral.testing.factories import gpu_worker

WORKER = gpu_worker(gpus=4, worker_id="w1")


def job(job_id: str, pool: str, gpus: int = 1, status: Status = Status.PENDING, cpus: int = 0) -> Job:
    spec = JobSpec(command="true", resources=Resources(gpus=gpus, cpus=cpus), pool=pool)
    return Job(job_id, spec, status, 0.0)


def gpus(count: int) -> Resources:
    return Resources(count, UNLIMITED, UNLIMITED, UNLIMITED)


def test_a_subtree_counts_against_every_limited_ancestor_root_first() -> None:
    limits = pool_limits.Limits.of(
        {"a": gpus(4), "a/b": gpus(2)}, {"a/b/c": Resources(gpus=1), "a/x": Resources(3)}
    )
    assert limits.above("a/b/c") == ("a", "a/b")
    assert limits.above("elsewhere") == ()
    assert limits.exceeded("a/b/c", Resources(gpus=1)) == "a", "a holds 4 of 4"
    assert limits.exceeded("elsewhere", Resources(gpus=100)) is None
    limits = pool_limits.Limits.of({"a": gpus(8), "a/b": gpus(2)}, {"a/b/c": Resources(gpus=1)})
    assert limits.exceeded("a/b", Resources(gpus=1)) is None
    assert limits.exceeded("a/b", Resources(gpus=2)) == "a/b"
    limits.take("a/b/c", Resources(gpus=1))
    assert limits.exceeded("a/b", Resources(gpus=1)) == "a/b", "a placement booked counts"


def test_every_limited_resource_counts_and_vram_is_a_per_gpu_cap() -> None:
    limit = Resources(UNLIMITED, 1000, UNLIMITED, 4)
    limits = pool_limits.Limits.of({"p": limit}, {"p": Resources(cpus=3)})
    assert limits.exceeded("p", Resources(cpus=1)) is None
    assert limits.exceeded("p", Resources(cpus=2)) == "p"
    assert limits.exceeded("p", Resources(gpus=1, vram_mb=1000)) is None
    refused = limits.refusal("p", Resources(gpus=1, vram_mb=2000))
    assert refused is not None and "VRAM" in refused.message
    refused = limits.refusal("p", Resources(cpus=2))
    assert refused is not None and refused.message.startswith("pool p runs 3 of its limit 4 CPUs")


def test_own_held_counts_only_the_jobs_that_hold_resources() -> None:
    holding = [
        job("r", "p", 2, Status.RUNNING),
        job("s", "p", 1, Status.RESERVED),
        job("x", "p", 1, Status.PREEMPTING),
        job("w", "p", 5, Status.PENDING),
    ]
    assert pool_limits.own_held(holding) == {"p": Resources(gpus=4)}


class Reads:
    """What each pool holds, counting how often the claim reads it."""

    def __init__(self, held: Mapping[str, Resources]) -> None:
        self.held, self.count = held, 0

    def __call__(self) -> Mapping[str, Resources]:
        self.count += 1
        return self.held


def test_the_claim_passes_over_a_limited_pools_job_and_reads_the_usage_once_a_choice() -> None:
    policy = Claim(pools.resolve({"team": PoolSettings(limits=gpus(1))}, pools.PoolDefaults()))
    capacity = policy.capacity(WORKER, [])
    reads = Reads({"team/a": Resources(gpus=1)})
    candidates = [job("j-1", "team/a"), job("j-2", "team/b"), job("j-3", "other")]
    chosen = policy.choose(WORKER, capacity, candidates, [], 0.0, None, reads)
    assert chosen is not None and chosen[0].id == "j-3"
    assert reads.count == 1, "read once for both of team's jobs"
    only_other = Reads({})
    assert policy.choose(WORKER, capacity, [job("j-3", "other")], [], 0.0, None, only_other) is not None
    assert only_other.count == 0, "no limited pool's job: nothing to read"
    roomy = Reads({})
    chosen = policy.choose(WORKER, capacity, candidates, [], 0.0, None, roomy)
    assert chosen is not None and chosen[0].id == "j-1"
    assert policy.choose(WORKER, capacity, candidates, [], 0.0, None, None)[0].id == "j-1"  # type: ignore[index]


def test_why_puts_the_pool_limit_first_and_drops_fits_now() -> None:
    waiting = job("j-1", "team/a", gpus=2)
    reason = pool_limits.explain(
        waiting,
        1,
        pools.resolve({"team": PoolSettings(limits=gpus(2))}, pools.PoolDefaults()),
        {"team/b": Resources(gpus=1)},
    )
    assert reason is not None and reason.code == "pool_limit"
    assert reason.message.startswith("pool team runs 1 of its limit 2 GPUs")
    reasons = explain(waiting, [WORKER], [], [], 0.0, None, reason)
    assert [entry.code for entry in reasons] == ["pool_limit"]
    assert pool_limits.explain(waiting, 1, pools.resolve({}, pools.PoolDefaults()), {}) is None
    gang_task = pool_limits.explain(
        job("g-1.0", "team", gpus=1),
        3,
        pools.resolve({"team": PoolSettings(limits=gpus(2))}, pools.PoolDefaults()),
        {},
    )
    assert gang_task == Reason(
        "pool_limit",
        "pool team runs 0 of its limit 2 GPUs; this work asks 3 more: it waits until the pool's running"
        " work ends or its limits are raised",
    )


def test_a_preemptors_value_is_its_gpu_seconds_within_its_walltime_and_caps_the_victims_cost() -> None:
    task = job("j-1", "p", gpus=2)
    assert value(Preemptor("j-1", (task,))) is None, "no walltime: not known"
    timed = replace(task, spec=replace(task.spec, walltime_s=100.0))
    assert value(Preemptor("g", (timed, timed, timed))) == 600.0, "every task's GPUs"
    cpu_only = replace(timed, spec=replace(timed.spec, resources=Resources(cpus=4)))
    assert value(Preemptor("c", (cpu_only,))) is None, "not in GPU-seconds"
    assert worth_preempting(599.0, 600.0)
    assert not worth_preempting(600.0, 600.0), "below, not up to"
    assert worth_preempting(1e12, None)


def test_a_sensitive_pools_work_preempts_as_class_10() -> None:
    waiting = job("j-1", "secure")
    assert preempting_class(waiting, "sensitive") == 10
    assert preempting_class(waiting, "batch") == waiting.spec.preemption_class
    assert preempting_class(waiting, None) == waiting.spec.preemption_class
    assert as_preemptor(waiting, "batch") is waiting
    raised = as_preemptor(waiting, "sensitive")
    assert raised.id == waiting.id and raised.spec.preemption_class == 10
