"""What a worker's heartbeats report, and what the server does with it: the ``running`` list
reconciles jobs the worker no longer has (seed 004's busy ghost), GPU readings and a job's
utilisation and memory are shown."""

from __future__ import annotations

from tests.api.conftest import claim, register, submit


def beat(api, job, **body):
    response = api.post(
        f"/jobs/{job['id']}/heartbeat",
        params={"worker_id": job["worker_id"], "attempt": job["attempt"]},
        json=body,
    )
    response.raise_for_status()
    return response


def test_a_job_its_worker_no_longer_lists_is_requeued_at_once(api, server, clock, settings):
    """A worker restarted under the same id (or that lost track of a run) says what it runs; a job
    the server still holds running there, silent since, goes back to the queue now instead of
    holding its GPU until the lease lapses."""
    register(api, gpus=1, vram_mb=1000)
    lost = submit(api, resources={"gpus": 1})
    running = claim(api)
    clock.advance(1)
    api.post("/workers/w1/heartbeat", json={"running": [lost["id"]]}).raise_for_status()
    clock.advance(settings.heartbeat_timeout_s / 2)
    api.post("/workers/w1/heartbeat", json={"running": []}).raise_for_status()
    job = api.get(f"/jobs/{lost['id']}").json()
    assert (job["status"], job["reason"]["code"]) == ("pending", "lease_expired")
    assert "no longer runs it" in job["reason"]["message"]
    assert api.get("/workers/w1").json()["running"] == []
    late = api.post(f"/jobs/{lost['id']}/done", params={"worker_id": "w1", "attempt": running["attempt"]})
    assert late.status_code == 409


def test_a_listed_or_beating_job_is_left_alone(api, clock, settings):
    register(api)
    listed = submit(api)
    first = claim(api)
    beating = submit(api)
    second = claim(api)
    clock.advance(1)
    api.post("/workers/w1/heartbeat", json={"running": [listed["id"], beating["id"]]}).raise_for_status()
    clock.advance(settings.heartbeat_timeout_s / 2)
    beat(api, second)  # being stopped by a watchdog, say: not listed, but still beating
    api.post("/workers/w1/heartbeat", json={"running": [listed["id"]]}).raise_for_status()
    assert api.get(f"/jobs/{first['id']}").json()["status"] == "running"
    assert api.get(f"/jobs/{second['id']}").json()["status"] == "running"


def test_a_job_claimed_just_before_a_heartbeat_is_not_taken_for_a_ghost(api, clock):
    """The worker built its heartbeat before the claim's answer reached it: the job is not listed
    yet, but it has not been silent since the worker's previous heartbeat (a rule on the lease
    alone would take it: claimed 14 s ago, a third of the lease is 10 s)."""
    register(api)
    api.post("/workers/w1/heartbeat", json={"running": []}).raise_for_status()
    clock.advance(1)
    job = submit(api)
    claim(api)
    clock.advance(14)
    api.post("/workers/w1/heartbeat", json={"running": []}).raise_for_status()
    assert api.get(f"/jobs/{job['id']}").json()["status"] == "running"


def test_two_heartbeats_a_moment_apart_make_no_ghost_of_a_job_that_beat_just_before(api, clock):
    """A worker sends an extra heartbeat at once (it marks a GPU unhealthy): the job's last beat is
    older than that previous heartbeat, but only by a moment (a rule on the previous heartbeat
    alone would take it); it must be silent for a third of the lease too."""
    register(api)
    job = submit(api)
    running = claim(api)
    clock.advance(3)
    api.post("/workers/w1/heartbeat", json={"running": [job["id"]]}).raise_for_status()
    clock.advance(1)
    api.post("/workers/w1/heartbeat", json={"running": []}).raise_for_status()
    assert api.get(f"/jobs/{running['id']}").json()["status"] == "running"


def test_heartbeat_readings_are_shown(api):
    register(api, gpus=1, vram_mb=1000)
    submit(api, resources={"gpus": 1})
    job = claim(api)
    beat(api, job, progress={"step": 7}, gpu_util_pct=87.5, rss_mb=2048)
    shown = api.get(f"/jobs/{job['id']}").json()
    assert (shown["progress"], shown["gpu_util_pct"], shown["rss_mb"]) == ({"step": 7}, 87.5, 2048)
    api.post(
        "/workers/w1/heartbeat", json={"gpus": [{"index": 0, "util_pct": 87.0, "mem_used_mb": 30000}]}
    ).raise_for_status()
    assert api.get("/workers/w1").json()["gpu_stats"] == [
        {"index": 0, "util_pct": 87.0, "mem_used_mb": 30000}
    ]
