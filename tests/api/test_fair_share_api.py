"""Fair share over real HTTP with a fake clock, on SQLite and PostgreSQL: the admission cycle's
starvation timers as `GET /pools` and `why` show them, and the preemption once a pool starves."""

from __future__ import annotations

import httpx

from corral.testing.server import ServerThread
from tests.api.conftest import register, submit


def claim(api: httpx.Client, worker_id: str = "w1") -> dict:
    response = api.get("/jobs/next", params={"worker_id": worker_id})
    assert response.status_code == 200, response.text
    return response.json()


def pools(api: httpx.Client) -> dict[str, dict]:
    return {pool["path"]: pool for pool in api.get("/pools").json()["items"]}


def test_a_pool_below_its_share_starves_after_its_timer_then_takes_the_newest_allocations(
    api: httpx.Client, server: ServerThread, clock, settings
) -> None:
    settings.starvation_timeout_s = 30
    settings.aggressive_starvation_timeout_s = 120
    register(api, "w1", gpus=4, vram_mb=1000)
    hogs = []
    for _ in range(4):
        submit(api, resources={"gpus": 1}, pool="hog")
        hogs.append(claim(api))
        clock.advance(10)
    late = [submit(api, resources={"gpus": 1}, pool="late") for _ in range(3)]

    server.run_loop("admission")  # the timer starts: below its share, not starving yet
    late_pool = pools(api)["late"]
    assert (late_pool["fair_share"]["gpus"], late_pool["usage"]["gpus"]) == (2.0, 0)
    assert late_pool["starvation"] == "non_starving" and late_pool["below_fair_share_since"] is not None
    why = api.get(f"/jobs/{late[0]['id']}/why").json()
    fair = [reason for reason in why["reasons"] if reason["code"] == "fair_share"]
    assert fair and "pool late" in fair[0]["message"] and "starving after 30 s" in fair[0]["message"]
    assert all(api.get(f"/jobs/{hog['id']}").json()["status"] == "running" for hog in hogs)

    clock.advance(31)
    server.run_loop("admission")
    late_pool = pools(api)["late"]
    assert late_pool["starvation"] == "starving" and late_pool["starvation_since"] is not None

    def statuses() -> list[str]:
        return [api.get(f"/jobs/{hog['id']}").json()["status"] for hog in hogs]

    assert statuses() == ["running", "running", "running", "preempting"], (
        "the newest allocation first: one preemptive placement per worker per backoff"
    )
    clock.advance(6)
    server.run_loop("admission")
    assert statuses() == ["running", "running", "preempting", "preempting"]
    victims = [api.get(f"/jobs/{hog['id']}").json() for hog in hogs[2:]]
    assert all(job["reason"]["code"] == "preempted_fair_share" for job in victims)
    assert all(
        "for fair share: its pool hog runs above its fair share" in job["reason"]["message"]
        for job in victims
    )
    assert not any("reclaim" in job["reason"]["message"] for job in victims)
    reserved = [api.get(f"/jobs/{job['id']}").json()["status"] for job in late]
    assert sorted(reserved) == ["pending", "reserved", "reserved"]

    for _ in range(3):  # at its share now (counting its reservations): nothing more moves
        clock.advance(6)
        server.run_loop("admission")
        assert statuses() == ["running", "running", "preempting", "preempting"]
    assert 'corral_preemptions_total{pool="hog",reason="fair_share"} 2.0' in api.get("/metrics").text
