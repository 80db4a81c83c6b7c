"""A worker's final reports in batches (issue 26, point 1): ``POST /workers/{id}/reports`` carries
the done and fail reports of several attempts, answered per report in order, each as its own route
would answer it, applied in one transaction. The single routes' cases run through the batch too
(``reporter`` in ``test_protocol_api``); these are the batch's own."""

from __future__ import annotations

from typing import Any

import pytest

from corral.client_errors import ApiError
from corral.protocol.answers import FinalReportsAnswer
from corral.protocol.models import MAX_FINAL_REPORTS
from corral.worker.calls import WorkerClient
from tests.api.conftest import assert_store_history_is_legal, error_code, register, submit


def claim_many(api, count: int, worker_id: str = "w1") -> list[dict[str, Any]]:
    claimed = api.get("/jobs/next", params={"worker_id": worker_id, "max": count})
    assert claimed.status_code == 200, claimed.text
    return claimed.json()["items"]


def reports(api, items: list[dict[str, Any]], worker_id: str = "w1") -> list[dict[str, Any]]:
    response = api.post(f"/workers/{worker_id}/reports", json={"reports": items})
    assert response.status_code == 200, response.text
    answered = response.json()
    FinalReportsAnswer.model_validate(answered)
    return answered["items"]


def test_one_batch_answers_each_report_as_its_own_route_would(api, server, store_url):
    register(api, cpus=8)
    finished, crashed, retried, released, stale, malformed = (submit(api, max_retries=2) for _ in range(6))
    walltime = submit(api, max_retries=2)
    assert len(claim_many(api, 7)) == 7
    api.post(f"/jobs/{crashed['id']}/fail", params={"worker_id": "w1", "attempt": 1}, json={"exit_code": 1})
    crashed_again = claim_many(api, 1)[0]
    assert crashed_again["id"] == crashed["id"] and crashed_again["attempt"] == 2

    answers = reports(
        api,
        [
            {"job_id": finished["id"], "attempt": 1, "outcome": "done"},
            {"job_id": crashed["id"], "attempt": 2, "outcome": "fail", "exit_code": 3, "output_tail": "boom"},
            {"job_id": retried["id"], "attempt": 1, "outcome": "fail", "exit_code": 2, "error": "exit 2"},
            {"job_id": released["id"], "attempt": 1, "outcome": "fail", "exit_code": 143, "release": True},
            {"job_id": stale["id"], "attempt": 2, "outcome": "done"},
            {"job_id": malformed["id"], "attempt": 1, "outcome": "finished"},
            {"job_id": "j-unknown", "attempt": 1, "outcome": "done"},
            {
                "job_id": walltime["id"],
                "attempt": 1,
                "outcome": "fail",
                "exit_code": 9,
                "reason": "walltime_exceeded",
            },
        ],
    )
    assert [answer["status"] for answer in answers] == [200, 200, 200, 200, 409, 400, 404, 200]
    assert answers[0]["job"]["status"] == "done"
    crashed_job = answers[1]["job"]
    assert (crashed_job["status"], crashed_job["exit_code"], crashed_job["output_tail"]) == (
        "failed",
        3,
        "boom",
    )
    assert (answers[2]["job"]["status"], answers[2]["job"]["reason"]["code"]) == ("pending", "retrying")
    assert (answers[3]["job"]["status"], answers[3]["job"]["attempts"]) == ("pending", 0)
    assert answers[4]["error"]["code"] == "stale_attempt"
    assert answers[5]["error"]["code"] == "invalid_request"
    assert answers[6]["error"]["code"] == "not_found"
    assert (answers[7]["job"]["status"], answers[7]["job"]["reason"]["code"]) == (
        "failed",
        "walltime_exceeded",
    )
    # the refused ones changed nothing
    for job in (stale, malformed):
        assert api.get(f"/jobs/{job['id']}").json()["status"] == "running"
    metrics = api.get("/metrics").text
    assert "corral_jobs_completed_total 1.0" in metrics
    assert "corral_jobs_retried_total 3.0" in metrics  # the first fail of crashed, retried, released
    assert_store_history_is_legal(store_url)


def test_a_batch_is_one_transaction(api, server, monkeypatch):
    """The items join the single routes' group commit: one ``change_many`` for the batch."""
    register(api, cpus=8)
    for _ in range(5):
        submit(api)
    claimed = claim_many(api, 5)
    jobs = server.state.store.jobs
    groups: list[int] = []
    change_many = jobs.change_many

    def counted(group):
        groups.append(len(group))
        return change_many(group)

    monkeypatch.setattr(jobs, "change_many", counted)
    items = [{"job_id": job["id"], "attempt": job["attempt"], "outcome": "done"} for job in claimed]
    assert [answer["status"] for answer in reports(api, items)] == [200] * 5
    assert groups == [5]


