"""Topology over real HTTP (API.md "Topology"): a job or gang body's ``topology`` is validated
against CORRAL_TOPOLOGY_LEVELS, stored, and returned on the job object."""

from __future__ import annotations

import pytest

from corral.config import ServerSettings
from tests.api.conftest import error_code, submit
from tests.helpers import corral


@pytest.fixture
def settings() -> ServerSettings:
    return ServerSettings(topology_levels="topology.block,topology.rack")


def test_a_gangs_topology_is_stored_and_returned_on_each_task(api):
    created = submit(api, gang_size=2, topology={"required": "topology.rack"})
    for task_id in created["tasks"]:
        job = api.get(f"/jobs/{task_id}").json()
        assert job["topology"] == {"required": "topology.rack"}
    single = submit(api, topology={"preferred": "topology.block"})
    assert single["topology"] == {"preferred": "topology.block"}
    assert submit(api)["topology"] is None


def test_an_unknown_level_is_400_naming_the_field(api):
    refused = api.post("/jobs", json={"command": "true", "topology": {"required": "topology.row"}})
    assert refused.status_code == 400, refused.text
    assert error_code(refused) == "invalid_request"
    error = refused.json()["error"]
    assert "topology" in error["message"] and "topology.row" in error["message"]
    batch = api.post(
        "/jobs/batch",
        json={"jobs": [{"command": "true"}, {"command": "true", "topology": {"preferred": "rack"}}]},
    )
    assert batch.status_code == 400 and "topology" in batch.json()["error"]["message"]


@pytest.mark.parametrize(
    "topology",
    [{}, {"required": "topology.rack", "preferred": "topology.block"}, {"wanted": "topology.rack"}],
)
def test_a_topology_with_not_exactly_one_of_required_and_preferred_is_400(api, topology):
    refused = api.post("/jobs", json={"command": "true", "topology": topology})
    assert refused.status_code == 400, refused.text
    assert "topology" in refused.text


def test_the_cli_flags_send_the_topology_and_an_unknown_level_exits_1(server, api, capsys):
    code, out, err = corral(
        server, capsys, "submit", "--gang-size", "2", "--topology-required", "topology.rack", "--", "true"
    )
    assert code == 0, err
    gang_id = out.strip()
    tasks = api.get(f"/gangs/{gang_id}").json()["tasks"]
    assert all(task["topology"] == {"required": "topology.rack"} for task in tasks)
    code, out, err = corral(server, capsys, "submit", "--topology-preferred", "topology.block", "--", "true")
    assert code == 0, err
    assert api.get(f"/jobs/{out.strip()}").json()["topology"] == {"preferred": "topology.block"}
    code, out, err = corral(server, capsys, "submit", "--topology-required", "row", "--", "true")
    assert (code, out) == (1, "")
    assert err.startswith("corral: invalid_request: ") and "topology" in err


def test_corral_workers_groups_by_topology(server, api, capsys):
    for worker_id, rack in (("w1", "r2"), ("w2", "r1"), ("w3", "r2")):
        body = {
            "id": worker_id,
            "address": "127.0.0.1",
            "resources": {"gpus": 8, "cpus": 8, "memory_mb": 8192},
            "labels": {"topology.block": "b1", "topology.rack": rack},
        }
        assert api.post("/workers/register", json=body).status_code == 201
    assert api.get("/workers").json()["topology_levels"] == ["topology.block", "topology.rack"]
    code, out, err = corral(server, capsys, "workers")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["TOPOLOGY", "ID"]
    assert [line.split()[:2] for line in lines[1:]] == [["b1/r1", "w2"], ["b1/r2", "w1"], ["b1/r2", "w3"]]


def test_corral_workers_without_topology_labels_has_no_topology_column(server, api, capsys):
    body = {"id": "w1", "address": "127.0.0.1", "resources": {"cpus": 8, "memory_mb": 8192}}
    assert api.post("/workers/register", json=body).status_code == 201
    code, out, err = corral(server, capsys, "workers")
    assert code == 0, err
    assert out.splitlines()[0].split()[0] == "ID"


def test_the_dashboard_groups_workers_by_topology(api):
    for worker_id, rack in (("w1", "r2"), ("w2", "r1")):
        body = {
            "id": worker_id,
            "address": "127.0.0.1",
            "resources": {"gpus": 1, "cpus": 8, "memory_mb": 8192},
            "labels": {"topology.block": "b1", "topology.rack": rack},
        }
        assert api.post("/workers/register", json=body).status_code == 201
    page = api.get("/ui/workers").text
    assert "topology b1/r1" in page and "topology b1/r2" in page
    assert page.index("topology b1/r1") < page.index("topology b1/r2")  # w2 (r1) before w1 (r2)
