"""The job protocol over real HTTP: claim, heartbeat, done, fail, preempted, and fencing."""

from __future__ import annotations

import threading
import time

import pytest

from corral.config import ServerSettings
from corral.protocol.answers import CheckpointSaved, ClaimAnswer, HeartbeatAnswer, JobAnswer
from corral.server.routes import protocol as protocol_routes
from tests.api.conftest import claim, error_code, register, submit


def fenced(worker_id="w1", attempt=1, **extra):
    return {"worker_id": worker_id, "attempt": attempt, **extra}


def refusal(reported) -> tuple[int, str]:
    """A refused report's status and error code (from its own route or its item of a batch)."""
    return reported.status_code, reported.json()["error"]["code"]


def test_claim_answers_job_attempt_gpus_and_env(api, server):
    register(api, gpus=2, vram_mb=80000)
    job = submit(api, env={"SEED": "7"}, resources={"gpus": 1})
    claimed = claim(api)
    assert claimed["id"] == job["id"]
    assert (claimed["status"], claimed["attempt"], claimed["worker_id"]) == ("running", 1, "w1")
    assert claimed["gpu_indices"] == [0]
    assert claimed["env"] == {
        "SEED": "7",
        "CORRAL_JOB_ID": job["id"],
        "CORRAL_ATTEMPT": "1",
        "CORRAL_SERVER": server.url,
    }


@pytest.mark.parametrize("settings", [ServerSettings(heartbeat_timeout_s=12.5)])
def test_a_claim_says_the_lease_the_worker_must_renew(api, settings):
    """The worker's self-fence counts the lease down from the claim: single and ``max`` claims."""
    register(api, cpus=4)
    submit(api)
    submit(api)
    assert claim(api)["lease_s"] == 12.5
    several = api.get("/jobs/next", params={"worker_id": "w1", "max": 2})
    assert [item["lease_s"] for item in several.json()["items"]] == [12.5]
    assert ClaimAnswer.model_validate(several.json()["items"][0]).lease_s == 12.5


def test_claim_errors(api):
    assert api.get("/jobs/next").status_code == 400
    unknown = api.get("/jobs/next", params={"worker_id": "ghost"})
    assert unknown.status_code == 404
    assert error_code(unknown) == "not_found"
    register(api)
    assert api.get("/jobs/next", params={"worker_id": "w1"}).status_code == 204
    for wait in ("31", "-1", "soon"):
        response = api.get("/jobs/next", params={"worker_id": "w1", "wait": wait})
        assert response.status_code == 400, wait
        assert error_code(response) == "invalid_request"


def test_long_poll_wakes_on_submit(api, server, monkeypatch):
    # No store re-check within the poll's wait: only the submit's wake can answer it with a job
    # (without one the poll answers 204 when its 10 s are up).
    monkeypatch.setattr(protocol_routes, "RECHECK_S", 60.0)
    register(api)
    result = {}

    def poll():
        response = api.get("/jobs/next", params={"worker_id": "w1", "wait": 10})
        result["status"] = response.status_code

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.3)  # the poll is parked (were it not, it would claim at once: 200 all the same)
    submit(api)
    poller.join(timeout=15)
    assert result["status"] == 200


def test_long_poll_answers_204_at_its_deadline(api):
    register(api)
    response = api.get("/jobs/next", params={"worker_id": "w1", "wait": 0.3})
    assert response.status_code == 204


def test_heartbeat_done_and_their_conflicts(api, reporter):
    register(api)
    job = submit(api)
    claim(api)
    path = f"/jobs/{job['id']}"
    beat = api.post(f"{path}/heartbeat", params=fenced(), json={"progress": {"step": 3}, "gpu_util_pct": 50})
    assert (beat.status_code, beat.json()) == (200, {})
    assert api.get(path).json()["progress"] == {"step": 3}
    assert api.post(f"{path}/heartbeat", params=fenced()).status_code == 200  # empty body is fine
    assert refusal(reporter.done(job["id"], attempt=2)) == (409, "stale_attempt")
    assert refusal(reporter.done(job["id"], worker_id="w9")) == (409, "stale_attempt")
    done = reporter.done(job["id"])
    assert (done.status_code, done.json()["status"]) == (200, "done")
    assert refusal(reporter.done(job["id"])) == (409, "not_running")
    late_beat = api.post(f"{path}/heartbeat", params=fenced())
    assert (late_beat.status_code, error_code(late_beat)) == (409, "not_running")


