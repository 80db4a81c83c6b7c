"""API.md "Wave 3 additions" -> "Lists and handles", over real HTTP on SQLite and PostgreSQL:
``GET /jobs?order=&user=``, a gang's events and why, ``DELETE /workers/{id}`` and a worker that says
it is leaving."""

from __future__ import annotations

from tests.api.conftest import claim, error_code, register, submit


def ids(page: dict) -> list[str]:
    return [job["id"] for job in page["items"]]


def test_jobs_newest_first_pages_through_the_cursor(api, clock):
    submitted = []
    for index in range(5):
        submitted.append(submit(api, name=f"n{index}")["id"])
        clock.advance(1)
    first = api.get("/jobs", params={"order": "newest", "limit": 2}).json()
    assert ids(first) == submitted[:-3:-1]
    second = api.get("/jobs", params={"order": "newest", "limit": 2, "after": first["next"]}).json()
    third = api.get("/jobs", params={"order": "newest", "limit": 2, "after": second["next"]}).json()
    assert ids(first) + ids(second) + ids(third) == submitted[::-1]
    assert third["next"] is None
    # the default is the old order, and ``oldest`` says so explicitly
    assert ids(api.get("/jobs").json()) == submitted
    assert ids(api.get("/jobs", params={"order": "oldest"}).json()) == submitted
    # a large page (streamed in pieces) keeps the order too
    assert ids(api.get("/jobs", params={"order": "newest", "limit": 1000}).json()) == submitted[::-1]


def test_jobs_order_must_be_oldest_or_newest(api):
    response = api.get("/jobs", params={"order": "random"})
    assert response.status_code == 400
    assert error_code(response) == "invalid_request" and "order" in response.json()["error"]["message"]


def test_jobs_of_one_user(api, clock):
    alice = []
    for _ in range(2):
        alice.append(submit(api, user="alice")["id"])
        clock.advance(1)  # the list orders by submission time, then id
    submit(api, user="bob")
    alice.append(submit(api, user="alice", gang_size=2)["tasks"][0])
    listed = api.get("/jobs", params={"user": "alice", "order": "newest", "status": "pending"}).json()
    assert ids(listed) == [alice[1], alice[0]]  # the gang's tasks are blocked, not pending
    every = ids(api.get("/jobs", params={"user": "alice"}).json())
    assert every[:2] == alice[:2] and alice[2] in every and len(every) == 4
    assert api.get("/jobs", params={"user": "nobody"}).json()["items"] == []


def test_a_gangs_events_tell_every_task_in_time_order(api, clock):
    register(api, "w1")
    gang = submit(api, gang_size=2)
    clock.advance(1)
    cancelled = api.post(f"/gangs/{gang['gang_id']}/cancel")
    assert cancelled.status_code == 200
    events = api.get(f"/gangs/{gang['gang_id']}/events").json()["items"]
    assert [(event["job_id"], event["to"]) for event in events] == [
        (gang["tasks"][0], "blocked"),
        (gang["tasks"][1], "blocked"),
        (gang["tasks"][0], "cancelled"),
        (gang["tasks"][1], "cancelled"),
    ]
    assert [event["gang_index"] for event in events] == [0, 1, 0, 1]
    assert events[0]["at"] < events[2]["at"]
    missing = api.get("/gangs/g-nope/events")
    assert missing.status_code == 404 and error_code(missing) == "not_found"


def test_a_gangs_why_names_its_status_and_the_task_it_explains(api):
    gang = submit(api, gang_size=2, resources={"gpus": 8})
    answer = api.get(f"/gangs/{gang['gang_id']}/why").json()
    assert answer["status"] == "blocked" and answer["gang_id"] == gang["gang_id"]
    assert answer["job_id"] == gang["tasks"][0]
    job_why = api.get(f"/jobs/{gang['tasks'][0]}/why").json()
    assert answer["reasons"] == job_why["reasons"]
    missing = api.get("/gangs/g-nope/why")
    assert missing.status_code == 404 and error_code(missing) == "not_found"


