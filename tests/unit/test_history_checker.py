"""The history checker finds each kind of violation it promises, and passes a clean history."""

from __future__ import annotations

from corral.domain.records import Job, JobEvent, JobSpec
from corral.domain.resources import Resources
from corral.domain.status import Status
from corral.testing import history

P, R, RN, D, F = Status.PENDING, Status.RESERVED, Status.RUNNING, Status.DONE, Status.FAILED
CAPACITY = {"w1": Resources(cpus=2), "w2": Resources(cpus=2)}


def job(job_id: str, status: Status, cpus: int = 1, gang_id: str | None = None) -> Job:
    return Job(job_id, JobSpec(command="true", resources=Resources(cpus=cpus)), status, 0.0, gang_id=gang_id)


def ev(
    job_id: str, at: float, before: Status | None, after: Status, attempt: int = 0, worker: str | None = None
):
    return JobEvent(job_id, at, before, after, None, None, worker, attempt)


def clean_run(job_id: str, start: float, worker: str = "w1") -> list[JobEvent]:
    return [
        ev(job_id, start, None, P),
        ev(job_id, start + 1, P, RN, 1, worker),
        ev(job_id, start + 2, RN, D, 1, worker),
    ]


def test_a_clean_history_passes():
    events = {"a": clean_run("a", 0), "b": clean_run("b", 0), "c": clean_run("c", 0, "w2")}
    verdict = history.check([job("a", D), job("b", D), job("c", D)], events, CAPACITY)
    assert verdict.ok, verdict.summary()
    assert verdict.by_status == {"done": 3}


def test_two_running_attempts_at_once_are_found():
    events = {"a": [ev("a", 0, None, P), ev("a", 1, P, RN, 1, "w1"), ev("a", 2, RN, RN, 2, "w2")]}
    assert any("still ran" in line for line in history.check([job("a", RN)], events, CAPACITY).violations)


def test_an_attempt_run_again_or_ended_twice_is_found():
    events = {
        "a": [
            ev("a", 0, None, P),
            ev("a", 1, P, RN, 1, "w1"),
            ev("a", 2, RN, P, 1, "w1"),
            ev("a", 3, P, RN, 1, "w1"),
            ev("a", 4, RN, D, 1, "w1"),
        ]
    }
    violations = history.check([job("a", D)], events, CAPACITY).violations
    assert any("ran again" in line for line in violations)
    assert any("ended 2 times" in line for line in violations)


def test_two_ends_and_a_row_that_disagrees_are_found():
    events = {"a": [*clean_run("a", 0), ev("a", 5, D, F, 1, "w1")]}
    violations = history.check([job("a", D)], events, CAPACITY).violations
    assert any("left terminal" in line for line in violations)
    assert any("2 terminal transitions" in line for line in violations)
    assert any("row says done" in line for line in violations)


def test_a_worker_over_capacity_is_found_but_a_slot_reused_at_one_instant_is_not():
    events = {"a": clean_run("a", 0), "b": clean_run("b", 2), "c": clean_run("c", 0.5)}
    jobs = [job("a", D), job("b", D, cpus=1), job("c", D, cpus=1)]
    assert history.check(jobs, events, CAPACITY).ok, "a freed at 2, b placed at 3: never over"
    events["c"] = [ev("c", 0, None, P), ev("c", 1.5, P, RN, 1, "w1"), ev("c", 9, RN, D, 1, "w1")]
    events["b"] = [ev("b", 0, None, P), ev("b", 1.7, P, RN, 1, "w1"), ev("b", 9, RN, D, 1, "w1")]
    assert any("over capacity" in line for line in history.check(jobs, events, CAPACITY).violations)


def test_a_gang_reserved_in_part_or_rerun_in_part_is_found():
    tasks = [job("t0", D, gang_id="g"), job("t1", F, gang_id="g")]
    events = {
        "t0": [
            ev("t0", 0, None, Status.BLOCKED),
            ev("t0", 1, Status.BLOCKED, R, 0, "w1"),
            ev("t0", 2, R, RN, 1, "w1"),
            ev("t0", 3, RN, D, 1, "w1"),
        ],
        "t1": [
            ev("t1", 0, None, Status.BLOCKED),
            ev("t1", 1.5, Status.BLOCKED, R, 0, "w2"),
            ev("t1", 2, R, RN, 1, "w2"),
            ev("t1", 3, RN, F, 1, "w2"),
        ],
    }
    violations = history.check(tasks, events, CAPACITY).violations
    assert any("1 of 2 tasks reserved" in line for line in violations)
    events["t1"] = [
        ev("t1", 0, None, Status.BLOCKED),
        ev("t1", 1, Status.BLOCKED, R, 0, "w2"),
        ev("t1", 2, R, RN, 1, "w2"),
        ev("t1", 2.5, RN, Status.BLOCKED, 1, "w2"),
        ev("t1", 4, Status.BLOCKED, R, 1, "w2"),
        ev("t1", 4.5, R, RN, 2, "w2"),
        ev("t1", 5, RN, F, 2, "w2"),
    ]
    events["t0"][1] = ev("t0", 1, Status.BLOCKED, R, 0, "w1")
    violations = history.check(tasks, events, CAPACITY).violations
    assert "gang g: t1 reserved again after a peer ended" in violations
