"""Arrays and dependencies in the simulator: the %N throttle holds there as in the claim, a job
after an array starts once every task is done, one after a failed condition is cancelled, and the
workload CSV's ``array`` and ``after`` columns."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.sim import engine
from corral.sim.policy import CORRAL
from corral.sim.readers import InputError, read_workload, uniform_cluster
from corral.sim.workload import Scenario, SimSettings, Workload, WorkloadJob

SETTINGS = SimSettings(heartbeat_s=5.0, checkpoint_save_s=10.0, stop_s=1.0)


def _scenario(*jobs: WorkloadJob, gpus: int = 8) -> Scenario:
    return Scenario(Workload(jobs), uniform_cluster(1, gpus), settings=SETTINGS)


def _most_running_at_once(record: engine.Record, prefix: str) -> int:
    running = most = 0
    for _, kind, job_id, _, _ in sorted(record.decisions, key=lambda decision: decision[0]):
        if not job_id.startswith(prefix):
            continue
        if kind == "running":
            running += 1
        elif kind in ("done", "failed", "cancelled", "preempted"):
            running -= 1
        most = max(most, running)
    return most


def test_the_throttle_holds_and_a_job_after_the_array_starts_once_every_task_is_done():
    case = _scenario(
        WorkloadJob("arr", 0, 10, 1, array="0-5%2"),
        WorkloadJob("next", 0, 5, 1, after=(("ok", "arr"),)),
    )
    record = engine.run(case, CORRAL, record_decisions=True)
    assert _most_running_at_once(record, "arr.") == 2  # 8 GPUs free, yet two at once
    assert record.ends["arr"] == 30.0  # three rounds of two
    assert record.starts["next"] == 30.0 and record.ends["next"] == 35.0


def test_a_job_after_one_that_cannot_be_ok_is_cancelled_and_notok_runs():
    case = _scenario(
        WorkloadJob("long", 0, 100, 1, walltime=10),  # fails at its walltime
        WorkloadJob("on-ok", 0, 5, 1, after=(("ok", "long"),)),
        WorkloadJob("on-notok", 0, 5, 1, after=(("notok", "long"),)),
        WorkloadJob("unknown", 0, 5, 1, after=(("ok", "nothing"),)),
    )
    record = engine.run(case, CORRAL, record_decisions=True)
    assert ("cancelled", "on-ok", "dependency_never_satisfied") in {
        (kind, job_id, reason) for _, kind, job_id, _, reason in record.decisions
    }
    assert "on-ok" not in record.starts
    assert record.starts["on-notok"] == 11.0
    assert record.refused == ["unknown"]


def test_the_workload_csv_reads_array_and_after(tmp_path: Path):
    path = tmp_path / "w.csv"
    path.write_text("job_id,submit_time,duration,gpus,array,after\na,0,10,1,0-3%2,\nb,0,5,1,,ok:a;any:a\n")
    jobs = read_workload(path).jobs
    assert (jobs[0].array, jobs[0].after) == ("0-3%2", ())
    assert (jobs[1].array, jobs[1].after) == (None, (("ok", "a"), ("any", "a")))
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,submit_time,duration,gpus,after\nb,0,5,1,maybe:a\n")
    with pytest.raises(InputError, match="after"):
        read_workload(bad)
    bad.write_text("job_id,submit_time,duration,gpus,array\nb,0,5,1,3-1\n")
    with pytest.raises(InputError, match="array"):
        read_workload(bad)
