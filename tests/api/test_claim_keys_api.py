"""``GET /jobs/next`` with ``Idempotency-Key``: a retried claim whose first answer was lost is
answered the same runs, on SQLite and PostgreSQL; a bad key is a 400 naming the header."""

from __future__ import annotations

from corral.worker.calls import WorkerClient
from tests.api.conftest import error_code, register, submit


def test_a_retried_claim_answers_the_same_runs_and_starts_nothing(api, clock):
    register(api, cpus=4)
    jobs = []
    for _ in range(3):  # one second apart: queue order is submission order
        jobs.append(submit(api, resources={"cpus": 1}))
        clock.advance(1)
    key = {"Idempotency-Key": "claim-1"}
    first = api.get("/jobs/next", params={"worker_id": "w1", "max": 2}, headers=key)
    assert first.status_code == 200, first.text
    clock.advance(3)
    again = api.get("/jobs/next", params={"worker_id": "w1", "max": 2}, headers=key)
    assert again.status_code == 200, again.text
    assert [item["id"] for item in again.json()["items"]] == [item["id"] for item in first.json()["items"]]
    assert [item["attempt"] for item in again.json()["items"]] == [1, 1]
    assert api.get(f"/jobs/{jobs[2]['id']}").json()["status"] == "pending"
    single_key = {"Idempotency-Key": "claim-2"}
    single = api.get("/jobs/next", params={"worker_id": "w1"}, headers=single_key)
    assert single.json()["id"] == jobs[2]["id"]
    assert api.get("/jobs/next", params={"worker_id": "w1"}, headers=single_key).json() == single.json()


def test_a_key_too_long_is_refused_naming_the_header(api):
    register(api, cpus=4)
    response = api.get("/jobs/next", params={"worker_id": "w1"}, headers={"Idempotency-Key": "k" * 257})
    assert response.status_code == 400
    assert error_code(response) == "invalid_request"
    assert "Idempotency-Key" in response.json()["error"]["message"]


def test_the_sdk_sends_the_key(api, server):
    register(api, cpus=4)
    job = submit(api, resources={"cpus": 1})
    with WorkerClient(server.url) as sdk:
        first = sdk.claim_many("w1", 4, idempotency_key="k")
        assert [claim.id for claim in first] == [job["id"]]
        assert sdk.claim_many("w1", 4, idempotency_key="k") == first
        claim = sdk.claim("w1", idempotency_key="k")
        assert claim is not None and claim.id == job["id"]
