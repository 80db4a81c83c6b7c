"""Odd inputs get a 400 naming the problem, never a 500, on both backends."""

from __future__ import annotations

import pytest

from tests.api.conftest import claim, error_code, register, submit


@pytest.mark.parametrize(
    ("method", "path", "params"),
    [
        ("GET", "/jobs/j-%00", None),
        ("GET", "/jobs", {"pool": "a\x00"}),
        ("GET", "/jobs/next", {"worker_id": "w\x00"}),
    ],
)
def test_nul_in_path_or_query_is_400(api, method, path, params):
    response = api.request(method, path, params=params)
    assert (response.status_code, error_code(response)) == (400, "invalid_request")
    assert response.headers["x-request-id"]


@pytest.mark.parametrize(
    "body",
    [
        {"command": "echo \x00"},
        {"command": "x", "env": {"A": "\x00"}},
        {"command": "x", "resources": {"memory_mb": 2**33}},
        {"command": "x", "gang_size": 100_000},
        {"command": "x", "pool": "default\n"},
        {"command": "x", "priority": 2**70},
        {"command": "x", "walltime_s": "NaN"},
    ],
)
def test_out_of_range_submits_are_400(api, body):
    response = api.post("/jobs", json=body)
    assert (response.status_code, error_code(response)) == (400, "invalid_request")


def test_a_batch_may_create_at_most_ten_thousand_tasks(api):
    response = api.post("/jobs/batch", json={"jobs": [{"command": "x", "gang_size": 5001}] * 2})
    assert response.status_code == 400
    assert "jobs" in response.json()["error"]["message"]


def test_batch_route_refuses_get_with_405(api):
    response = api.get("/jobs/batch")
    assert (response.status_code, response.headers["allow"]) == (405, "POST")


def test_huge_attempt_and_exit_code_are_400(api):
    register(api)
    job = submit(api)
    claim(api)
    for route in ("heartbeat", "done"):
        response = api.post(f"/jobs/{job['id']}/{route}", params={"worker_id": "w1", "attempt": 2**64})
        assert (response.status_code, error_code(response)) == (400, "invalid_request")
    response = api.post(
        f"/jobs/{job['id']}/fail", params={"worker_id": "w1", "attempt": 1}, json={"exit_code": 2**40}
    )
    assert response.status_code == 400


def test_output_with_nul_bytes_is_kept_not_refused(api):
    register(api)
    job = submit(api, max_retries=1)
    claim(api)
    response = api.post(
        f"/jobs/{job['id']}/fail",
        params={"worker_id": "w1", "attempt": 1},
        json={"exit_code": 1, "output_tail": "binary\x00junk"},
    )
    assert response.status_code == 200
    assert response.json()["output_tail"] == "binary\ufffdjunk"


def test_worker_ids_must_fit_in_a_path(api):
    response = api.post("/workers/register", json={"id": "rack/1"})
    assert (response.status_code, error_code(response)) == (400, "invalid_request")


def test_re_register_keeps_a_drained_worker_drained(api):
    register(api)
    api.post("/workers/w1/drain")
    assert register(api)["status"] == "draining"


def test_cancelling_a_stopping_job_again_counts_once(api):
    register(api)
    job = submit(api)
    claim(api)
    for _ in range(3):
        assert api.post(f"/jobs/{job['id']}/cancel").json()["status"] == "preempting"
    assert 'corral_preemptions_total{pool="default",reason="cancel"} 1.0' in api.get("/metrics").text
    events = [event["to"] for event in api.get(f"/jobs/{job['id']}/events").json()["items"]]
    assert events == ["pending", "running", "preempting"]
