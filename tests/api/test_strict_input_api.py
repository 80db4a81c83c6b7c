"""Loose input found by probing (issue 12 item 5): each is refused with 400 naming what is wrong."""

from __future__ import annotations

import pytest

from tests.api.conftest import claim, error_code, register, submit


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


def _deep(levels: int) -> str:
    return '{"a": ' * levels + "1" + "}" * levels


def test_nul_characters_and_deep_nesting_are_refused_on_both_stores(api):
    """A hostile caller's NUL characters and thousand-deep JSON (issue 24): each refused with 400
    ``invalid_request``, never a 500 from the store, and nothing changed."""
    register(api, gpus=1)
    job = submit(api)
    claimed = claim(api)
    fence = {"worker_id": "w1", "attempt": claimed["attempt"]}
    beat = {"id": job["id"], "attempt": claimed["attempt"]}
    refused = [
        ("/jobs", None, {"command": "a\0b"}),
        ("/jobs", None, {"command": "true", "name": "n\0"}),
        ("/jobs", None, {"command": "true", "env": {"K": "v\0"}}),
        ("/jobs", None, {"command": "true", "env": {"K\0": "v"}}),
        ("/jobs", None, {"command": "true", "user": "u\0"}),
        ("/jobs", None, {"command": "true", "constraints": {"labels": {"k": "\0"}}}),
        ("/workers/register", None, {"id": "w2", "address": "h\0"}),
        ("/workers/w1/heartbeat", None, {"running": [f"{job['id']}\0"]}),
        ("/workers/w1/heartbeat", None, {"jobs": [{**beat, "id": f"{job['id']}\0"}]}),
        ("/workers/w1/heartbeat", None, {"jobs": [{**beat, "progress": {"step": "1\0"}}]}),
        (f"/jobs/{job['id']}/heartbeat", fence, {"progress": {"step\0": 1}}),
        (f"/jobs/{job['id']}/heartbeat", fence, {"progress": {"notes": [["\0"]]}}),
        (f"/jobs/{job['id']}/watchdog", fence, {"kind": "stall", "detail": {"why": "\0"}}),
        (f"/jobs/{job['id']}/watchdog", fence, {"kind": "stall", "detail": "\0"}),
    ]
    for path, params, body in refused:
        response = api.post(path, params=params, json=body)
        assert response.status_code == 400, (path, body, response.text)
        assert error_code(response) == "invalid_request"
    deep = [
        (f"/jobs/{job['id']}/heartbeat", fence, '{"progress": ' + _deep(1000) + "}"),
        (f"/jobs/{job['id']}/heartbeat", fence, '{"progress": {"a": ' + "[" * 1000 + "]" * 1000 + "}}"),
        (
            "/workers/w1/heartbeat",
            None,
            f'{{"jobs": [{{"id": "{job["id"]}", "attempt": {claimed["attempt"]}, "progress": '
            + _deep(100)
            + "}]}",
        ),
        (f"/jobs/{job['id']}/watchdog", fence, '{"kind": "stall", "detail": ' + _deep(1000) + "}"),
    ]
    for path, params, content in deep:
        response = api.post(
            path, params=params, content=content, headers={"content-type": "application/json"}
        )
        assert response.status_code == 400, (path, response.text)
        assert error_code(response) == "invalid_request"
    assert [item["id"] for item in api.get("/jobs").json()["items"]] == [job["id"]]
    assert api.get(f"/jobs/{job['id']}").json()["status"] == "running"
    assert [worker["id"] for worker in api.get("/workers").json()["items"]] == ["w1"]
    # a job's own output may hold any byte: a NUL there is kept as U+FFFD, not refused
    ok = api.post(f"/jobs/{job['id']}/heartbeat", params=fence, json={"progress": {"step": 3, "of": [[1]]}})
    assert ok.status_code == 200
    failed = api.post(f"/jobs/{job['id']}/fail", params=fence, json={"exit_code": 1, "output_tail": "a\0b"})
    assert failed.status_code == 200, failed.text
