"""``core.dependencies`` and ``domain.arrays``: the verdict on a job's ``after`` conditions, what
becomes of a waiting job, and the array expression (API.md "Arrays and dependencies")."""

from __future__ import annotations

import pytest

from corral.core import dependencies, lifecycle
from corral.core.dependencies import Verdict, condition_verdict, settle, verdict
from corral.domain import errors
from corral.domain.arrays import MAX_ARRAY_TASKS, parse_array
from corral.domain.records import ArraySpec, Dependency, JobSpec
from corral.domain.status import Status

DONE, FAILED, CANCELLED, RUNNING, PENDING = (
    Status.DONE,
    Status.FAILED,
    Status.CANCELLED,
    Status.RUNNING,
    Status.PENDING,
)


@pytest.mark.parametrize(
    ("when", "statuses", "expected"),
    [
        ("ok", (DONE,), Verdict.SATISFIED),
        ("ok", (RUNNING,), Verdict.WAITING),
        ("ok", (FAILED,), Verdict.NEVER),
        ("ok", (CANCELLED,), Verdict.NEVER),
        ("ok", (DONE, RUNNING), Verdict.WAITING),
        ("ok", (DONE, DONE, DONE), Verdict.SATISFIED),
        ("ok", (FAILED, RUNNING), Verdict.NEVER),  # an array with a failed task is never all done
        ("notok", (FAILED,), Verdict.SATISFIED),
        ("notok", (CANCELLED,), Verdict.SATISFIED),
        ("notok", (DONE,), Verdict.NEVER),
        ("notok", (PENDING,), Verdict.WAITING),
        ("notok", (FAILED, RUNNING), Verdict.WAITING),  # not ended yet
        ("notok", (DONE, FAILED), Verdict.SATISFIED),
        ("any", (DONE,), Verdict.SATISFIED),
        ("any", (FAILED, CANCELLED), Verdict.SATISFIED),
        ("any", (DONE, RUNNING), Verdict.WAITING),
        ("ok", (), Verdict.NEVER),  # names nothing any more
        ("any", (), Verdict.NEVER),
    ],
)
def test_condition_verdict(when, statuses, expected):
    assert condition_verdict(when, statuses) == expected


def test_every_condition_together():
    after = (Dependency("j-1", "ok"), Dependency("a-2", "any"))
    assert verdict(after, {"j-1": (DONE,), "a-2": (DONE, FAILED)}) == Verdict.SATISFIED
    assert verdict(after, {"j-1": (DONE,), "a-2": (DONE, RUNNING)}) == Verdict.WAITING
    assert verdict(after, {"j-1": (FAILED,), "a-2": (DONE, RUNNING)}) == Verdict.NEVER
    assert verdict(after, {"a-2": (DONE,)}) == Verdict.NEVER


def _waiting_job():
    spec = JobSpec("true", after=(Dependency("j-1", "ok"),))
    ((_, (job,)),) = lifecycle.submitted([spec], 100.0)
    return job


def test_a_job_with_conditions_is_submitted_waiting():
    job = _waiting_job()
    assert job.status == Status.PENDING and job.awaiting_dependencies
    assert job.reason is not None and job.reason.code == "dependency"


def test_settle_releases_cancels_or_leaves():
    job = _waiting_job()
    released = settle(job, Verdict.SATISFIED, 200.0).outcome
    assert released is not None
    assert (released.status, released.awaiting_dependencies) == (Status.PENDING, False)
    assert released.reason is not None and released.reason.code == "queued"
    cancelled = settle(job, Verdict.NEVER, 200.0).outcome
    assert cancelled is not None
    assert (cancelled.status, cancelled.finished_at) == (Status.CANCELLED, 200.0)
    assert cancelled.reason == dependencies.NEVER_SATISFIED
    assert settle(job, Verdict.WAITING, 200.0).transitions == ()
    assert settle(released, Verdict.NEVER, 300.0).transitions == ()  # no longer waiting


def test_an_array_submit_makes_one_task_per_index():
    spec = JobSpec("true", array=ArraySpec((1, 5, 7), throttle=2))
    ((array_id, tasks),) = lifecycle.submitted([spec], 100.0)
    assert array_id is not None and array_id.startswith("a-")
    assert [task.array_index for task in tasks] == [1, 5, 7]
    assert {(task.array_id, task.array_size, task.array_throttle) for task in tasks} == {(array_id, 3, 2)}
    assert all(task.spec.array is None and task.gang_id is None for task in tasks)
    assert [task.submitted_at for task in tasks] == sorted(task.submitted_at for task in tasks)


@pytest.mark.parametrize(
    ("text", "indices", "throttle"),
    [
        ("0-3", (0, 1, 2, 3), None),
        ("0-9:4", (0, 4, 8), None),
        ("1,5,7", (1, 5, 7), None),
        ("0-99%8", tuple(range(100)), 8),
        ("2,10-12%1", (2, 10, 11, 12), 1),
        ("7", (7,), None),
    ],
)
def test_array_expressions(text, indices, throttle):
    assert parse_array(text) == ArraySpec(indices, throttle)


@pytest.mark.parametrize(
    "text", ["", "5-1", "0-3:0", "1,1", "0-3%0", "0-3%x", "a", f"0-{MAX_ARRAY_TASKS}", "-1", "1,,2"]
)
def test_array_expressions_refused(text):
    with pytest.raises(errors.InvalidRequest):
        parse_array(text)


def test_an_array_of_gangs_is_refused():
    with pytest.raises(errors.InvalidRequest):
        lifecycle.submitted([JobSpec("true", gang_size=2, array=ArraySpec((0, 1)))], 0.0)
