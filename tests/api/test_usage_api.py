"""``GET /usage`` (API.md "Usage") over real HTTP, on SQLite and PostgreSQL: GPU- and CPU-seconds
of the attempts that held resources in a window (the last 7 days unless asked), per user, pool or
both; a user sees their own rows only, an admin everyone's; rows outlive job retention and go
after ``CORRAL_USAGE_RETENTION_DAYS``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.config import ServerSettings
from corral.domain.clock import to_rfc3339
from corral.store import open_store
from corral.testing.server import ServerThread
from tests.api.conftest import error_code, register, submit

DAY = 86400.0
TOKENS = {
    "admin": "tok-usage-admin",
    "alice": "tok-usage-alice",
    "bob": "tok-usage-bob",
    "w1": "tok-usage-w1",
}


def run(api, clock, seconds: float, worker_id: str = "w1", headers=None, done: bool = True) -> dict:
    """Claim the next job, let it run ``seconds``, and report it done (else failed)."""
    claimed = api.get("/jobs/next", params={"worker_id": worker_id}, headers=headers)
    assert claimed.status_code == 200, claimed.text
    job = claimed.json()
    clock.advance(seconds)
    params = {"worker_id": worker_id, "attempt": job["attempt"]}
    if done:
        api.post(f"/jobs/{job['id']}/done", params=params, headers=headers).raise_for_status()
    else:
        api.post(
            f"/jobs/{job['id']}/fail", params=params, json={"exit_code": 1}, headers=headers
        ).raise_for_status()
    return job


def test_usage_by_pool_counts_every_attempt_that_held_gpus(api, clock):
    register(api, gpus=4, vram_mb=1000)
    first = submit(api, pool="team/a", resources={"gpus": 2, "cpus": 1}, max_retries=2)
    clock.advance(5)
    run(api, clock, 100, done=False)  # a failed attempt used the GPUs too
    run(api, clock, 50)
    submit(api, pool="team/b", resources={"gpus": 1})
    run(api, clock, 10)
    response = api.get("/usage", params={"by": "pool"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["until"] == to_rfc3339(clock.now())
    assert body["since"] == to_rfc3339(clock.now() - 7 * DAY)
    assert body["items"] == [
        {
            "user": None, "pool": "team/a", "gpu_seconds": 300.0, "cpu_seconds": 150.0,
            "attempts": 2, "jobs": 1, "wait_s": {"p50": 5.0, "p90": 5.0},
        },
        {
            "user": None, "pool": "team/b", "gpu_seconds": 10.0, "cpu_seconds": 0.0,
            "attempts": 1, "jobs": 1, "wait_s": {"p50": 0.0, "p90": 0.0},
        },
    ]  # fmt: skip
    assert first["id"]


def test_a_window_clips_the_attempts_to_it(api, clock):
    register(api, gpus=1, vram_mb=1000)
    submit(api, resources={"gpus": 1})
    started = clock.now()
    run(api, clock, 1000)
    window = {"since": to_rfc3339(started + 400), "until": to_rfc3339(started + 700), "by": "user"}
    (item,) = api.get("/usage", params=window).json()["items"]
    assert (item["pool"], item["gpu_seconds"], item["attempts"]) == (None, 300.0, 1)
    later = {"since": to_rfc3339(started + 2000), "until": to_rfc3339(started + 3000)}
    assert api.get("/usage", params=later).json()["items"] == []


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"by": "worker"}, "by"),
        ({"since": "last tuesday"}, "since"),
        ({"until": "2026-13-01T00:00:00Z"}, "until"),
        ({"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "since"),
    ],
)
def test_bad_parameters_are_400(api, params, field):
    response = api.get("/usage", params=params)
    assert response.status_code == 400
    assert error_code(response) == "invalid_request"
    assert response.json()["error"]["message"].startswith(field)


def test_usage_outlives_job_retention_and_has_its_own(api, server, clock, settings):
    settings.retention_days = 14
    settings.usage_retention_days = 30
    register(api, gpus=1, vram_mb=1000)
    job = submit(api, resources={"gpus": 1})
    run(api, clock, 60)
    clock.advance(15 * DAY)
    server.run_loop("retention")
    assert api.get(f"/jobs/{job['id']}").status_code == 404
    since = {"since": to_rfc3339(clock.now() - 20 * DAY)}
    (item,) = api.get("/usage", params=since).json()["items"]
    assert item["gpu_seconds"] == 60.0, "job retention removed the job, not its usage"
    clock.advance(16 * DAY)
    server.run_loop("retention")
    assert api.get("/usage", params={"since": to_rfc3339(clock.now() - 40 * DAY)}).json()["items"] == []


# --- roles ------------------------------------------------------------------------------------


@pytest.fixture
def secured(store_url: str, clock, tmp_path: Path) -> Iterator[ServerThread]:
    token_file = tmp_path / "tokens"
    token_file.write_text(
        f"{TOKENS['admin']} admin root\n{TOKENS['alice']} user alice\n"
        f"{TOKENS['bob']} user bob\n{TOKENS['w1']} worker w1\n"
    )
    store = open_store(store_url)
    with ServerThread(store, ServerSettings(auth_tokens=str(token_file)), clock) as running:
        yield running
    store.close()


def as_(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name]}"}


def test_a_user_sees_their_own_rows_and_an_admin_everyones(secured, clock):
    with httpx.Client(base_url=secured.url, timeout=10) as http:
        body = {"id": "w1", "address": "127.0.0.1", "resources": {"cpus": 8, "gpus": 2, "vram_mb": 1000}}
        assert http.post("/workers/register", json=body, headers=as_("w1")).status_code == 201
        for user, seconds in (("alice", 30), ("bob", 70)):
            submitted = http.post(
                "/jobs", json={"command": "true", "resources": {"gpus": 1}}, headers=as_(user)
            )
            assert submitted.status_code == 201, submitted.text
            run(http, clock, seconds, headers=as_("w1"))

        def seen(caller: str, **params: str) -> list[tuple[str, float]]:
            response = http.get("/usage", params=params, headers=as_(caller))
            assert response.status_code == 200, response.text
            return [(item["user"], item["gpu_seconds"]) for item in response.json()["items"]]

        assert seen("admin", by="user") == [("alice", 30.0), ("bob", 70.0)]
        assert seen("admin", by="user", user="bob") == [("bob", 70.0)]
        assert seen("alice", by="user") == [("alice", 30.0)]
        assert seen("bob", by="user,pool") == [("bob", 70.0)]
        assert seen("alice", by="user", user="bob") == [("alice", 30.0)], "a user cannot ask for another's"
        assert http.get("/usage", headers=as_("w1")).status_code == 403


# --- the dashboard ----------------------------------------------------------------------------


def gpu_hours_table(html: str) -> list[tuple[str, str]]:
    table = html.split('data-testid="gpu-hours"', 1)[1].split("</table>", 1)[0]
    return re.findall(r'<th scope="row"><a [^>]*>([^<]+)</a></th><td>([^<]+)</td>', table)


def test_the_overview_shows_gpu_hours_by_pool_for_the_last_week(api, clock):
    register(api, gpus=4, vram_mb=1000)
    assert "No attempt has ended in the last 7 days." in api.get("/").text
    submit(api, pool="old", resources={"gpus": 4})
    run(api, clock, 3600)
    clock.advance(8 * DAY)
    submit(api, pool="team/a", resources={"gpus": 2})
    run(api, clock, 1800)
    submit(api, pool="team/b", resources={"gpus": 3})
    run(api, clock, 3600)
    assert gpu_hours_table(api.get("/").text) == [("team/b", "3.00"), ("team/a", "1.00")]
    assert 'data-testid="gpu-hours"' in api.get("/", params={"partial": "1"}).text


def test_a_users_overview_shows_their_own_gpu_hours(secured, clock):
    with httpx.Client(base_url=secured.url, timeout=10) as http:
        body = {"id": "w1", "address": "127.0.0.1", "resources": {"cpus": 8, "gpus": 2, "vram_mb": 1000}}
        assert http.post("/workers/register", json=body, headers=as_("w1")).status_code == 201
        for user, pool in (("alice", "a"), ("bob", "b")):
            job = {"command": "true", "pool": pool, "resources": {"gpus": 1}}
            assert http.post("/jobs", json=job, headers=as_(user)).status_code == 201
            run(http, clock, 3600, headers=as_("w1"))
        assert gpu_hours_table(http.get("/", headers=as_("admin")).text) == [("a", "1.00"), ("b", "1.00")]
        mine = http.get("/", headers=as_("bob")).text
        assert gpu_hours_table(mine) == [("b", "1.00")]
        assert "Your GPU-hours by pool" in mine
