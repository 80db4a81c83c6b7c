"""Seed 003: sensitive claims are class 10. A ``sensitive`` pool's waiting work preempts as class
10 whatever class it declares (``corral.core.preemption.rules.preempting_class``)."""

from __future__ import annotations

import httpx

from corral.testing.server import ServerThread
from tests.api.conftest import register, submit


def test_a_sensitive_pools_class_2_job_takes_a_class_5_jobs_gpu(
    api: httpx.Client, server: ServerThread, clock
) -> None:
    assert api.put("/pools/secure", json={"kind": "sensitive"}).status_code in (200, 201)
    register(api, "w1", gpus=1, vram_mb=1000)
    normal = submit(api, resources={"gpus": 1}, preemption_class=5, checkpoint="auto")
    assert api.get("/jobs/next", params={"worker_id": "w1"}).json()["id"] == normal["id"]
    clock.advance(60)
    plain = submit(api, resources={"gpus": 1}, preemption_class=2)
    server.run_loop("admission")
    assert api.get(f"/jobs/{normal['id']}").json()["status"] == "running", "class 2 takes nothing from 5"
    api.post(f"/jobs/{plain['id']}/cancel").raise_for_status()
    secure = submit(api, resources={"gpus": 1}, preemption_class=2, pool="secure/team")
    server.run_loop("admission")
    stopped = api.get(f"/jobs/{normal['id']}").json()
    assert stopped["status"] == "preempting"
    assert stopped["reason"]["code"] == "preempted_priority"
    assert api.get(f"/jobs/{secure['id']}").json()["worker_id"] == "w1"
