"""The single-job placement decision and queue order, as pure functions over values."""

import pytest

from corral.core.claim import Claim
from corral.core.explain import explain_pending
from corral.core.ordering import in_queue_order
from corral.core.placement import Placement, free_capacity, place
from corral.domain.records import Allocation, Constraints, Reason
from corral.domain.resources import Resources
from corral.domain.status import WorkerStatus
from corral.testing.factories import cpu_job, cpu_worker, gpu_job, gpu_worker


def holding(worker, job_id, gpus=0, cpus=0, memory_mb=0, indices=()):
    return Allocation(job_id, worker.id, Resources(gpus=gpus, cpus=cpus, memory_mb=memory_mb), tuple(indices))


def test_gpu_indices_are_the_lowest_free_ones():
    worker = gpu_worker(gpus=4)
    capacity = free_capacity(
        worker, [holding(worker, "a", gpus=1, indices=[0]), holding(worker, "b", gpus=1, indices=[2])]
    )
    decision = place(Resources(gpus=2), Constraints(), worker, capacity)
    assert decision == Placement(worker.id, (1, 3))


def test_capacity_counts_every_allocation():
    worker = gpu_worker(gpus=8, cpus=10, memory_mb=100)
    capacity = free_capacity(
        worker,
        [holding(worker, "a", gpus=2, cpus=4, memory_mb=60, indices=[0, 1]), holding(worker, "b", cpus=6)],
    )
    assert capacity.free == Resources(gpus=6, vram_mb=worker.resources.vram_mb, memory_mb=40, cpus=0)
    assert capacity.free_gpu_indices == (2, 3, 4, 5, 6, 7)


@pytest.mark.parametrize(
    ("job", "worker", "code"),
    [
        (gpu_job(gpus=1), cpu_worker(), "no_gpus"),
        (gpu_job(gpus=9), gpu_worker(gpus=8), "insufficient_capacity"),
        (gpu_job(gpus=1, vram_mb=90_000), gpu_worker(vram_mb=80_000), "insufficient_capacity"),
        (cpu_job(cpus=17), cpu_worker(cpus=16), "insufficient_capacity"),
        (
            gpu_job(gpus=1, constraints=Constraints(gpu_model="A100")),
            gpu_worker(gpu_model="H100"),
            "gpu_model_mismatch",
        ),
        (
            cpu_job(constraints=Constraints(labels={"rack": "r1"})),
            cpu_worker(labels={"rack": "r2"}),
            "label_mismatch",
        ),
    ],
)
def test_does_not_fit_says_why(job, worker, code):
    decision = place(job.spec.resources, job.spec.constraints, worker, free_capacity(worker, []))
    assert isinstance(decision, Reason)
    assert decision.code == code


def test_constraints_that_match_fit():
    worker = gpu_worker(gpu_model="H100", labels={"rack": "r1", "zone": "a"})
    job = gpu_job(gpus=8, constraints=Constraints(gpu_model="H100", labels={"rack": "r1"}))
    assert isinstance(
        place(job.spec.resources, job.spec.constraints, worker, free_capacity(worker, [])), Placement
    )


def test_queue_order_class_priority_front_time_id():
    jobs = [
        cpu_job(job_id="j-time2", submitted_at=2),
        cpu_job(job_id="j-time1", submitted_at=1),
        cpu_job(job_id="j-b", submitted_at=1),
        cpu_job(job_id="j-front", submitted_at=9, queue_front=True),
        cpu_job(job_id="j-prio", submitted_at=9, priority=5),
        cpu_job(job_id="j-class", submitted_at=9, preemption_class=7),
    ]
    assert [job.id for job in in_queue_order(jobs)] == [
        "j-class",
        "j-prio",
        "j-front",
        "j-b",
        "j-time1",
        "j-time2",
    ]


def test_claim_policy_takes_the_first_candidate_that_fits():
    worker = gpu_worker(gpus=2)
    policy = Claim()
    capacity = policy.capacity(worker, [holding(worker, "x", gpus=1, indices=[0])])
    candidates = [gpu_job(job_id="j-big", gpus=2), gpu_job(job_id="j-small", gpus=1)]
    chosen = policy.choose(worker, capacity, candidates, [], 0.0)
    assert chosen is not None
    assert (chosen[0].id, chosen[1]) == ("j-small", (1,))
    assert policy.choose(worker, capacity, [candidates[0]], [], 0.0) is None


def test_explain_pending():
    job = gpu_job(gpus=4)
    assert explain_pending(job, [], [])[0].code == "no_workers"
    small = gpu_worker(gpus=2)
    assert explain_pending(job, [small], [])[0].code == "unschedulable"
    big = gpu_worker(gpus=8)
    assert explain_pending(job, [small, big], [])[0].code == "fits_now"
    busy = [holding(big, "x", gpus=6, indices=range(6))]
    assert explain_pending(job, [small, big], busy)[0].code == "waiting_for_capacity"
    offline = gpu_worker(gpus=8, status=WorkerStatus.OFFLINE)
    assert explain_pending(job, [offline], [])[0].code == "no_workers"
