"""Pool routes over real HTTP, on SQLite and PostgreSQL: every field round-trips, bad bodies are
400s naming the field, and deletes are refused while the pool is in use."""

from __future__ import annotations

import pytest

from corral.protocol.answers import PoolAnswer, PoolPage
from tests.api.conftest import claim, error_code, register, submit

POOL_FIELDS = {
    "path", "parent", "explicit", "weight", "guarantee", "limits", "mode", "kind", "starvation_timeout_s",
    "aggressive_starvation_timeout_s", "starvation_tolerance", "enable_aggressive_starvation",
    "allow_aggressive_preemption", "default_walltime_s", "max_walltime_s", "settings", "usage", "demand",
    "jobs", "fair_share",
    "fair_share_ratio", "satisfaction", "starvation", "below_fair_share_since", "starvation_since",
}  # fmt: skip
EVERY_SETTING = {
    "weight": 2.5,
    "guarantee": {"gpus": 8, "vram_mb": 0, "memory_mb": 1024, "cpus": 16},
    "limits": {"gpus": 16, "vram_mb": None, "memory_mb": None, "cpus": 64},
    "mode": "fifo",
    "kind": "training",
    "starvation_timeout_s": 12.5,
    "aggressive_starvation_timeout_s": 60.0,
    "starvation_tolerance": 0.6,
    "enable_aggressive_starvation": True,
    "allow_aggressive_preemption": False,
    "default_walltime_s": 3600.0,
    "max_walltime_s": 86400.5,
}


def put(api, path, body=None, status=200):
    response = api.put(f"/pools/{path}", json=body if body is not None else {})
    assert response.status_code == status, response.text
    return response.json()


def test_a_new_server_lists_the_default_pool_with_every_default(api):
    page = api.get("/pools").json()
    PoolPage.model_validate(page)
    assert page["next"] is None
    (default,) = page["items"]
    assert set(default) == POOL_FIELDS
    assert default == {
        "path": "default", "parent": None, "explicit": True, "weight": 1.0,
        "guarantee": {"gpus": 0, "vram_mb": 0, "memory_mb": 0, "cpus": 0}, "limits": None,
        "mode": "fair_share", "kind": "batch", "starvation_timeout_s": 30.0,
        "aggressive_starvation_timeout_s": 120.0, "starvation_tolerance": 0.8,
        "enable_aggressive_starvation": False, "allow_aggressive_preemption": True,
        "default_walltime_s": None, "max_walltime_s": None,
        "settings": {name: None for name in EVERY_SETTING},
        "usage": {"gpus": 0, "vram_mb": 0, "memory_mb": 0, "cpus": 0},
        "demand": {"gpus": 0, "vram_mb": 0, "memory_mb": 0, "cpus": 0}, "jobs": 0,
        "fair_share": {"gpus": 0.0, "cpus": 0.0, "memory_mb": 0.0}, "fair_share_ratio": 0.0,
        "satisfaction": None, "starvation": "non_starving", "below_fair_share_since": None,
        "starvation_since": None,
    }  # fmt: skip


def test_every_field_round_trips_and_children_inherit(api):
    pool = put(api, "org/team", EVERY_SETTING)
    PoolAnswer.model_validate(pool)
    assert pool["settings"] == EVERY_SETTING
    assert {name: pool[name] for name in EVERY_SETTING} == EVERY_SETTING
    assert (pool["path"], pool["parent"], pool["explicit"]) == ("org/team", "org", True)
    assert api.get("/pools/org/team").json() == pool
    child = put(api, "org/team/run", {"weight": 3})
    assert (child["weight"], child["kind"], child["mode"], child["starvation_tolerance"]) == (
        3.0,
        "training",
        "fifo",
        0.6,
    )
    assert (child["guarantee"]["gpus"], child["limits"]) == (0, None)  # not inherited
    assert child["settings"]["kind"] is None
    paths = [item["path"] for item in api.get("/pools").json()["items"]]
    assert paths == ["default", "org", "org/team", "org/team/run"]