@pytest.mark.parametrize("attempt", [2**31, 2**62, -(2**40)])
def test_a_done_of_an_attempt_no_job_has_is_a_stale_attempt(api, reporter, attempt):
    """An attempt the fence accepts (a 64-bit integer) but no job can be at (the column holds 32
    bits) is a stale attempt like any other, on both stores; the job keeps running. (A batch's
    item is checked as a whole first: a negative attempt there is not a valid item.)"""
    register(api)
    job = submit(api)
    claim(api)
    invalid_item = attempt < 0 and reporter.batched
    expected = (400, "invalid_request") if invalid_item else (409, "stale_attempt")
    assert refusal(reporter.done(job["id"], attempt=attempt)) == expected
    assert api.get(f"/jobs/{job['id']}").json()["status"] == "running"
    assert reporter.done(job["id"]).status_code == 200


@pytest.mark.parametrize(
    "params",
    [{}, {"worker_id": "w1"}, {"attempt": 1}, {"worker_id": "w1", "attempt": "one"}],
)
def test_reports_without_a_valid_fence_are_400(api, params):
    job = submit(api)
    for route in ("heartbeat", "done", "fail", "preempted"):
        response = api.post(f"/jobs/{job['id']}/{route}", params=params)
        assert response.status_code == 400, route
        assert error_code(response) == "invalid_request"


def test_reports_for_an_unknown_job_are_404(api, reporter):
    response = api.post("/jobs/j-missing/heartbeat", params=fenced())
    assert (response.status_code, error_code(response)) == (404, "not_found")
    assert refusal(reporter.done("j-missing")) == (404, "not_found")
    assert refusal(reporter.fail("j-missing")) == (404, "not_found")


@pytest.mark.parametrize("attempt", [None, "one", True])
def test_final_reports_without_a_valid_attempt_are_400(api, reporter, attempt):
    """The fence's attempt, in the query of a single route or in the item of a batch."""
    register(api)
    job = submit(api)
    claim(api)
    assert refusal(reporter.done(job["id"], attempt=attempt)) == (400, "invalid_request")
    assert refusal(reporter.fail(job["id"], attempt=attempt)) == (400, "invalid_request")
    assert api.get(f"/jobs/{job['id']}").json()["status"] == "running"


def test_fail_retries_then_fails_with_exit_code_and_tail(api, reporter):
    register(api)
    job = submit(api, max_retries=2)
    path = f"/jobs/{job['id']}"
    claim(api)
    first = reporter.fail(job["id"], body={"exit_code": 3, "error": "exit 3", "output_tail": "boom"})
    assert first.json()["status"] == "pending"
    assert first.json()["reason"]["code"] == "retrying"
    assert claim(api)["attempt"] == 2
    assert refusal(reporter.fail(job["id"], attempt=1, body={"exit_code": 3})) == (409, "stale_attempt")
    second = reporter.fail(job["id"], attempt=2, body={"exit_code": 3, "output_tail": "boom"})
    failed = second.json()
    assert (failed["status"], failed["exit_code"], failed["output_tail"]) == ("failed", 3, "boom")
    bad = reporter.fail(job["id"], attempt=2, body={"exit_code": "three"})
    assert refusal(bad) == (400, "invalid_request")
    assert api.get(path).json()["attempts"] == 2


