"""Fair share end to end (seed 002): a real server, a real worker with 4 GPUs, real jobs.

Two pools of equal weight. The first holds every GPU; the second starts submitting. Within the
starvation timer the first pool's newest allocations are preempted, the second reaches its fair
share (half the GPUs), and then nothing more moves. A guarantee reclaims borrowed capacity the same
way, without waiting for a timer.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from corral.client import Client
from tests.e2e.conftest import FAST_SERVER_FLAGS, wait_for

pytestmark = pytest.mark.e2e

FAIR_SERVER_FLAGS = (
    *FAST_SERVER_FLAGS,
    "--starvation-timeout-s",
    "1",
    "--aggressive-starvation-timeout-s",
    "1",
    "--preemptive-backoff-s",
    "0.2",
)
WORKER_FLAGS = ("--gpus", "4", "--vram-mb", "16000", "--gpu-model", "FakeGPU")


def submit(client: Client, pool: str, count: int) -> list[str]:
    return [
        client.submit_body({"command": "sleep 120", "resources": {"gpus": 1}, "pool": pool})["id"]
        for _ in range(count)
    ]


def jobs_of(client: Client, job_ids: list[str]) -> list[dict[str, Any]]:
    return [orjson.loads(client.request("GET", f"/jobs/{job_id}").text) for job_id in job_ids]


def events(client: Client, job_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = orjson.loads(client.request("GET", f"/jobs/{job_id}/events").text)["items"]
    return items


def running(client: Client, job_ids: list[str]) -> list[dict[str, Any]]:
    return [job for job in jobs_of(client, job_ids) if job["status"] == "running"]


def test_a_starving_pool_takes_the_newest_allocations_up_to_its_fair_share_then_nothing_moves(
    start_server, start_worker
) -> None:
    server = start_server(*FAIR_SERVER_FLAGS)
    start_worker(server.url, "w0", *WORKER_FLAGS)
    with Client(server.url) as client:
        client.put_pool("first", {"weight": 1})
        client.put_pool("second", {"weight": 1})
        first = submit(client, "first", 6)
        wait_for(lambda: len(running(client, first)) == 4 or None, 15, "the first pool on every GPU")
        started = {job["id"]: job["started_at"] for job in running(client, first)}
        second = submit(client, "second", 3)

        wait_for(lambda: len(running(client, second)) == 2 or None, 20, "the second pool at its share")
        preempted = [job for job in jobs_of(client, first) if job["preempted_count"]]
        # A worker claims several jobs in one request, stamped alike: the prefix rule breaks the
        # tie by id, so "newest" is the last two by (start, id)
        newest = sorted(started, key=lambda job_id: (started[job_id], job_id))[2:]
        assert sorted(job["id"] for job in preempted) == sorted(newest), "the newest two were taken"
        assert all(job["reason"]["code"] != "preempted_priority" for job in preempted)
        histories = [events(client, job["id"]) for job in preempted]
        assert all(
            any(event["reason"]["code"] == "preempted_fair_share" for event in history)
            for history in histories
        )

        time.sleep(3)  # fifteen admission cycles, backoffs long over: nothing more may move
        assert len(running(client, first)) == 2 and len(running(client, second)) == 2
        assert sum(job["preempted_count"] for job in jobs_of(client, first + second)) == 2
        pools = {pool["path"]: pool for pool in orjson.loads(client.request("GET", "/pools").text)["items"]}
        for path in ("first", "second"):
            assert pools[path]["fair_share"]["gpus"] == pytest.approx(2.0)
            assert pools[path]["usage"]["gpus"] == 2
            assert pools[path]["starvation"] == "non_starving"
        metrics = client.request("GET", "/metrics").text
        assert 'corral_preemptions_total{pool="first",reason="fair_share"} 2.0' in metrics


def test_a_guarantee_reclaims_borrowed_capacity_without_waiting_for_a_timer(
    start_server, start_worker
) -> None:
    timers = ("--starvation-timeout-s", "600", "--aggressive-starvation-timeout-s", "600")
    server = start_server(*FAST_SERVER_FLAGS, *timers)
    start_worker(server.url, "w0", *WORKER_FLAGS)
    with Client(server.url) as client:
        client.put_pool("guaranteed", {"guarantee": {"gpus": 3}})
        borrower = submit(client, "borrower", 4)
        wait_for(lambda: len(running(client, borrower)) == 4 or None, 15, "the borrower on every GPU")
        owner = submit(client, "guaranteed", 3)
        wait_for(lambda: len(running(client, owner)) == 3 or None, 20, "the guarantee taken back")
        assert len(running(client, borrower)) == 1
        reasons = {
            event["reason"]["code"]
            for job_id in borrower
            for event in events(client, job_id)
            if event.get("reason")
        }
        assert "preempted_reclaim" in reasons
