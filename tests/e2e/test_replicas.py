"""Several server replicas on one PostgreSQL database: each loop runs on one replica at a time,
no gang is reserved twice, and the loops fail over when the leader stops."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from corral.client import Client
from corral.worker.calls import WorkerClient
from tests.conftest import postgres_schema_url
from tests.e2e.conftest import wait_for
from tests.helpers import leader_of

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]
FAST = ("--admission-tick-s", "0.1", "--reaper-tick-s", "0.1", "--reservation-timeout-s", "30")


@pytest.fixture
def postgres_url() -> Iterator[str]:
    yield from postgres_schema_url()


def test_two_replicas_share_one_database(start_server, postgres_url):
    first = start_server("--db", postgres_url, *FAST)
    second = start_server("--db", postgres_url, *FAST)
    replicas = [first, second]
    for loop in ("admission", "reaper", "dead_worker_sweep"):
        wait_for(
            lambda loop=loop: sum(leader_of(server.url, loop) for server in replicas) == 1 or None, 10, loop
        )
    with Client(first.url) as via_first, Client(second.url) as via_second, WorkerClient(first.url) as hosts:
        for index in range(8):
            hosts.register_worker(
                {"id": f"w{index}", "address": f"10.0.0.{index}", "resources": {"gpus": 1, "cpus": 4}}
            )
        gangs = [
            (via_first if index % 2 else via_second).submit_body(
                {"command": "train", "gang_size": 2, "resources": {"gpus": 1}}
            )
            for index in range(4)
        ]
        for gang in gangs:
            wait_for(
                lambda gang=gang: via_first.gang(gang["gang_id"])["status"] == "reserved" or None,
                10,
                "reservation",
            )
        holders: list[str] = []
        for gang in gangs:
            for task_id in gang["tasks"]:
                reservations = [event for event in via_first.events(task_id) if event["to"] == "reserved"]
                assert len(reservations) == 1, "a gang task was reserved twice"
                holders.append(via_first.get_job(task_id)["worker_id"])
        assert sorted(holders) == [f"w{index}" for index in range(8)], (
            "one task per GPU worker, none promised twice"
        )

        leader = first if leader_of(first.url, "admission") else second
        follower = second if leader is first else first
        leader.process.send_signal(signal.SIGTERM)
        leader.process.wait(timeout=10)
        wait_for(
            lambda: leader_of(follower.url, "admission") or None,
            15,
            "the follower to take the admission loop",
        )
        with Client(follower.url) as survivor, WorkerClient(follower.url) as hosts:
            for index in range(8, 10):
                hosts.register_worker({"id": f"w{index}", "resources": {"gpus": 1, "cpus": 4}})
            late = survivor.submit_body({"command": "train", "gang_size": 2, "resources": {"gpus": 1}})
            wait_for(
                lambda: survivor.gang(late["gang_id"])["status"] == "reserved" or None,
                10,
                "reservation after failover",
            )
