"""Time limits over real HTTP, on SQLite and PostgreSQL (API.md "Time limits"): a pool's default and
maximum ``walltime_s``, inherited down the tree from the server's, and the job's ``deadline_at``."""

from __future__ import annotations

from datetime import datetime

import pytest

from corral.config import ServerSettings
from corral.protocol.answers import JobAnswer
from tests.api.conftest import claim, error_code, register, submit


@pytest.fixture
def settings() -> ServerSettings:
    return ServerSettings(default_walltime_s=3600, max_walltime_s=86400)


def _time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def put(api, path, body):
    response = api.put(f"/pools/{path}", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_job_without_a_walltime_gets_the_servers_then_its_pools_default(api):
    assert submit(api)["walltime_s"] == 3600.0
    assert submit(api, walltime_s=10)["walltime_s"] == 10.0
    stored = put(api, "team", {"default_walltime_s": 600, "max_walltime_s": 7200})
    assert (stored["default_walltime_s"], stored["max_walltime_s"]) == (600.0, 7200.0)
    assert stored["settings"]["default_walltime_s"] == 600.0
    assert submit(api, pool="team/short")["walltime_s"] == 600.0, "inherited down the tree"
    listed = {pool["path"]: pool for pool in api.get("/pools").json()["items"]}
    assert (listed["team/short"]["default_walltime_s"], listed["team/short"]["max_walltime_s"]) == (
        600.0,
        7200.0,
    )
    assert (listed["default"]["default_walltime_s"], listed["default"]["max_walltime_s"]) == (3600.0, 86400.0)


def test_a_walltime_above_the_maximum_is_400_naming_walltime_s(api):
    put(api, "team", {"max_walltime_s": 7200})
    refused = api.post("/jobs", json={"command": "true", "pool": "team/x", "walltime_s": 7201})
    assert refused.status_code == 400, refused.text
    assert error_code(refused) == "invalid_request"
    assert refused.json()["error"]["message"].startswith("walltime_s")
    assert submit(api, pool="team/x", walltime_s=7200)["walltime_s"] == 7200.0
    above_server = api.post("/jobs", json={"command": "true", "walltime_s": 86401})
    assert above_server.status_code == 400 and "walltime_s" in above_server.json()["error"]["message"]
    batch = api.post(
        "/jobs/batch",
        json={
            "jobs": [
                {"command": "true", "pool": "team"},
                {"command": "true", "pool": "team", "walltime_s": 9e3},
            ]
        },
    )
    assert batch.status_code == 400
    assert "jobs.1.walltime_s" in batch.json()["error"]["message"]
    assert api.get("/jobs").json()["items"] and len(api.get("/jobs").json()["items"]) == 1, (
        "none of the batch"
    )


def test_a_pool_default_above_its_own_maximum_is_refused(api):
    response = api.put("/pools/team", json={"default_walltime_s": 100, "max_walltime_s": 50})
    assert response.status_code == 400
    assert "max_walltime_s" in response.json()["error"]["message"]


def test_deadline_at_is_start_plus_the_limit_while_the_job_runs(api):
    register(api)
    job = submit(api, walltime_s=120)
    assert job["deadline_at"] is None
    running = claim(api)
    JobAnswer.model_validate(running)
    assert _time(running["deadline_at"]) == pytest.approx(_time(running["started_at"]) + 120, abs=0.002)
    shown = api.get(f"/jobs/{job['id']}").json()
    assert shown["deadline_at"] == running["deadline_at"]
    done = api.post(f"/jobs/{job['id']}/done", params={"worker_id": "w1", "attempt": running["attempt"]})
    assert done.status_code == 200, done.text
    assert api.get(f"/jobs/{job['id']}").json()["deadline_at"] is None
