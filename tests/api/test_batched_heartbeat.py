"""A worker heartbeat carrying its jobs' leases (issue 13, point 2): one request and one transaction
for every running job of a host, each job answered as its own ``POST /jobs/{id}/heartbeat`` would be."""

from __future__ import annotations

from .conftest import claim, error_code, register, submit


def test_a_worker_heartbeat_renews_its_jobs_and_answers_each(api, server, clock):
    register(api, "w1", cpus=8)
    register(api, "w2", cpus=8)
    first, second, stopping = (submit(api, resources={"cpus": 1}) for _ in range(3))
    for _ in range(3):
        claim(api, "w1")
    submit(api, resources={"cpus": 1})
    elsewhere = claim(api, "w2")
    stopped = api.post(f"/jobs/{stopping['id']}/cancel").json()
    assert stopped["status"] == "preempting"
    clock.advance(20)
    beat = api.post(
        "/workers/w1/heartbeat",
        json={
            "running": [first["id"], second["id"], stopping["id"]],
            "jobs": [
                {"id": first["id"], "attempt": 1, "progress": {"step": 7}, "gpu_util_pct": 90},
                {"id": second["id"], "attempt": 1},
                {"id": stopping["id"], "attempt": 1},
                {"id": elsewhere["id"], "attempt": 1},
                {"id": "j-unknown", "attempt": 1},
            ],
        },
    )
    assert beat.status_code == 200, beat.text
    answers = beat.json()["jobs"]
    assert answers[first["id"]] == {} and answers[second["id"]] == {}
    assert answers[stopping["id"]] == {"action": "preempt", "preemption_epoch": stopped["preemption_epoch"]}
    assert answers[elsewhere["id"]]["error"]["code"] == "stale_attempt"
    assert answers["j-unknown"]["error"]["code"] == "not_found"
    renewed = api.get(f"/jobs/{first['id']}").json()
    assert renewed["progress"] == {"step": 7}
    # The leases were renewed 20 s in: 20 s more is 40 s since the claim, but 20 since the beat.
    clock.advance(20)
    server.reap()
    assert api.get(f"/jobs/{first['id']}").json()["status"] == "running"
    assert api.get(f"/jobs/{second['id']}").json()["status"] == "running"
    assert api.get(f"/jobs/{elsewhere['id']}").json()["status"] == "pending"  # w2 never beat: reaped


def test_a_worker_heartbeat_without_jobs_answers_as_before(api):
    register(api, "w1")
    assert api.post("/workers/w1/heartbeat", json={}).json() == {}
    bad = api.post("/workers/w1/heartbeat", json={"jobs": [{"id": "j-1"}]})
    assert (bad.status_code, error_code(bad)) == (400, "invalid_request")


def test_a_job_being_stopped_is_answered_in_the_batch_as_by_its_own_heartbeat(api, server, clock, settings):
    """The batch reads back a running job's status alone (issue 13): a job in its checkpoint phase
    still gets its deadline, its extension, its deferral and the phase's end, a job that ended its
    refusal, beside a running job's empty answer."""
    settings.checkpoint_timeout_s = 10
    settings.max_deferral_s = 5
    register(api, "w1", gpus=3, vram_mb=1000)
    low = submit(api, resources={"gpus": 1}, preemption_class=2, checkpoint="manual")
    kept, finished = (submit(api, resources={"gpus": 1}, preemption_class=9) for _ in range(2))
    for _ in range(3):
        claim(api, "w1")
    fence = {"worker_id": "w1", "attempt": 1}
    api.post(f"/jobs/{finished['id']}/done", params=fence).raise_for_status()
    clock.advance(60)
    submit(api, resources={"gpus": 2}, preemption_class=7)
    server.run_loop("admission")
    assert api.get(f"/jobs/{low['id']}").json()["status"] == "preempting"

    def batch(**low_fields):
        jobs = [{"id": job["id"], "attempt": 1} for job in (low, kept, finished)]
        jobs[0].update(low_fields)
        response = api.post("/workers/w1/heartbeat", json={"jobs": jobs})
        assert response.status_code == 200, response.text
        answers = response.json()["jobs"]
        assert answers[kept["id"]] == {}
        assert answers[finished["id"]]["error"]["code"] == "not_running"
        return answers[low["id"]]

    assert batch() == {"action": "checkpoint", "preemption_epoch": 1, "deadline_s": 10}
    clock.advance(11)
    assert batch()["deadline_s"] == 4, "still beating at the deadline: one extension of 50%"
    assert batch(defer_s=30)["deadline_s"] == 5, "the job asked for more: 5 s at most in all"
    clock.advance(6)
    assert batch() == {"action": "preempt", "preemption_epoch": 1}
    assert api.get(f"/jobs/{low['id']}").json()["reason"]["code"] == "checkpoint_timed_out"
    assert "corral_preemption_failed_checkpoint_total 1.0" in api.get("/metrics").text


def test_a_lease_for_a_job_the_running_list_leaves_out_comes_after_its_judgement(api, clock, settings):
    """A heartbeat whose ``running`` leaves a silent job out, yet carries its lease: the job is
    judged gone first (its lease is not renewed with the worker's heartbeat), then its lease is
    refused, while a listed job's lease is renewed."""
    register(api, gpus=2, vram_mb=1000)
    left_out = submit(api, resources={"gpus": 1})
    listed = submit(api, resources={"gpus": 1})
    first, second = claim(api), claim(api)
    assert {first["id"], second["id"]} == {left_out["id"], listed["id"]}
    clock.advance(1)
    api.post("/workers/w1/heartbeat", json={"running": [left_out["id"], listed["id"]]}).raise_for_status()
    clock.advance(settings.heartbeat_timeout_s / 2)
    attempts = {first["id"]: first["attempt"], second["id"]: second["attempt"]}

    response = api.post(
        "/workers/w1/heartbeat",
        json={
            "running": [listed["id"]],
            "jobs": [{"id": job_id, "attempt": attempt} for job_id, attempt in attempts.items()],
        },
    )

    answers = response.json()["jobs"]
    assert answers[listed["id"]] == {}
    assert "error" in answers[left_out["id"]]
    job = api.get(f"/jobs/{left_out['id']}").json()
    assert (job["status"], job["reason"]["code"]) == ("pending", "lease_expired")
