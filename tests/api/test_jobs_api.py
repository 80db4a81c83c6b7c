"""Users' routes over real HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from tests.api.conftest import claim, error_code, register, submit

JOB_FIELDS = {
    "id", "name", "command", "env", "status", "gang_id", "gang_size", "gang_index", "resources",
    "constraints", "pool", "user", "priority", "preemption_class", "checkpoint_mode", "max_retries",
    "attempts",
    "watchdog_retries", "preempted_count", "worker_id", "gpu_indices", "reservation_epoch", "reserved_at",
    "preemption_epoch", "drain_started_at", "submitted_at", "started_at", "finished_at", "last_heartbeat_at",
    "exit_code", "error", "reason", "has_checkpoint", "progress", "budget_s", "walltime_s",
}  # fmt: skip


def test_submit_answers_the_full_job_object(api):
    response = api.post(
        "/jobs",
        json={
            "command": "python train.py",
            "name": "train",
            "env": {"SEED": "1"},
            "resources": {"gpus": 2, "vram_mb": 40000, "memory_mb": 1000, "cpus": 4},
            "constraints": {"gpu_model": "H100", "labels": {"rack": "r1"}},
            "pool": "research/vision",
            "priority": 3,
            "preemption_class": 7,
            "checkpoint": "auto",
            "max_retries": 5,
            "budget_s": 3600,
            "walltime_s": 1800,
            "stall_timeout_s": 60,
        },
    )
    assert response.status_code == 201
    assert response.headers["x-request-id"]
    job = response.json()
    assert set(job) >= JOB_FIELDS
    assert job["id"].startswith("j-")
    assert job["status"] == "pending"
    assert job["resources"] == {"gpus": 2, "vram_mb": 40000, "memory_mb": 1000, "cpus": 4}
    assert job["constraints"] == {"gpu_model": "H100", "labels": {"rack": "r1"}}
    assert (job["checkpoint_mode"], job["preemption_class"], job["max_retries"]) == ("auto", 7, 5)
    assert job["submitted_at"].endswith("Z")
    assert api.get(f"/jobs/{job['id']}").json() == job


def test_submit_defaults(api):
    job = submit(api)
    assert job["gang_size"] == 1
    assert job["resources"] == {"gpus": 0, "vram_mb": 0, "memory_mb": 0, "cpus": 0}
    assert (job["pool"], job["priority"], job["preemption_class"], job["max_retries"]) == ("default", 0, 5, 3)
    assert job["reason"]["code"] == "queued"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "command"),
        ({"command": ""}, "command"),
        ({"command": "   "}, "command"),
        ({"command": "x", "preemption_class": 11}, "preemption_class"),
        ({"command": "x", "preemption_class": -1}, "preemption_class"),
        ({"command": "x", "resources": {"gpus": -1}}, "resources.gpus"),
        ({"command": "x", "resources": {"gpu": 1}}, "resources.gpu"),
        ({"command": "x", "gang_size": 0}, "gang_size"),
        ({"command": "x", "max_retries": -1}, "max_retries"),
        ({"command": "x", "checkpoint": "sometimes"}, "checkpoint"),
        ({"command": "x", "env": {"A": 1}}, "env.A"),
        ({"command": "x", "pool": "a//b"}, "pool"),
        ({"command": "x", "budget_s": 0}, "budget_s"),
        ({"command": 5}, "command"),
    ],
)
def test_bad_submit_is_400_naming_the_field(api, body, field):
    response = api.post("/jobs", json=body)
    assert response.status_code == 400
    assert error_code(response) == "invalid_request"
    assert field in response.json()["error"]["message"]


@pytest.mark.parametrize("content", [b"", b"{", b"[1, 2]", b"null", b"\xff\xfe"])
def test_malformed_body_is_400(api, content):
    response = api.post("/jobs", content=content)
    assert response.status_code == 400
    assert error_code(response) == "invalid_request"


def test_body_over_one_mebibyte_is_413(api):
    response = api.post("/jobs", json={"command": "x" * (1024 * 1024 + 10)})
    assert response.status_code == 413
    assert error_code(response) == "too_large"


def test_gang_submit_and_view(api):
    response = api.post("/jobs", json={"command": "train", "gang_size": 3, "resources": {"gpus": 1}})
    assert response.status_code == 201
    answer = response.json()
    assert set(answer) == {"gang_id", "tasks"}
    gang = api.get(f"/gangs/{answer['gang_id']}").json()
    assert (gang["gang_id"], gang["size"], gang["status"]) == (answer["gang_id"], 3, "blocked")
    assert [task["id"] for task in gang["tasks"]] == answer["tasks"]
    assert [task["gang_index"] for task in gang["tasks"]] == [0, 1, 2]
    assert api.get("/gangs/g-missing").status_code == 404
    cancelled = api.post(f"/gangs/{answer['gang_id']}/cancel").json()
    assert cancelled["status"] == "cancelled"
    assert api.post("/gangs/g-missing/cancel").status_code == 404


def test_batch_creates_all_or_nothing(api):
    response = api.post("/jobs/batch", json={"jobs": [{"command": "a"}, {"command": "b", "gang_size": 2}]})
    assert response.status_code == 201
    items = response.json()["items"]
    assert items[0]["status"] == "pending"
    assert len(items[1]["tasks"]) == 2
    bad = api.post("/jobs/batch", json={"jobs": [{"command": "c"}, {"command": "d"}, {"command": ""}]})
    assert bad.status_code == 400
    assert "jobs.2.command" in bad.json()["error"]["message"]
    assert len(api.get("/jobs").json()["items"]) == 3
    assert api.post("/jobs/batch", json={"jobs": []}).status_code == 400
    too_many = api.post("/jobs/batch", json={"jobs": [{"command": "x"}] * 10_001})
    assert too_many.status_code == 400


def test_idempotency_key_returns_the_first_response(api):
    headers = {"Idempotency-Key": "submit-42"}
    first = api.post("/jobs", json={"command": "once"}, headers=headers)
    again = api.post("/jobs", json={"command": "once"}, headers=headers)
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert len(api.get("/jobs").json()["items"]) == 1
    reused = api.post("/jobs", json={"command": "different"}, headers=headers)
    assert reused.status_code == 409
    assert error_code(reused) == "conflict"


def test_list_filters_limit_and_cursor(api, clock):
    ids = []
    for index in range(5):
        clock.advance(1)
        ids.append(submit(api, pool="a" if index % 2 else "b")["id"])
    page = api.get("/jobs", params={"limit": 2}).json()
    seen = [job["id"] for job in page["items"]]
    while page["next"]:
        page = api.get("/jobs", params={"limit": 2, "after": page["next"]}).json()
        seen += [job["id"] for job in page["items"]]
    assert seen == ids
    assert [job["id"] for job in api.get("/jobs", params={"pool": "a"}).json()["items"]] == ids[1::2]
    assert api.get("/jobs", params={"status": "done"}).json() == {"items": [], "next": None}
    for params in ({"limit": 0}, {"limit": 5001}, {"limit": "x"}, {"status": "nonsense"}, {"after": "@@"}):
        response = api.get("/jobs", params=params)
        assert response.status_code == 400, params
        assert error_code(response) == "invalid_request"


def test_unknown_job_is_404_everywhere(api):
    for method, path in (
        ("GET", "/jobs/j-missing"),
        ("GET", "/jobs/j-missing/events"),
        ("GET", "/jobs/j-missing/why"),
        ("POST", "/jobs/j-missing/cancel"),
    ):
        response = api.request(method, path)
        assert response.status_code == 404, path
        assert error_code(response) == "not_found"


def test_events_tell_the_story(api):
    register(api)
    job = submit(api)
    claimed = claim(api)
    api.post(f"/jobs/{job['id']}/done", params={"worker_id": "w1", "attempt": claimed["attempt"]})
    events = api.get(f"/jobs/{job['id']}/events").json()["items"]
    assert [(event["from"], event["to"]) for event in events] == [
        (None, "pending"),
        ("pending", "running"),
        ("running", "done"),
    ]
    assert events[1]["worker_id"] == "w1"
    assert events[1]["attempt"] == 1
    assert set(events[0]) == {"at", "from", "to", "reason", "epoch", "worker_id", "attempt"}


def test_why_explains_a_pending_job(api):
    job = submit(api, resources={"gpus": 4})
    assert api.get(f"/jobs/{job['id']}/why").json()["reasons"][0]["code"] == "no_workers"
    register(api, gpus=2)
    why = api.get(f"/jobs/{job['id']}/why").json()
    assert why["status"] == "pending"
    assert why["reasons"][0]["code"] == "unschedulable"


def test_cancel_pending_then_again_is_409(api):
    job = submit(api)
    cancelled = api.post(f"/jobs/{job['id']}/cancel")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    again = api.post(f"/jobs/{job['id']}/cancel")
    assert again.status_code == 409
    assert error_code(again) == "already_terminal"


def test_wrong_method_and_unknown_path(api):
    response = api.delete("/jobs")
    assert response.status_code == 405
    assert error_code(response) == "method_not_allowed"
    assert "POST" in response.headers["allow"]
    missing = api.get("/nowhere")
    assert missing.status_code == 404
    assert error_code(missing) == "not_found"
    assert missing.headers["x-request-id"]


def test_request_id_is_echoed(api):
    assert api.get("/healthz", headers={"X-Request-ID": "abc-123"}).headers["x-request-id"] == "abc-123"
