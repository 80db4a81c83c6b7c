"""The server's side of a contained job (API.md "A job is contained on its host"): ``workdir`` is
kept and handed to the worker; a failure ``reason`` the host would meet again fails the job at once,
``oom_killed`` is retried like any failure, and the job's reason names the code."""

from __future__ import annotations

import pytest

from tests.api.conftest import claim, register, submit


def fail(api, job, **body):
    response = api.post(
        f"/jobs/{job['id']}/fail",
        params={"worker_id": job["worker_id"], "attempt": job["attempt"]},
        json=body,
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_the_workdir_is_kept_and_claimed(api):
    register(api)
    job = submit(api, workdir="/home/alice/project")
    assert api.get(f"/jobs/{job['id']}").json()["workdir"] == "/home/alice/project"
    assert claim(api)["workdir"] == "/home/alice/project"
    assert submit(api)["workdir"] is None


@pytest.mark.parametrize("workdir", ["relative/dir", "", 7])
def test_a_workdir_that_is_no_absolute_path_is_refused(api, workdir):
    response = api.post("/jobs", json={"command": "true", "workdir": workdir})
    assert response.status_code == 400
    assert "workdir" in response.json()["error"]["message"]


@pytest.mark.parametrize("code", ["no_such_account", "workdir_unavailable", "walltime_exceeded"])
def test_a_failure_another_attempt_would_meet_again_is_not_retried(api, code):
    register(api)
    submit(api, max_retries=5)
    job = fail(api, claim(api), error="no such thing", reason=code)
    assert job["status"] == "failed"
    assert job["reason"]["code"] == code
    assert job["attempts"] == 1


def test_an_oom_kill_is_retried_like_any_failure(api):
    register(api)
    submit(api, max_retries=2)
    job = fail(api, claim(api), exit_code=137, reason="oom_killed")
    assert (job["status"], job["reason"]["code"]) == ("pending", "oom_killed")
    job = fail(api, claim(api), exit_code=137, reason="oom_killed")
    assert (job["status"], job["reason"]["code"]) == ("failed", "oom_killed")


def test_an_unknown_reason_is_refused(api):
    register(api)
    submit(api)
    running = claim(api)
    response = api.post(
        f"/jobs/{running['id']}/fail",
        params={"worker_id": "w1", "attempt": running["attempt"]},
        json={"reason": "bored"},
    )
    assert response.status_code == 400
