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
    register(api, gpus=1)
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


def test_heartbeat_gpu_indices_are_the_workers_own(api):
    """A heartbeat speaks only of the GPUs the worker registered, each once (issue 24)."""
    register(api, gpus=2)
    refused = [
        {"gpus": [{"index": 0, "util_pct": 1}, {"index": 0, "util_pct": 2}]},
        {"gpus": [{"index": 2, "util_pct": 1}]},
        {"gpus": [{"index": 65535}]},
        {"unhealthy_gpus": [1, 1]},
        {"unhealthy_gpus": [0, 2]},
    ]
    for body in refused:
        response = api.post("/workers/w1/heartbeat", json=body)
        assert response.status_code == 400, (body, response.text)
        assert error_code(response) == "invalid_request"
    worker = api.get("/workers/w1").json()
    assert (worker["unhealthy_gpus"], worker["gpu_stats"]) == ([], [])
    ok = api.post(
        "/workers/w1/heartbeat", json={"gpus": [{"index": 1, "util_pct": 50}], "unhealthy_gpus": [0]}
    )
    assert ok.status_code == 200
    worker = api.get("/workers/w1").json()
    assert (worker["unhealthy_gpus"], [reading["index"] for reading in worker["gpu_stats"]]) == ([0], [1])
    register(api, "cpu-only")
    response = api.post("/workers/cpu-only/heartbeat", json={"gpus": [{"index": 0}]})
    assert response.status_code == 400 and "no GPU 0" in response.json()["error"]["message"]


def test_a_reregister_below_what_the_worker_runs_is_a_conflict(api):
    """API.md "Lists and handles": a re-register that would leave a worker below what it already
    runs is 409 ``conflict`` naming the jobs, and changes nothing."""
    register(api, gpus=4, vram_mb=1000)
    first = submit(api, resources={"gpus": 2, "cpus": 2, "memory_mb": 1000, "vram_mb": 1000}, priority=1)
    second = submit(api, resources={"gpus": 1, "cpus": 2, "memory_mb": 1000})
    claim(api)
    claim(api)
    held = sorted([first["id"], second["id"]])
    for resources in (
        {"gpus": 2},
        {"gpus": 3, "cpus": 3},
        {"memory_mb": 1999},
        {"vram_mb": 999},
    ):
        body = {"id": "w1", "resources": {"cpus": 8, "memory_mb": 8192, "vram_mb": 1000, **resources}}
        response = api.post("/workers/register", json=body)
        assert response.status_code == 409, (resources, response.text)
        assert error_code(response) == "conflict"
        message = response.json()["error"]["message"]
        assert all(job_id in message for job_id in held), message
    worker = api.get("/workers/w1").json()
    assert worker["resources"] == {"gpus": 4, "vram_mb": 1000, "memory_mb": 8192, "cpus": 8}
    # three GPUs in use on indices 0..2: three GPUs and enough of the rest is a re-register it may make
    assert register(api, gpus=3, vram_mb=1000)["resources"]["gpus"] == 3
    api.post(f"/jobs/{first['id']}/done", params={"worker_id": "w1", "attempt": 1}).raise_for_status()
    # one GPU in use, but it is GPU 2 (placement takes the lowest free first: 0 and 1, then 2)
    response = api.post("/workers/register", json={"id": "w1", "resources": {"gpus": 1, "cpus": 2}})
    assert response.status_code == 409 and second["id"] in response.json()["error"]["message"]
    assert first["id"] not in response.json()["error"]["message"]