def test_a_batch_sent_again_after_its_answer_was_lost_reports_nothing_twice(api, store_url):
    """The answer of a batch lost, the worker sends it again: every report is refused as already
    applied (the fence), no attempt counted twice, no job re-queued twice."""
    register(api, cpus=8)
    done_job, failed_job = submit(api), submit(api, max_retries=3)
    claimed = claim_many(api, 2)
    items = [
        {"job_id": done_job["id"], "attempt": 1, "outcome": "done"},
        {"job_id": failed_job["id"], "attempt": 1, "outcome": "fail", "exit_code": 1},
    ]
    assert len(claimed) == 2
    assert [answer["status"] for answer in reports(api, items)] == [200, 200]
    again = reports(api, items)
    assert [(answer["status"], answer["error"]["code"]) for answer in again] == [
        (409, "not_running"),
        (409, "stale_attempt"),  # re-queued: the job has no attempt running (the single route's answer)
    ]
    failed = api.get(f"/jobs/{failed_job['id']}").json()
    assert (failed["status"], failed["attempts"]) == ("pending", 1)
    assert "corral_jobs_completed_total 1.0" in api.get("/metrics").text
    events = [event["to"] for event in api.get(f"/jobs/{failed_job['id']}/events").json()["items"]]
    assert events == ["pending", "running", "pending"]
    assert_store_history_is_legal(store_url)


def test_reports_of_another_worker_are_refused_per_item(api):
    """The path's worker id is the fence's: w2 cannot end w1's attempts."""
    register(api, "w1")
    register(api, "w2")
    job = submit(api)
    claim_many(api, 1, "w1")
    answers = reports(api, [{"job_id": job["id"], "attempt": 1, "outcome": "done"}], worker_id="w2")
    assert (answers[0]["status"], answers[0]["error"]["code"]) == (409, "stale_attempt")
    assert api.get(f"/jobs/{job['id']}").json()["status"] == "running"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"reports": []},
        {"reports": "done"},
        {"reports": [{"job_id": "j-1", "attempt": 1, "outcome": "done"}], "extra": 1},
        {"reports": [{"job_id": f"j-{index}", "attempt": 1, "outcome": "done"} for index in range(65)]},
    ],
    ids=["no reports", "empty", "not a list", "unknown field", "over the bound"],
)
def test_a_malformed_batch_is_400(api, body):
    assert MAX_FINAL_REPORTS == 64
    response = api.post("/workers/w1/reports", json=body)
    assert (response.status_code, error_code(response)) == (400, "invalid_request")


def test_a_batch_without_a_json_body_is_400(api):
    not_json = api.post("/workers/w1/reports", content=b"{", headers={"content-type": "application/json"})
    assert (not_json.status_code, error_code(not_json)) == (400, "invalid_request")
    text = api.post("/workers/w1/reports", content=b"{}", headers={"content-type": "text/plain"})
    assert (text.status_code, error_code(text)) == (400, "invalid_request")


@pytest.mark.parametrize(
    "item",
    [
        {"attempt": 1, "outcome": "done"},
        {"job_id": "", "attempt": 1, "outcome": "done"},
        {"job_id": "j-1", "outcome": "done"},
        {"job_id": "j-1", "attempt": "1", "outcome": "done"},
        {"job_id": "j-1", "attempt": 1},
        {"job_id": "j-1", "attempt": 1, "outcome": "done", "exit_code": 0},
        {"job_id": "j-1", "attempt": 1, "outcome": "fail", "reason": "tired"},
        {"job_id": "j-1", "attempt": 1, "outcome": "fail", "exit_code": 2**40},
        "done",
    ],
)
def test_a_malformed_item_is_its_own_400(api, item):
    register(api)
    job = submit(api)
    claim_many(api, 1)
    answers = reports(api, [item, {"job_id": job["id"], "attempt": 1, "outcome": "done"}])
    assert (answers[0]["status"], answers[0]["error"]["code"]) == (400, "invalid_request")
    assert answers[1]["status"] == 200
    assert api.get(f"/jobs/{job['id']}").json()["status"] == "done"


def test_the_worker_client_reads_each_outcome_and_an_older_server(server, api):
    """``WorkerClient.final_reports`` on a real server: None for a report taken, its route's
    ``ApiError`` for one refused; and None for the whole call where the route is unknown (404),
    as on a server from before it, which the worker then reports to by the single routes."""
    register(api)
    job = submit(api)
    claim_many(api, 1)
    with WorkerClient(server.url) as client:
        taken, refused = client.final_reports(
            "w1",
            [
                {"job_id": job["id"], "attempt": 1, "outcome": "done"},
                {"job_id": job["id"], "attempt": 1, "outcome": "done"},
            ],
        )
    assert taken is None
    # the same report twice in one batch: applied in order, the second refused as already applied
    assert isinstance(refused, ApiError)
    assert (refused.status, refused.code) == (409, "not_running")
    with WorkerClient(f"{server.url}/a-server-without-the-route") as older:
        assert older.final_reports("w1", [{"job_id": job["id"], "attempt": 1, "outcome": "done"}]) is None