def test_delete_worker_removes_only_an_offline_worker_that_holds_nothing(api):
    register(api, "w1")
    register(api, "w2")
    refused = api.delete("/workers/w1")
    assert refused.status_code == 409 and error_code(refused) == "conflict"
    assert "offline" in refused.json()["error"]["message"]

    submit(api)
    claim(api, "w2")
    assert api.post("/workers/w2/leave").json()["status"] == "offline"
    holding = api.delete("/workers/w2")
    assert holding.status_code == 409 and "still holds 1 job" in holding.json()["error"]["message"]

    assert api.post("/workers/w1/leave").json()["status"] == "offline"
    removed = api.delete("/workers/w1")
    assert removed.status_code == 204 and removed.content == b""
    assert api.get("/workers/w1").status_code == 404
    assert [worker["id"] for worker in api.get("/workers").json()["items"]] == ["w2"]
    assert api.delete("/workers/w1").status_code == 404


def test_a_worker_that_leaves_is_offline_at_once_and_comes_back_by_its_heartbeat(api):
    register(api, "w1")
    left = api.post("/workers/w1/leave")
    assert left.status_code == 200 and left.json()["status"] == "offline"
    assert api.get("/workers/w1").json()["status"] == "offline"
    assert api.post("/workers/w1/leave").json()["status"] == "offline"  # again: no change, no error
    assert api.post("/workers/w1/heartbeat", json={}).status_code == 200
    assert api.get("/workers/w1").json()["status"] == "active"
    assert api.post("/workers/nope/leave").status_code == 404


def test_work_no_worker_could_ever_hold_is_unschedulable_from_its_submit_on(api):
    """64 GPUs on 8-GPU hosts, a 5 x 4 gang on 3 x 4 GPUs, a GPU model no host has: the submit's
    answer, the list and ``why`` all say ``unschedulable``, before any admission cycle."""
    for worker_id in ("w1", "w2", "w3"):
        register(api, worker_id, gpus=4, vram_mb=80000)
    too_big = submit(api, resources={"gpus": 64})
    no_such_model = submit(api, resources={"gpus": 1}, constraints={"gpu_model": "A100"})
    gang = submit(api, gang_size=5, resources={"gpus": 4})
    fits = submit(api, resources={"gpus": 4})
    for job in (too_big, no_such_model):
        assert job["reason"]["code"] == "unschedulable"
        listed = [item for item in api.get("/jobs").json()["items"] if item["id"] == job["id"]]
        assert listed[0]["reason"] == job["reason"]
        assert api.get(f"/jobs/{job['id']}/why").json()["reasons"][0] == job["reason"]
    assert "GPU model A100" in no_such_model["reason"]["message"]
    task = api.get(f"/jobs/{gang['tasks'][0]}").json()
    assert task["reason"]["code"] == "unschedulable" and "could hold 3" in task["reason"]["message"]
    assert api.get(f"/gangs/{gang['gang_id']}/why").json()["reasons"][0] == task["reason"]
    assert fits["reason"]["code"] == "queued"


def test_an_unschedulable_job_is_queued_once_a_worker_that_could_hold_it_registers(api):
    register(api, "w1", gpus=8)
    job = submit(api, resources={"gpus": 16})
    assert job["reason"]["code"] == "unschedulable"
    register(api, "big", gpus=16)
    now = api.get(f"/jobs/{job['id']}").json()["reason"]
    assert now["code"] == "queued"
    assert [item["reason"]["code"] for item in api.get("/jobs").json()["items"]] == ["queued"]
    assert api.post("/workers/big/leave").json()["status"] == "offline"
    assert api.get(f"/jobs/{job['id']}").json()["reason"]["code"] == "unschedulable"


def test_without_any_worker_a_submit_stays_queued(api):
    job = submit(api, resources={"gpus": 64})
    assert job["reason"]["code"] == "queued"
    assert api.get(f"/jobs/{job['id']}/why").json()["reasons"][0]["code"] == "no_workers"


def test_the_dashboard_words_the_reason_as_the_cli_does(api):
    register(api, "w1", gpus=8)
    job = submit(api, resources={"gpus": 64})
    page = api.get(f"/ui/jobs/{job['id']}")
    assert page.status_code == 200
    worded = f"unschedulable: {job['reason']['message']}"
    assert f"— {worded}</p>" in page.text  # the status line, as `corral jobs --wide` shows it
    assert f"<li>{worded}</li>" in page.text  # the why list, as `corral why` shows it
