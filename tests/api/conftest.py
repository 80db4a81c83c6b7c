from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from corral.store import open_store
from corral.testing import history


@pytest.fixture
def api(server) -> Iterator[httpx.Client]:
    """Raw HTTP to the live test server: the tests check status codes and bodies byte for byte."""
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


def error_code(response: httpx.Response) -> str:
    assert response.headers["content-type"].startswith("application/json")
    return response.json()["error"]["code"]


def register(api: httpx.Client, worker_id: str = "w1", **resources) -> dict:
    body = {"id": worker_id, "address": "127.0.0.1", "resources": {"cpus": 8, "memory_mb": 8192, **resources}}
    response = api.post("/workers/register", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def submit(api: httpx.Client, **fields) -> dict:
    response = api.post("/jobs", json={"command": "true", **fields})
    assert response.status_code == 201, response.text
    return response.json()


def claim(api: httpx.Client, worker_id: str = "w1") -> dict:
    response = api.get("/jobs/next", params={"worker_id": worker_id})
    assert response.status_code == 200, response.text
    return response.json()


def assert_store_history_is_legal(store_url: str) -> None:
    """Every job's history in the store at ``store_url`` checked (``corral.testing.history``): no
    worker over capacity, no illegal transition, on a connection of its own."""
    checked = open_store(store_url)
    try:
        verdict = history.check_store(checked)
    finally:
        checked.close()
    assert verdict.ok, verdict.summary()


#: a report of a job no store has, sent beside every batched report: its refusal must stay its own
DECOY = {"job_id": "j-decoy-missing", "attempt": 1, "outcome": "done"}


class Reported:
    """A report's answer, read alike from its own route and from its item of a batch."""

    def __init__(self, status_code: int, body: dict) -> None:
        self.status_code = status_code
        self._body = body

    def json(self) -> dict:
        return self._body


class Reporter:
    """The final reports (done, fail) of the single routes' cases, sent either by their own routes
    (``POST /jobs/{id}/done``, ``/fail``) or as an item of a batch (``POST /workers/{id}/reports``)
    beside a report that is refused (``DECOY``): every case must answer alike both ways, and the
    refused neighbour must change nothing of it."""

    def __init__(self, api: httpx.Client, batched: bool) -> None:
        self.api = api
        self.batched = batched

    def done(self, job_id: str, worker_id: str = "w1", attempt: object = 1) -> Reported:
        if not self.batched:
            return self._single(f"/jobs/{job_id}/done", worker_id, attempt, None)
        return self._batch(worker_id, {"job_id": job_id, "attempt": attempt, "outcome": "done"})

    def fail(
        self, job_id: str, worker_id: str = "w1", attempt: object = 1, body: dict | None = None
    ) -> Reported:
        if not self.batched:
            return self._single(f"/jobs/{job_id}/fail", worker_id, attempt, body)
        return self._batch(
            worker_id, {"job_id": job_id, "attempt": attempt, "outcome": "fail", **(body or {})}
        )

    def _single(self, path: str, worker_id: str, attempt: object, body: dict | None) -> Reported:
        response = self.api.post(path, params={"worker_id": worker_id, "attempt": attempt}, json=body)
        return Reported(response.status_code, response.json())

    def _batch(self, worker_id: str, item: dict) -> Reported:
        response = self.api.post(f"/workers/{worker_id}/reports", json={"reports": [DECOY, item]})
        assert response.status_code == 200, response.text
        decoy, answer = response.json()["items"]
        assert decoy == {
            "status": 404,
            "error": {"code": "not_found", "message": decoy["error"]["message"]},
        }, decoy
        if answer["status"] == 200:
            return Reported(200, answer["job"])
        return Reported(answer["status"], {"error": answer["error"]})


@pytest.fixture(params=["single", "batch"])
def reporter(request: pytest.FixtureRequest, api: httpx.Client) -> Reporter:
    """A single route's case, run by its own route and through the batch of final reports."""
    return Reporter(api, batched=request.param == "batch")
