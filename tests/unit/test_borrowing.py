"""Work no preemption could take back is not placed on borrowed capacity: the rule as values."""

from __future__ import annotations

from corral.core.borrowing import Guarantees, may_place
from corral.domain.records import Job, JobSpec
from corral.domain.resources import Resources
from corral.domain.status import Status


def job(pool: str = "guest", cls: int = 7, checkpoint: str = "none", gpus: int = 1) -> Job:
    spec = JobSpec(
        command="true",
        resources=Resources(gpus=gpus),
        pool=pool,
        preemption_class=cls,
        checkpoint_mode=checkpoint,
    )
    return Job("j-1", spec, Status.PENDING, 0.0)


def test_without_guarantees_nothing_is_borrowed() -> None:
    assert may_place(job(gpus=8), 8, Guarantees(free_gpus=8, guaranteed={}))


def test_within_its_own_guarantee_it_always_starts() -> None:
    guarantees = Guarantees(free_gpus=2, guaranteed={"home": 4, "other": 8}, held={"home": 2})
    assert may_place(job(pool="home", gpus=2), 2, guarantees)
    assert not may_place(job(pool="home", gpus=3), 3, guarantees), "5 > 4, and other's 8 are unused"


def test_beyond_it_only_while_the_others_unused_guarantees_stay_free() -> None:
    guarantees = Guarantees(free_gpus=10, guaranteed={"home": 4}, held={"home": 1})
    assert may_place(job(gpus=7), 7, guarantees), "10 - 7 = 3 covers home's 3 unused"
    assert not may_place(job(gpus=8), 8, guarantees)
    guarantees.take("home", 3)
    assert may_place(job(gpus=7), 7, guarantees), "home now uses its guarantee: nothing to protect"