def test_a_put_replaces_every_setting(api):
    put(api, "p", EVERY_SETTING)
    pool = put(api, "p", {"kind": "service"})
    assert pool["settings"] == {**{name: None for name in EVERY_SETTING}, "kind": "service"}
    assert (pool["weight"], pool["limits"], pool["mode"]) == (1.0, None, "fair_share")
    assert put(api, "p")["settings"]["kind"] is None  # an empty body: every setting inherited


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"weight": 0}, "weight"),
        ({"weight": -1}, "weight"),
        ({"weight": "heavy"}, "weight"),
        ({"guarantee": {"gpus": -1}}, "guarantee.gpus"),
        ({"guarantee": {"gpus": 1.5}}, "guarantee.gpus"),
        ({"guarantee": {"gpu": 1}}, "guarantee.gpu"),
        ({"limits": {"cpus": -2}}, "limits.cpus"),
        ({"limits": "lots"}, "limits"),
        ({"guarantee": {"gpus": 8}, "limits": {"gpus": 4}}, "limits"),
        ({"mode": "lottery"}, "mode"),
        ({"kind": "secret"}, "kind"),
        ({"starvation_timeout_s": 0}, "starvation_timeout_s"),
        ({"aggressive_starvation_timeout_s": -1}, "aggressive_starvation_timeout_s"),
        (
            {"starvation_timeout_s": 60, "aggressive_starvation_timeout_s": 30},
            "aggressive_starvation_timeout_s",
        ),
        ({"starvation_tolerance": 0}, "starvation_tolerance"),
        ({"starvation_tolerance": 1.01}, "starvation_tolerance"),
        ({"enable_aggressive_starvation": "maybe"}, "enable_aggressive_starvation"),
        ({"allow_aggressive_preemption": [True]}, "allow_aggressive_preemption"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_a_bad_setting_is_a_400_naming_the_field(api, body, field):
    response = api.put("/pools/p", json=body)
    assert (response.status_code, error_code(response)) == (400, "invalid_request")
    assert response.json()["error"]["message"].startswith(field + ":")
    assert [item["path"] for item in api.get("/pools").json()["items"]] == ["default"]


@pytest.mark.parametrize("content", [b"[1]", b"{", b'"x"'])
def test_a_body_that_is_not_an_object_is_a_400(api, content):
    response = api.put("/pools/p", content=content)
    assert (response.status_code, error_code(response)) == (400, "invalid_request")


@pytest.mark.parametrize("path", ["a//b", "a%20b", "a/", "caf%C3%A9", "p" * 257])
def test_a_bad_pool_path_is_a_400_naming_it(api, path):
    for method in ("GET", "PUT", "DELETE"):
        response = api.request(method, f"/pools/{path}", json={})
        assert (response.status_code, error_code(response)) == (400, "invalid_request"), (method, path)
        assert "path" in response.json()["error"]["message"]


def test_unknown_pools_are_404_and_implied_ones_are_found(api):
    for response in (api.get("/pools/nope"), api.delete("/pools/nope")):
        assert (response.status_code, error_code(response)) == (404, "not_found")
    put(api, "a/b/c")
    assert api.get("/pools/a").json()["explicit"] is True  # a PUT makes its ancestors rows


def test_a_wrong_method_is_a_405(api):
    for response in (api.post("/pools/x", json={}), api.post("/pools", json={}), api.delete("/pools")):
        assert response.status_code == 405


def test_delete_is_a_204_and_refused_with_409_while_in_use(api):
    put(api, "t/leaf")
    response = api.delete("/pools/t")
    assert (response.status_code, error_code(response)) == (409, "conflict")
    assert "child pools" in response.json()["error"]["message"]
    job = submit(api, pool="t/leaf")
    response = api.delete("/pools/t/leaf")
    assert (response.status_code, error_code(response)) == (409, "conflict")
    assert "unfinished" in response.json()["error"]["message"]
    assert api.post(f"/jobs/{job['id']}/cancel").status_code == 200
    response = api.delete("/pools/t/leaf")
    assert (response.status_code, response.content) == (204, b"")
    assert api.delete("/pools/t").status_code == 204
    response = api.delete("/pools/default")
    assert (response.status_code, error_code(response)) == (409, "conflict")


def test_submit_to_an_unknown_pool_creates_it_and_the_job_says_so(api):
    job = submit(api, pool="team/x")
    assert job["reason"]["code"] == "queued"
    assert job["reason"]["message"].endswith("; pool 'team/x' created with defaults")
    events = api.get(f"/jobs/{job['id']}/events").json()["items"]
    assert events[0]["reason"] == job["reason"]
    created = api.get("/pools/team/x").json()
    assert (created["explicit"], created["settings"]["weight"], created["jobs"]) == (True, None, 1)
    batch = api.post("/jobs/batch", json={"jobs": [{"command": "true", "pool": "b/c"}] * 3}).json()["items"]
    assert all(item["reason"]["message"].endswith("pool 'b/c' created with defaults") for item in batch)


def test_usage_and_demand_are_the_subtrees(api):
    register(api, gpus=1, vram_mb=1000)  # only the 1-GPU job fits
    running = submit(api, pool="t/a", resources={"gpus": 1, "cpus": 2})
    submit(api, pool="t/b", resources={"gpus": 3})
    submit(api, pool="t/b", gang_size=2, resources={"gpus": 2, "memory_mb": 5})
    assert claim(api)["id"] == running["id"]
    pools = {item["path"]: item for item in api.get("/pools").json()["items"]}
    assert (pools["t/a"]["usage"]["gpus"], pools["t/a"]["usage"]["cpus"], pools["t/a"]["jobs"]) == (1, 2, 1)
    assert (pools["t/b"]["usage"]["gpus"], pools["t/b"]["demand"]["gpus"], pools["t/b"]["jobs"]) == (0, 7, 3)
    assert pools["t/b"]["demand"]["memory_mb"] == 10
    assert (pools["t"]["usage"]["gpus"], pools["t"]["demand"]["gpus"], pools["t"]["jobs"]) == (1, 7, 4)
    assert pools["default"]["jobs"] == 0


def test_a_job_whose_pool_lost_its_row_is_listed_under_its_nearest_ancestor(api, server):
    put(api, "org", {"kind": "sensitive"})
    submit(api, pool="org/gone/deep", resources={"gpus": 2})
    store = server.app.state.corral.store
    with store._transaction() as tx:  # a delete that raced the submit: the job outlives its rows
        tx.execute("DELETE FROM pools WHERE path IN ('org/gone', 'org/gone/deep')")
    pools = {item["path"]: item for item in api.get("/pools").json()["items"]}
    orphan = pools["org/gone/deep"]
    assert (orphan["parent"], orphan["explicit"], orphan["kind"], orphan["jobs"]) == (
        "org",
        False,
        "sensitive",
        1,
    )
    assert pools["org"]["demand"]["gpus"] == 2