def test_cancel_running_goes_through_the_worker(api):
    register(api)
    job = submit(api)
    claim(api)
    path = f"/jobs/{job['id']}"
    stopping = api.post(f"{path}/cancel").json()
    assert (stopping["status"], stopping["preemption_epoch"]) == ("preempting", 1)
    beat = api.post(f"{path}/heartbeat", params=fenced())
    assert beat.json() == {"action": "preempt", "preemption_epoch": 1}
    missing_epoch = api.post(f"{path}/preempted", params=fenced())
    assert missing_epoch.status_code == 400
    wrong_epoch = api.post(f"{path}/preempted", params=fenced(epoch=2))
    assert (wrong_epoch.status_code, error_code(wrong_epoch)) == (409, "stale_epoch")
    acked = api.post(f"{path}/preempted", params=fenced(epoch=1))
    assert (acked.status_code, acked.json()["status"]) == (200, "cancelled")
    again = api.post(f"{path}/preempted", params=fenced(epoch=1))
    assert (again.status_code, error_code(again)) == (409, "not_preempting")
    events = [event["to"] for event in api.get(f"{path}/events").json()["items"]]
    assert events == ["pending", "running", "preempting", "cancelled"]


def test_reaper_requeues_an_expired_lease_and_fences_the_old_worker(api, server, clock, reporter):
    register(api)
    register(api, "w2")
    job = submit(api)
    claim(api, "w1")
    clock.advance(31)
    server.reap()
    requeued = api.get(f"/jobs/{job['id']}").json()
    assert (requeued["status"], requeued["reason"]["code"]) == ("pending", "lease_expired")
    assert claim(api, "w2")["attempt"] == 2
    assert refusal(reporter.done(job["id"], "w1", 1)) == (409, "stale_attempt")
    assert refusal(reporter.fail(job["id"], "w1", 1, {"exit_code": 1})) == (409, "stale_attempt")
    assert api.get(f"/jobs/{job['id']}").json()["status"] == "running"


def test_release_hands_a_job_back_and_malformed_release_is_400(api, reporter):
    register(api)
    job = submit(api, max_retries=1)
    claim(api)
    assert refusal(reporter.fail(job["id"], body={"release": "maybe"})) == (400, "invalid_request")
    released = reporter.fail(job["id"], body={"exit_code": 143, "release": True})
    assert (released.json()["status"], released.json()["attempts"]) == ("pending", 0)


def test_every_answer_of_the_job_protocol_holds_to_its_model(api):
    """The server does not check these on the hot path (the worker's SDK does); this test does."""
    register(api)
    submitted = submit(api, env={"A": "1"}, walltime_s=60)
    claimed = ClaimAnswer.model_validate(claim(api))
    fence = {"worker_id": "w1", "attempt": claimed.attempt}
    path = f"/jobs/{submitted['id']}"
    HeartbeatAnswer.model_validate(api.post(f"{path}/heartbeat", params=fence, json={}).json())
    CheckpointSaved.model_validate(api.post(f"{path}/checkpoint", params=fence, content=b"state").json())
    api.post(f"{path}/cancel").raise_for_status()
    stop = HeartbeatAnswer.model_validate(api.post(f"{path}/heartbeat", params=fence, json={}).json())
    assert stop.action == "preempt"
    acked = api.post(f"{path}/preempted", params={**fence, "epoch": stop.preemption_epoch})
    assert JobAnswer.model_validate(acked.json()).status == "cancelled"
    second = submit(api)
    claim(api)
    done = api.post(f"/jobs/{second['id']}/done", params={"worker_id": "w1", "attempt": 1})
    assert JobAnswer.model_validate(done.json()).status == "done"
    third = submit(api, max_retries=1)
    claim(api)
    failed = api.post(
        f"/jobs/{third['id']}/fail", params={"worker_id": "w1", "attempt": 1}, json={"exit_code": 2}
    )
    assert JobAnswer.model_validate(failed.json()).status == "failed"
    fourth = submit(api)
    claim(api)
    tripped = api.post(
        f"/jobs/{fourth['id']}/watchdog", params={"worker_id": "w1", "attempt": 1}, json={"kind": "budget"}
    )
    assert JobAnswer.model_validate(tripped.json()).status == "pending"
