"""``GET /jobs/{id}/why`` answers by the rule every claim applies: what it says fits, a claim takes."""

from __future__ import annotations

from tests.api.conftest import claim, register
from tests.helpers import submit_gang


def test_why_does_not_say_fits_now_for_room_held_for_a_waiting_gang(api, server, clock):
    """A gang of two waits at the head of the queue, holding the worker's free GPU for itself.
    A single job without a walltime may not backfill it: every claim refuses it, so ``why`` must
    not say ``fits_now`` (it did), but name the hold."""
    register(api, "w0", gpus=2, vram_mb=1000)
    api.post("/jobs", json={"command": "x", "resources": {"gpus": 1}}).raise_for_status()
    claim(api, "w0")
    clock.advance(1)
    gang = submit_gang(api, 2)
    server.run_loop("admission")
    clock.advance(1)
    waiting = api.post("/jobs", json={"command": "y", "resources": {"gpus": 1}}).json()
    assert api.get("/jobs/next", params={"worker_id": "w0"}).status_code == 204
    reasons = api.get(f"/jobs/{waiting['id']}/why").json()["reasons"]
    assert reasons[0]["code"] == "held_for_gang", reasons
    assert gang["gang_id"] in reasons[0]["message"]
    assert "nothing may backfill" in reasons[0]["message"], "the running job declared no walltime"


def test_why_says_fits_now_for_a_job_that_may_backfill_the_hold(api, server, clock):
    register(api, "w0", gpus=2, vram_mb=1000)
    api.post("/jobs", json={"command": "x", "resources": {"gpus": 1}, "walltime_s": 600}).raise_for_status()
    claim(api, "w0")
    clock.advance(1)
    submit_gang(api, 2)
    server.run_loop("admission")
    short = api.post("/jobs", json={"command": "y", "resources": {"gpus": 1}, "walltime_s": 60}).json()
    assert api.get(f"/jobs/{short['id']}/why").json()["reasons"][0]["code"] == "fits_now"
    assert claim(api, "w0")["id"] == short["id"], "and a claim takes it"
