"""``GET /jobs/next?worker_id=W&max=N``: several claims in one request (and one store transaction),
on SQLite and PostgreSQL. Each item is exactly the single claim's answer."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from corral.protocol.answers import ClaimAnswer, ClaimsAnswer
from corral.server.routes import protocol as protocol_routes
from corral.worker.calls import WorkerClient
from tests.api.conftest import assert_store_history_is_legal, error_code, register, submit


def claim_many(api: httpx.Client, limit: int, worker_id: str = "w1", **params) -> httpx.Response:
    return api.get("/jobs/next", params={"worker_id": worker_id, "max": limit, **params})


def test_claims_several_jobs_each_answered_as_a_single_claim(api, server, clock):
    register(api, gpus=4, vram_mb=80000, cpus=8)
    jobs = []
    for index in range(3):  # one second apart: queue order is submission order
        jobs.append(submit(api, env={"N": str(index)}, resources={"gpus": 1, "cpus": 1}))
        clock.advance(1)
    response = claim_many(api, 2)
    assert response.status_code == 200, response.text
    answer = ClaimsAnswer.model_validate(response.json())
    assert set(response.json()) == {"items"}
    assert [item.id for item in answer.items] == [jobs[0]["id"], jobs[1]["id"]]
    for index, item in enumerate(answer.items):
        assert (item.status, item.attempt, item.worker_id) == ("running", 1, "w1")
        assert item.env == {
            "N": str(index),
            "CORRAL_JOB_ID": item.id,
            "CORRAL_ATTEMPT": "1",
            "CORRAL_SERVER": server.url,
        }
    assert sorted(index for item in answer.items for index in item.gpu_indices) == [0, 1]
    # the same keys as a single claim's answer, and valid as one
    single = api.get("/jobs/next", params={"worker_id": "w1"})
    assert single.status_code == 200
    assert set(single.json()) == set(response.json()["items"][0])
    ClaimAnswer.model_validate(single.json())
    assert claim_many(api, 64).status_code == 204


def test_never_fills_a_worker_past_its_capacity(api):
    register(api, gpus=2, vram_mb=80000, cpus=8)
    for _ in range(5):
        submit(api, resources={"gpus": 1})
    items = claim_many(api, 64).json()["items"]
    assert len(items) == 2
    assert sorted(index for item in items for index in item["gpu_indices"]) == [0, 1]
    assert claim_many(api, 64).status_code == 204
    done = api.post(
        f"/jobs/{items[0]['id']}/done", params={"worker_id": "w1", "attempt": items[0]["attempt"]}
    )
    assert done.status_code == 200, done.text
    (again,) = claim_many(api, 64).json()["items"]
    assert again["gpu_indices"] == items[0]["gpu_indices"]


def test_reserved_gang_tasks_come_first(api, server):
    """The gang's tasks the admission cycle reserved on the worker start before any pending job,
    each with the gang's rendezvous as a single claim gives it."""
    register(api, "w1", gpus=2, vram_mb=1000, cpus=8)
    pending = submit(api, resources={"cpus": 1})
    gang = api.post("/jobs", json={"command": "train", "gang_size": 2, "resources": {"gpus": 1}}).json()
    server.run_loop("admission")
    items = claim_many(api, 3).json()["items"]
    assert [item["id"] for item in items] == [*sorted(gang["tasks"]), pending["id"]]
    ranks = {item["id"]: item["env"] for item in items[:2]}
    assert [ranks[task]["RANK"] for task in gang["tasks"]] == ["0", "1"]
    assert [ranks[task]["LOCAL_RANK"] for task in gang["tasks"]] == ["0", "1"]
    assert {env["WORLD_SIZE"] for env in ranks.values()} == {"2"}
    assert sorted(index for item in items for index in item["gpu_indices"]) == [0, 1]
    assert api.get(f"/gangs/{gang['gang_id']}").json()["status"] == "running"


@pytest.mark.parametrize("limit", ["0", "65", "-1", "two", "1.5", ""])
def test_a_bad_max_is_invalid_request_naming_max(api, limit):
    register(api)
    submit(api)
    response = api.get("/jobs/next", params={"worker_id": "w1", "max": limit})
    assert response.status_code == 400, response.text
    assert error_code(response) == "invalid_request"
    assert "max" in response.json()["error"]["message"]


def test_unknown_worker_is_404(api):
    assert claim_many(api, 4, "ghost").status_code == 404


def test_wait_long_polls_for_several(api, monkeypatch):
    monkeypatch.setattr(protocol_routes, "RECHECK_S", 60.0)  # only the submit's wake answers it
    register(api)
    result = {}

    def poll():
        response = claim_many(api, 8, wait=10)
        result["status"], result["body"] = response.status_code, response.json()

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.3)
    answer = api.post("/jobs/batch", json={"jobs": [{"command": "true"} for _ in range(3)]})
    assert answer.status_code == 201
    poller.join(timeout=15)
    assert result["status"] == 200
    assert 1 <= len(result["body"]["items"]) <= 3


def test_concurrent_claims_with_max_hand_out_each_job_once(api, server, store_url):
    for index in range(4):
        register(api, f"w{index}", cpus=3)
    response = api.post("/jobs/batch", json={"jobs": [{"command": "true", "resources": {"cpus": 1}}] * 40})
    assert response.status_code == 201
    claimed: list[str] = []
    lock = threading.Lock()

    def work(worker_id: str) -> None:
        with httpx.Client(base_url=server.url, timeout=10) as own:
            while True:
                answer = claim_many(own, 5, worker_id)
                if answer.status_code == 204:
                    return
                items = answer.json()["items"]
                assert len(items) <= 3
                with lock:
                    claimed.extend(item["id"] for item in items)
                for item in items:
                    done = own.post(
                        f"/jobs/{item['id']}/done",
                        params={"worker_id": worker_id, "attempt": item["attempt"]},
                    )
                    assert done.status_code == 200, done.text

    threads = [threading.Thread(target=work, args=(f"w{index}",)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(claimed) == len(set(claimed)) == 40
    assert_store_history_is_legal(store_url)


def test_sdk_claim_many(api, server):

    register(api, cpus=2)
    for _ in range(3):
        submit(api, resources={"cpus": 1})
    with WorkerClient(server.url) as sdk:
        claimed = sdk.claim_many("w1", 8)
        assert len(claimed) == 2
        assert all(isinstance(item, ClaimAnswer) and item.attempt == 1 for item in claimed)
        assert sdk.claim_many("w1", 8) == []
