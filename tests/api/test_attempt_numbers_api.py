"""Counted attempts and the run number (issue 12): the job object shows both, and the events, the
claim and ``CORRAL_ATTEMPT`` agree on the run; the events say what ``max_retries`` means."""

from __future__ import annotations

from tests.api.conftest import claim, register, submit


def test_after_a_refund_the_job_shows_counted_attempts_and_the_run(api):
    register(api)
    job = submit(api, max_retries=0)
    first = claim(api)
    params = {"worker_id": "w1", "attempt": first["attempt"]}
    released = api.post(f"/jobs/{job['id']}/fail", params=params, json={"exit_code": None, "release": True})
    assert released.json()["status"] == "pending"
    second = claim(api)
    assert (second["attempt"], second["env"]["CORRAL_ATTEMPT"]) == (2, "2")
    shown = api.get(f"/jobs/{job['id']}").json()
    assert (shown["attempts"], shown["attempt"]) == (1, 2)
    assert [event["attempt"] for event in api.get(f"/jobs/{job['id']}/events").json()["items"]][-1] == 2
    params["attempt"] = 2
    failed = api.post(f"/jobs/{job['id']}/fail", params=params, json={"exit_code": 1}).json()
    assert failed["status"] == "failed", "max_retries 0 means one counted attempt"
    assert failed["reason"]["message"] == "counted attempt 1 of 1 (run 2) exited with code 1"
