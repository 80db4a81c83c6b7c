"""The one protection rule: which work may never be preempted, and its static part (no preemption
could ever take the job back, so it is not placed on borrowed capacity)."""

from __future__ import annotations

import dataclasses

import pytest

from corral.core.protection import unreclaimable, why_protected
from corral.domain.records import Job, JobSpec
from corral.domain.resources import Resources
from corral.domain.status import Status

NOW = 10_000.0


def job(
    cls: int = 7, checkpoint: str = "none", walltime_s: float | None = None, started_at: float = 0.0
) -> Job:
    spec = JobSpec(
        command="true",
        resources=Resources(gpus=1),
        preemption_class=cls,
        checkpoint_mode=checkpoint,
        walltime_s=walltime_s,
    )
    return Job("j-1", spec, Status.RUNNING, 0.0, started_at=started_at)


@pytest.mark.parametrize(
    ("cls", "checkpoint", "kind", "expected"),
    [(10, "auto", None, True), (7, "none", None, True), (7, "auto", None, False),
     (6, "none", "batch", False), (2, "auto", "sensitive", True), (2, "auto", "service", False)],
)  # fmt: skip
def test_unreclaimable(cls: int, checkpoint: str, kind: str | None, expected: bool) -> None:
    assert unreclaimable(job(cls=cls, checkpoint=checkpoint), kind) is expected


@pytest.mark.parametrize(
    ("cls", "checkpoint", "kind", "why"),
    [(10, "auto", None, "class 10 is never preempted"),
     (3, "auto", "sensitive", "a sensitive pool's work is never preempted"),
     (8, "none", None, "class 7 and above without checkpoints is not preemptible"),
     (8, "auto", None, None), (6, "none", None, None)],
)  # fmt: skip
def test_why_protected_says_which_rule(cls: int, checkpoint: str, kind: str | None, why: str | None) -> None:
    assert why_protected(job(cls=cls, checkpoint=checkpoint), kind, NOW, 300.0) == why


def test_near_its_walltime_a_job_is_protected_but_still_reclaimable_in_principle() -> None:
    """The time rule is not static: such a job may have been placed on borrowed capacity."""
    near = job(cls=3, checkpoint="auto", walltime_s=1_000.0, started_at=NOW - 800.0)
    assert why_protected(near, None, NOW, 300.0) == "within 300 s of its walltime"
    assert why_protected(near, None, NOW, 100.0) is None
    assert not unreclaimable(near, None)


def test_a_job_without_a_walltime_is_never_near_completion() -> None:
    """No limit: nothing ends it, so there is no "near its end" to protect."""
    assert why_protected(job(cls=3, checkpoint="auto", started_at=NOW - 1e6), None, NOW, 300.0) is None


def test_a_job_past_its_deadline_is_no_longer_protected() -> None:
    """Measured on main: a job that overran its walltime (walltime_s=1) stayed "near completion" for
    ever and no preemptor could ever take its GPU (``no_victim_set``). Its worker is stopping it:
    sparing it saves nothing."""
    overrun = job(cls=0, checkpoint="auto", walltime_s=1.0, started_at=NOW - 600.0)
    assert overrun.deadline_at == NOW - 599.0
    assert why_protected(overrun, None, NOW, 300.0) is None
    at_the_limit = job(cls=0, checkpoint="auto", walltime_s=600.0, started_at=NOW - 600.0)
    assert why_protected(at_the_limit, None, NOW, 300.0) == "within 300 s of its walltime"


@pytest.mark.parametrize("status", [Status.PENDING, Status.RESERVED, Status.DONE, Status.FAILED])
def test_deadline_at_only_while_the_attempt_runs(status: Status) -> None:
    assert dataclasses.replace(job(walltime_s=100.0, started_at=NOW), status=status).deadline_at is None
    assert job(walltime_s=100.0, started_at=NOW).deadline_at == NOW + 100.0
    preempting = dataclasses.replace(job(walltime_s=100.0, started_at=NOW), status=Status.PREEMPTING)
    assert preempting.deadline_at == NOW + 100.0


def test_a_gang_that_just_started_is_exempt_for_gang_exempt_s() -> None:
    """A gang that just started has lost no work (the cheapest victim by cost), but stopping it gives
    away room it waited hours to gather: its tasks are exempt for ``gang_exempt_s`` after they
    start, and while a task has not started yet (its gang is starting)."""
    task = dataclasses.replace(job(cls=3, checkpoint="auto", started_at=NOW - 100.0), gang_id="g-1")
    assert why_protected(task, None, NOW, 300.0, 600.0) == "its gang started less than 600 s ago"
    assert why_protected(task, None, NOW, 300.0, 100.0) is None  # exactly its exemption: a victim again
    assert why_protected(task, None, NOW, 300.0, 0.0) is None  # 0: no exemption
    starting = dataclasses.replace(task, status=Status.RESERVED, started_at=None)
    assert why_protected(starting, None, NOW, 300.0, 600.0) == "its gang started less than 600 s ago"
    assert not unreclaimable(task, None)  # a time rule: the gang may still be placed on borrowed room


def test_a_single_job_that_just_started_is_not_exempt() -> None:
    """A single job re-queued finds room on any one worker again: no exemption."""
    single = job(cls=3, checkpoint="auto", started_at=NOW - 1.0)
    assert why_protected(single, None, NOW, 300.0, 600.0) is None
