"""The claim's choice (``corral.core.claim``) as values: reserved task first, then the first fit
in queue order, then the borrowing rule with the pool's kind."""

from __future__ import annotations

from corral.core.claim import Claim
from corral.domain import pools
from corral.domain.pools import BorrowingView, PoolSettings
from corral.domain.records import Allocation, Constraints, Job, JobSpec
from corral.domain.resources import Resources
from corral.domain.status import Status
from corral.testing.factories import gpu_worker

WORKER = gpu_worker(gpus=2, worker_id="w1")


def job(job_id: str, gpus: int = 1, pool: str = "guest", cls: int = 2, checkpoint: str = "auto") -> Job:
    spec = JobSpec(
        command="true",
        resources=Resources(gpus=gpus),
        constraints=Constraints(),
        pool=pool,
        preemption_class=cls,
        checkpoint_mode=checkpoint,
    )
    return Job(job_id, spec, Status.PENDING, 0.0)


def claim_with(**stored: PoolSettings) -> Claim:
    return Claim(pools.resolve(stored, pools.PoolDefaults()))


class Reads:
    """A borrowing view that counts how often the claim reads it."""

    def __init__(self, view: BorrowingView) -> None:
        self.view, self.count = view, 0

    def __call__(self) -> BorrowingView:
        self.count += 1
        return self.view


#: one GPU free, and pool "home" is guaranteed one it does not use: the free GPU is borrowed
BORROWED = BorrowingView(free_gpus=1, guaranteed={"home": 1}, held={})


def test_a_sensitive_pools_job_is_passed_over_on_borrowed_capacity_and_the_next_one_starts() -> None:
    policy = claim_with(secure=PoolSettings(kind=pools.PoolKind.SENSITIVE))
    capacity = policy.capacity(WORKER, [])
    reads = Reads(BORROWED)
    candidates = [job("j-secure", pool="secure/team"), job("j-plain"), job("j-late")]
    chosen = policy.choose(WORKER, capacity, candidates, [], 0.0, reads)
    assert chosen is not None and chosen[0].id == "j-plain", "the kind is inherited from secure"
    assert reads.count == 1
    assert policy.choose(WORKER, capacity, candidates, [], 0.0, None)[0].id == "j-secure"  # type: ignore[index]


def test_the_borrowing_figures_are_read_once_a_choice_and_only_for_protected_work() -> None:
    policy = claim_with()
    capacity = policy.capacity(WORKER, [])
    reads = Reads(BORROWED)
    assert policy.choose(WORKER, capacity, [job("j-1")], [], 0.0, reads) is not None
    assert reads.count == 0, "preemptible work may borrow: nothing to read"
    locked = [job(f"j-{index}", cls=8, checkpoint="none") for index in range(3)]
    assert policy.choose(WORKER, capacity, locked, [], 0.0, reads) is None
    assert reads.count == 1


def test_a_reserved_task_goes_first_once_its_victims_have_left() -> None:
    policy = Claim()
    reserved = Allocation("j-r", "w1", Resources(gpus=1), (1,), Status.RESERVED)
    victim = Allocation("j-v", "w1", Resources(gpus=1), (1,), Status.PREEMPTING)
    assert policy.reserved_task(WORKER, [reserved, victim]) is None
    assert policy.reserved_task(WORKER, [reserved]) == "j-r"


def test_a_claim_is_topology_blind_the_first_fitting_job_starts_whatever_the_rack() -> None:
    """Issue 25's fragmentation rule, as decided (``corral.core.claim``'s docstring): a worker of an
    empty rack does not pass over a single job that would fit better in a fuller rack; its claim
    starts the first fitting job in queue order, as a worker without labels would."""
    roomy = gpu_worker(gpus=8, worker_id="w-roomy", labels={"topology.block": "b1", "topology.rack": "r1"})
    plain = gpu_worker(gpus=8, worker_id="w-roomy")
    policy = claim_with()
    candidates = [job("j-small", gpus=1), job("j-next", gpus=1)]
    for worker in (roomy, plain):
        chosen = policy.choose(worker, policy.capacity(worker, []), candidates, [], 0.0, None)
        assert chosen is not None and chosen[0].id == "j-small"
