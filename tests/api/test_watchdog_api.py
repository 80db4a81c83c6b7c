"""Server side of the watchdogs: the trip report and the dead-worker sweep, on both backends."""

from __future__ import annotations

import pytest

from tests.api.conftest import claim, error_code, register, submit


def trip(api, job_id, kind="stall", attempt=1, worker_id="w1", detail=None):
    return api.post(
        f"/jobs/{job_id}/watchdog",
        params={"worker_id": worker_id, "attempt": attempt},
        json={"kind": kind, "detail": detail or {"util_max_pct": 0, "memory_deviation_mb": 3}},
    )


def test_trip_requeues_at_the_front_then_fails_past_the_cap(api, clock, settings):
    settings.watchdog_max_retries = 2
    register(api)
    job = submit(api)
    clock.advance(1)
    later = submit(api)
    outcomes = []
    for attempt in (1, 2, 3):
        claimed = claim(api)
        assert claimed["id"] == job["id"], "a tripped job goes back to the front of its queue"
        response = trip(api, job["id"], attempt=attempt)
        assert response.status_code == 200
        outcomes.append((response.json()["status"], response.json()["watchdog_retries"]))
    assert outcomes == [("pending", 1), ("pending", 2), ("failed", 2)]
    failed = api.get(f"/jobs/{job['id']}").json()
    assert failed["reason"]["code"] == "watchdog_stall"
    assert "memory_deviation_mb" in failed["error"]
    assert claim(api)["id"] == later["id"]
    events = api.get(f"/jobs/{job['id']}/events").json()["items"]
    trips = [event["reason"] for event in events if event["reason"]["code"] == "watchdog_stall"]
    assert len(trips) == 3
    assert "util_max_pct" in trips[0]["message"]
    metrics = api.get("/metrics").text
    assert 'corral_watchdog_trips_total{kind="stall",outcome="requeued"} 2.0' in metrics
    assert 'corral_watchdog_trips_total{kind="stall",outcome="failed"} 1.0' in metrics


def test_trip_is_fenced_and_validated(api):
    register(api)
    job = submit(api)
    claim(api)
    stale = trip(api, job["id"], attempt=2)
    assert (stale.status_code, error_code(stale)) == (409, "stale_attempt")
    for body in ({"kind": "boredom"}, {}, {"kind": "budget", "detail": 5}):
        response = api.post(
            f"/jobs/{job['id']}/watchdog", params={"worker_id": "w1", "attempt": 1}, json=body
        )
        assert (response.status_code, error_code(response)) == (400, "invalid_request"), body
    assert (
        api.post(
            "/jobs/j-missing/watchdog", params={"worker_id": "w1", "attempt": 1}, json={"kind": "budget"}
        ).status_code
        == 404
    )
    assert trip(api, job["id"], kind="budget").json()["status"] == "pending"
    again = trip(api, job["id"], kind="budget")
    assert (again.status_code, error_code(again)) == (409, "stale_attempt")


def test_a_trip_while_cancelling_ends_cancelled(api):
    register(api)
    job = submit(api)
    claim(api)
    api.post(f"/jobs/{job['id']}/cancel")
    assert trip(api, job["id"], kind="budget").json()["status"] == "cancelled"


def test_dead_worker_is_flagged_once_per_episode(api, server, clock, settings, caplog):
    register(api)
    register(api, "idle")
    submit(api)
    claim(api)
    clock.advance(settings.dead_worker_after_s + 1)
    server.run_loop("dead_worker_sweep")
    server.run_loop("dead_worker_sweep")
    workers = {worker["id"]: worker for worker in api.get("/workers").json()["items"]}
    assert workers["w1"]["flagged_dead_at"] is not None
    assert workers["idle"]["flagged_dead_at"] is None, "a silent worker holding nothing is not dead"
    assert "corral_dead_workers_flagged_total 1.0" in api.get("/metrics").text
    assert [record.message for record in caplog.records].count("DEAD WORKER") == 1
    api.post("/workers/w1/heartbeat")
    assert api.get("/workers/w1").json()["flagged_dead_at"] is None
    clock.advance(settings.dead_worker_after_s + 1)
    server.run_loop("dead_worker_sweep")
    assert api.get("/workers/w1").json()["flagged_dead_at"] is not None
    assert "corral_dead_workers_flagged_total 2.0" in api.get("/metrics").text


@pytest.mark.parametrize("reported", [[1], [1, 0]])
def test_unhealthy_gpus_are_not_placed(api, reported):
    register(api, gpus=2, vram_mb=1000)
    api.post("/workers/w1/heartbeat", json={"unhealthy_gpus": reported})
    assert api.get("/workers/w1").json()["unhealthy_gpus"] == sorted(reported)
    submit(api, resources={"gpus": 1})
    response = api.get("/jobs/next", params={"worker_id": "w1"})
    if len(reported) == 2:
        assert response.status_code == 204
    else:
        assert response.json()["gpu_indices"] == [0]
    api.post("/workers/w1/heartbeat", json={})
    assert api.get("/workers/w1").json()["unhealthy_gpus"] == sorted(reported), "heartbeats only add"
    register(api, gpus=2, vram_mb=1000)
    assert api.get("/workers/w1").json()["unhealthy_gpus"] == []


def test_a_trip_spends_the_watchdog_cap_not_a_retry(api, settings):
    """With max_retries=2, two stall trips and then the first real failure must leave a retry: the
    trips are the watchdog's to count (they used to spend the job's attempts, and it failed)."""
    settings.watchdog_max_retries = 3
    register(api)
    job = submit(api, max_retries=2)
    for attempt in (1, 2):
        claim(api)
        assert trip(api, job["id"], attempt=attempt).json()["status"] == "pending"
    claim(api)
    failed = api.post(
        f"/jobs/{job['id']}/fail", params={"worker_id": "w1", "attempt": 3}, json={"exit_code": 1}
    ).json()
    assert (failed["status"], failed["attempts"], failed["watchdog_retries"]) == ("pending", 1, 2)
    claim(api)
    last = api.post(
        f"/jobs/{job['id']}/fail", params={"worker_id": "w1", "attempt": 4}, json={"exit_code": 1}
    ).json()
    assert (last["status"], last["attempts"]) == ("failed", 2)


def test_a_worker_whose_jobs_heartbeat_is_not_flagged_dead(api, server, clock, settings):
    """The worker's own heartbeat comes every 15 s with a 15 s request timeout, so one slow round
    trip can leave 30 s between two; its jobs' heartbeats (every 5 s) show it alive meanwhile."""
    register(api)
    job = submit(api)
    claim(api)
    for _ in range(4):
        clock.advance(settings.dead_worker_after_s / 3)
        api.post(f"/jobs/{job['id']}/heartbeat", params={"worker_id": "w1", "attempt": 1}).raise_for_status()
    server.run_loop("dead_worker_sweep")
    assert api.get("/workers/w1").json()["flagged_dead_at"] is None
    clock.advance(settings.dead_worker_after_s + 1)
    server.run_loop("dead_worker_sweep")
    assert api.get("/workers/w1").json()["flagged_dead_at"] is not None, "silent in every way: flagged"
