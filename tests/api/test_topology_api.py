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
