"""Reservations through real HTTP (API.md "Time limits and reservations"): a blocked gang gets an
``estimated_start_at`` at the limit of the work in its way, short work backfills its room, work
without a walltime does not and ``why`` says so; the metrics count both."""

from __future__ import annotations

from tests.api.conftest import claim, register, submit
from tests.helpers import submit_gang


def metric(api, name: str) -> float:
    for line in api.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exposed")


def test_a_blocked_gang_is_planned_at_the_limit_and_short_work_backfills_its_room(api, server, clock):
    register(api, "w1", gpus=2, vram_mb=1000)
    register(api, "w2", gpus=2, vram_mb=1000)
    limited = submit(api, resources={"gpus": 2}, walltime_s=30)
    assert claim(api, "w1")["id"] == limited["id"]
    running = api.get(f"/jobs/{limited['id']}").json()
    clock.advance(1)
    gang = submit_gang(api, 2, resources={"gpus": 2})
    server.run_loop("admission")

    task = api.get(f"/jobs/{gang['tasks'][0]}").json()
    assert task["status"] == "blocked"
    assert task["estimated_start_at"] == running["deadline_at"]
    assert task["planned_workers"] == ["w1", "w2"]
    listed = api.get("/jobs", params={"gang_id": gang["gang_id"]}).json()["items"]
    assert {item["estimated_start_at"] for item in listed} == {running["deadline_at"]}
    why = api.get(f"/jobs/{gang['tasks'][1]}/why").json()["reasons"]
    assert why[0]["code"] == "reserved_for_later", why
    assert limited["id"] in why[0]["message"] and "w1, w2" in why[0]["message"]
    assert metric(api, "corral_backfill_reservations") == 1

    endless = submit(api, resources={"gpus": 1})
    short = submit(api, resources={"gpus": 1}, walltime_s=5)
    assert claim(api, "w2")["id"] == short["id"], "the short job ends before the gang starts"
    assert api.get("/jobs/next", params={"worker_id": "w2"}).status_code == 204
    why = api.get(f"/jobs/{endless['id']}/why").json()["reasons"]
    assert why[0]["code"] == "backfill_refused", why
    assert gang["gang_id"] in why[0]["message"]
    assert metric(api, "corral_backfill_started_total") == 1
    assert api.get(f"/jobs/{short['id']}").json()["estimated_start_at"] is None, "it runs"


def test_a_gang_behind_work_without_a_deadline_has_no_estimated_start(api, server, clock):
    register(api, "w1", gpus=2, vram_mb=1000)
    register(api, "w2", gpus=2, vram_mb=1000)
    submit(api, resources={"gpus": 2})
    claim(api, "w1")
    gang = submit_gang(api, 2, resources={"gpus": 2})
    server.run_loop("admission")
    task = api.get(f"/jobs/{gang['tasks'][0]}").json()
    assert task["estimated_start_at"] is None
    assert task["planned_workers"] == []
    assert metric(api, "corral_backfill_reservations") == 0
