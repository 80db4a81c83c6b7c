"""Worker routes and the operations routes over real HTTP."""

from __future__ import annotations

from tests.api.conftest import claim, error_code, register, submit

WORKER_FIELDS = {
    "id", "address", "resources", "gpu_model", "labels", "status", "last_heartbeat_at", "registered_at",
    "flagged_dead_at", "used", "running", "unhealthy_gpus", "gpu_stats", "enforcement",
}  # fmt: skip


def test_register_is_an_upsert(api):
    first = register(api, gpus=2, vram_mb=1000)
    assert set(first) == WORKER_FIELDS
    assert first["status"] == "active"
    again = api.post(
        "/workers/register",
        json={
            "id": "w1",
            "address": "10.0.0.5",
            "resources": {"gpus": 4},
            "gpu_model": "H100",
            "labels": {"a": "b"},
        },
    ).json()
    assert (again["address"], again["resources"]["gpus"], again["gpu_model"]) == ("10.0.0.5", 4, "H100")
    assert again["registered_at"] == first["registered_at"]
    assert [worker["id"] for worker in api.get("/workers").json()["items"]] == ["w1"]


def test_register_assigns_an_id_when_none_is_given(api):
    response = api.post("/workers/register", json={"resources": {"cpus": 1}})
    assert response.status_code == 201
    assert response.json()["id"].startswith("w-")


def test_register_rejects_bad_bodies(api):
    for body in ({"resources": {"gpus": -1}}, {"id": ""}, {"resources": "lots"}, {"labels": {"a": 1}}):
        response = api.post("/workers/register", json=body)
        assert response.status_code == 400, body
        assert error_code(response) == "invalid_request"


def test_worker_shows_what_it_runs(api):
    register(api, gpus=2, vram_mb=1000)
    job = submit(api, resources={"gpus": 1, "cpus": 2})
    claim(api)
    worker = api.get("/workers/w1").json()
    assert worker["used"] == {"gpus": 1, "vram_mb": 0, "memory_mb": 0, "cpus": 2}
    assert worker["running"] == [job["id"]]
    assert api.get("/workers/ghost").status_code == 404


def test_heartbeat_revives_an_offline_worker(api, server, clock):
    register(api)
    clock.advance(61)
    server.reap()
    assert api.get("/workers/w1").json()["status"] == "offline"
    beat = api.post("/workers/w1/heartbeat", json={"gpus": [{"index": 0, "util_pct": 3, "mem_used_mb": 10}]})
    assert (beat.status_code, beat.json()) == (200, {})
    assert api.get("/workers/w1").json()["status"] == "active"
    assert api.post("/workers/ghost/heartbeat").status_code == 404
    assert api.post("/workers/w1/heartbeat", json={"gpus": [{"index": -1}]}).status_code == 400


def test_drain_stops_new_work(api):
    register(api)
    submit(api)
    drained = api.post("/workers/w1/drain").json()
    assert drained["status"] == "draining"
    assert api.get("/jobs/next", params={"worker_id": "w1"}).status_code == 204
    assert api.post("/workers/ghost/drain").status_code == 404


def test_health_probes(api):
    health = api.get("/health").json()
    assert health["status"] == "ok"
    assert {"instance_id", "uptime_s", "version"} <= set(health)
    assert api.get("/healthz").status_code == 200
    assert api.get("/readyz").json() == {"status": "ready"}


def test_metrics_count_the_job_life_cycle(api):
    register(api, gpus=2, vram_mb=100)
    job = submit(api, resources={"gpus": 1})
    claim(api)
    api.post(f"/jobs/{job['id']}/done", params={"worker_id": "w1", "attempt": 1})
    submit(api)
    text = api.get("/metrics").text
    for line in (
        "corral_jobs_submitted_total 2.0",
        "corral_jobs_claimed_total 1.0",
        "corral_jobs_completed_total 1.0",
        'corral_jobs{status="pending"} 1.0',
        'corral_jobs{status="done"} 1.0',
        'corral_workers{status="active"} 1.0',
        'corral_gpus{state="free"} 2.0',
        "corral_job_queue_wait_seconds_count 1.0",
        "corral_job_execution_duration_seconds_count 1.0",
    ):
        assert line in text, line


def test_a_drain_is_undone_by_undrain_only(api):
    register(api, gpus=1)
    assert api.post("/workers/w1/drain").json()["status"] == "draining"
    assert register(api, gpus=1)["status"] == "draining", "a re-register keeps the drain"
    submit(api, resources={"gpus": 1})
    assert api.get("/jobs/next", params={"worker_id": "w1"}).status_code == 204
    assert api.post("/workers/w1/undrain").json()["status"] == "active"
    assert api.post("/workers/w1/undrain").json()["status"] == "active", "idempotent"
    claim(api)
    assert api.post("/workers/ghost/undrain").status_code == 404


def test_a_worker_says_what_it_enforces_and_the_list_shows_it(api):
    enforcement = {"identity": "setuid", "memory": "cgroup_v1", "cpu": "cgroup_v1", "pids": "cgroup_v1",
                   "devices": "cgroup_v1", "kill_tree": "cgroup_v2_kill"}  # fmt: skip
    body = {"id": "w1", "address": "h", "resources": {"cpus": 2}, "enforcement": enforcement}
    assert api.post("/workers/register", json=body).json()["enforcement"] == enforcement
    beat = api.post("/workers/w1/heartbeat", json={"running": [], "enforcement": enforcement})
    assert beat.status_code == 200
    assert api.get("/workers").json()["items"][0]["enforcement"] == enforcement
    refused = api.post("/workers/register", json={**body, "enforcement": {"memory": "x", "gpu": "y"}})
    assert refused.status_code == 400
    assert api.post("/workers/register", json={"id": "w2"}).json()["enforcement"] == {}
