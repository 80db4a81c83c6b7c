"""Loose input found by probing (issue 12 item 5): each is refused with 400 naming what is wrong."""

from __future__ import annotations

import pytest

from tests.api.conftest import error_code, register


@pytest.mark.parametrize(
    "fields",
    [
        {"gang_size": "2"},
        {"gang_size": True},
        {"resources": {"gpus": True}},
        {"resources": {"cpus": "1"}},
        {"priority": 1.5},
        {"max_retries": False},
        {"budget_s": "60"},
    ],
)
def test_no_coercion_of_wire_types(api, fields):
    response = api.post("/jobs", json={"command": "true", **fields})
    assert response.status_code == 400, response.text
    assert error_code(response) == "invalid_request"
    assert api.get("/jobs").json()["items"] == []


def test_a_number_is_still_a_number_where_seconds_are_asked(api):
    assert api.post("/jobs", json={"command": "true", "budget_s": 60}).status_code == 201


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_json_body_must_say_it_is_json(api, content_type):
    headers = {"content-type": content_type} if content_type else {}
    for path in ("/jobs", "/jobs/batch", "/workers/register"):
        body = b'{"jobs": [{"command": "true"}]}' if path == "/jobs/batch" else b'{"command": "true"}'
        response = api.post(path, content=body, headers=headers)
        assert response.status_code == 400, (path, response.text)
        assert "Content-Type" in response.json()["error"]["message"]
    ok = api.post(
        "/jobs", content=b'{"command": "true"}', headers={"content-type": "application/json; charset=utf-8"}
    )
    assert ok.status_code == 201


@pytest.mark.parametrize("indices", [[-5], [2**62], [0, 65536], ["1"]])
def test_unhealthy_gpu_indices_are_bounded(api, indices):
    register(api, gpus=2)
    response = api.post("/workers/w1/heartbeat", json={"unhealthy_gpus": indices})
    assert response.status_code == 400
    assert api.get("/workers/w1").json()["unhealthy_gpus"] == []


def test_a_repeated_query_parameter_is_refused_unless_it_is_a_list(api):
    register(api)
    for query in ("limit=1&limit=2", "pool=a&pool=b", "after=x&after=y"):
        response = api.get(f"/jobs?{query}")
        assert response.status_code == 400, query
        assert "more than once" in response.json()["error"]["message"]
    assert api.get("/jobs/next?worker_id=w1&worker_id=w2").status_code == 400
    assert api.get("/jobs?status=pending&status=running").status_code == 200
