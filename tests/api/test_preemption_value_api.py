"""Seed 003's multi-victim constraint: the victims' total cost must be below the waiting job's
value (``corral.core.preemption.rules.worth_preempting``): a short job does not stop long work
that has no checkpoint to lose less than it gains."""

from __future__ import annotations

import httpx

from corral.testing.server import ServerThread
from tests.api.conftest import register, submit


def test_a_short_job_does_not_stop_work_worth_more_than_it_and_a_longer_one_does(
    api: httpx.Client, server: ServerThread, clock
) -> None:
    register(api, "w1", gpus=1, vram_mb=1000)
    low = submit(api, resources={"gpus": 1}, preemption_class=2, checkpoint="none")
    assert api.get("/jobs/next", params={"worker_id": "w1"}).json()["id"] == low["id"]
    clock.advance(600)  # 600 GPU-seconds of work since its start, and no checkpoint
    short = submit(api, resources={"gpus": 1}, preemption_class=8, walltime_s=300)
    server.run_loop("admission")
    assert api.get(f"/jobs/{low['id']}").json()["status"] == "running"
    reason = api.get(f"/jobs/{short['id']}").json()["reason"]
    assert reason["code"] == "no_victim_set"
    assert (
        "loses 600 GPU-seconds" in reason["message"]
        and "300 GPU-seconds this job is worth" in reason["message"]
    )
    api.post(f"/jobs/{short['id']}/cancel").raise_for_status()
    longer = submit(api, resources={"gpus": 1}, preemption_class=8, walltime_s=3600)
    server.run_loop("admission")
    assert api.get(f"/jobs/{low['id']}").json()["status"] == "preempting"
    assert api.get(f"/jobs/{longer['id']}").json()["worker_id"] == "w1"


def test_a_job_without_a_walltime_has_no_known_value_and_preempts_as_before(
    api: httpx.Client, server: ServerThread, clock
) -> None:
    register(api, "w1", gpus=1, vram_mb=1000)
    low = submit(api, resources={"gpus": 1}, preemption_class=2, checkpoint="none")
    assert api.get("/jobs/next", params={"worker_id": "w1"}).json()["id"] == low["id"]
    clock.advance(600)
    submit(api, resources={"gpus": 1}, preemption_class=8)
    server.run_loop("admission")
    assert api.get(f"/jobs/{low['id']}").json()["status"] == "preempting"
