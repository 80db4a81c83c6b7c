"""A pool's ``limits`` cap what its subtree runs at once (API.md "Time limits and reservations"):
claims, gang admission and preemption never take it past them, and ``why`` says so (``pool_limit``)."""

from __future__ import annotations

import httpx

from corral.testing.server import ServerThread
from tests.api.conftest import register, submit


def claim(api: httpx.Client, worker_id: str, **params: object) -> httpx.Response:
    return api.get("/jobs/next", params={"worker_id": worker_id, **params})


def why(api: httpx.Client, job_id: str) -> list[dict]:
    response = api.get(f"/jobs/{job_id}/why")
    response.raise_for_status()
    return response.json()["reasons"]


def test_a_pool_limited_to_one_gpu_runs_one_job_of_its_subtree_at_a_time(api: httpx.Client) -> None:
    assert api.put("/pools/team", json={"limits": {"gpus": 1}}).status_code in (200, 201)
    register(api, "w1", gpus=4, vram_mb=1000)
    team = {submit(api, resources={"gpus": 1}, pool="team/a")["id"] for _ in range(3)}
    other = submit(api, resources={"gpus": 1}, pool="elsewhere")
    started = {claim(api, "w1").json()["id"] for _ in range(2)}
    assert other["id"] in started, "team's other jobs are passed over, not waited for"
    assert claim(api, "w1").status_code == 204, "a child's jobs count against its parent's limit"
    (first,) = started & team
    waiting = sorted(team - started)
    reasons = why(api, waiting[0])
    assert reasons[0]["code"] == "pool_limit"
    assert "pool team runs 1 of its limit 1 GPUs" in reasons[0]["message"]
    assert "fits_now" not in [reason["code"] for reason in reasons]
    api.post(f"/jobs/{first}/done", params={"worker_id": "w1", "attempt": 1}).raise_for_status()
    assert claim(api, "w1").json()["id"] in waiting, "its room within the limit is back"
    assert claim(api, "w1").status_code == 204


def test_a_claim_of_several_jobs_stops_at_the_limit(api: httpx.Client) -> None:
    assert api.put("/pools/team", json={"limits": {"gpus": 2, "cpus": None}}).status_code in (200, 201)
    register(api, "w1", gpus=8, vram_mb=1000)
    for _ in range(4):
        submit(api, resources={"gpus": 1}, pool="team")
    assert len(claim(api, "w1", max=4).json()["items"]) == 2


def test_a_gang_past_its_pools_limit_waits_with_pool_limit(api: httpx.Client, server: ServerThread) -> None:
    assert api.put("/pools/team", json={"limits": {"gpus": 3}}).status_code in (200, 201)
    register(api, "w1", gpus=4, vram_mb=1000)
    register(api, "w2", gpus=4, vram_mb=1000)
    running = submit(api, resources={"gpus": 2}, pool="team")
    assert claim(api, "w1").json()["id"] == running["id"]
    gang = submit(api, resources={"gpus": 1}, gang_size=2, pool="team")
    server.run_loop("admission")
    assert api.get(f"/gangs/{gang['gang_id']}").json()["status"] == "blocked"
    task = api.get("/jobs", params={"gang_id": gang["gang_id"]}).json()["items"][0]
    reasons = why(api, task["id"])
    assert reasons[0]["code"] == "pool_limit"
    assert "pool team runs 2 of its limit 3 GPUs" in reasons[0]["message"]


def test_preemption_never_places_a_preemptor_past_its_pools_limit(
    api: httpx.Client, server: ServerThread, clock
) -> None:
    assert api.put("/pools/team", json={"limits": {"gpus": 1}}).status_code in (200, 201)
    register(api, "w1", gpus=2, vram_mb=1000)
    mine = submit(api, resources={"gpus": 1}, pool="team", preemption_class=5)
    assert claim(api, "w1").json()["id"] == mine["id"]
    low = submit(api, resources={"gpus": 1}, pool="scavenge", preemption_class=0, checkpoint="auto")
    assert claim(api, "w1").json()["id"] == low["id"]
    clock.advance(60)
    urgent = submit(api, resources={"gpus": 1}, pool="team", preemption_class=8)
    server.run_loop("admission")
    assert api.get(f"/jobs/{low['id']}").json()["status"] == "running", "no room within team's limit"
    assert api.get(f"/jobs/{urgent['id']}").json()["reason"]["code"] == "pool_limit"


def test_a_pool_whose_limit_is_lowered_is_preempted_back_under_it(
    api: httpx.Client, server: ServerThread, clock
) -> None:
    """Seed 002's third trigger over HTTP: team runs three 1-GPU jobs, its limit goes down to 1:
    the next cycle stops the two newest (reason ``preempted_pool_limit``, counted by pool), they
    go back to the queue, and the pool's limit keeps them there while the oldest runs."""
    register(api, "w1", gpus=4, vram_mb=1000)
    jobs = []
    for _ in range(3):
        job = submit(api, resources={"gpus": 1}, pool="team", preemption_class=2)
        running = claim(api, "w1")
        assert running.json()["id"] == job["id"]
        jobs.append(running.json())
        clock.advance(60)
    server.run_loop("admission")
    assert {api.get(f"/jobs/{job['id']}").json()["status"] for job in jobs} == {"running"}, "within"
    assert api.put("/pools/team", json={"limits": {"gpus": 1}}).status_code in (200, 201)
    server.run_loop("admission")
    after = [api.get(f"/jobs/{job['id']}").json() for job in jobs]
    assert [job["status"] for job in after] == ["running", "preempting", "preempting"]
    assert after[1]["reason"]["code"] == "preempted_pool_limit"
    assert "bring pool team back within its limits" in after[1]["reason"]["message"]
    assert after[1]["preempted_for"] == "pool:team"
    server.run_loop("admission")
    assert api.get(f"/jobs/{jobs[0]['id']}").json()["status"] == "running", "the stopping ones count as gone"
    for job in jobs[1:]:
        acked = api.post(
            f"/jobs/{job['id']}/preempted", params={"worker_id": "w1", "attempt": job["attempt"], "epoch": 1}
        )
        assert acked.status_code == 200, acked.text
    requeued = api.get(f"/jobs/{jobs[1]['id']}").json()
    assert (requeued["status"], requeued["preempted_count"]) == ("pending", 1)
    assert claim(api, "w1").status_code == 204, "the limit keeps them waiting"
    assert why(api, jobs[1]["id"])[0]["code"] == "pool_limit"
    assert 'corral_preemptions_total{pool="team",reason="pool_limit"} 2.0' in api.get("/metrics").text
