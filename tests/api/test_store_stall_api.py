"""Stalls are the server's fault, not the workers' (issue 24 item 2), over real HTTP on both stores
with a fake clock: a silence counts from the later of the last contact, the server's start and the
store's last recovery (``core.hearing``); a store that cannot write answers 503, and ``/readyz``
with it, until a write commits again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from corral.config import ServerSettings
from corral.domain import errors
from corral.store import open_store
from corral.testing.server import ServerThread

from .conftest import claim, error_code, register, submit
from .test_busy_store import BUSY_S, PATIENT_S, locked

LEASE_S = 30.0


@pytest.fixture
def busy_server(store_url, clock) -> Iterator[ServerThread]:
    """A live server whose store gives up on a lock after ``BUSY_S``."""
    server_store = open_store(store_url, busy_timeout_s=BUSY_S)
    settings = ServerSettings(heartbeat_timeout_s=LEASE_S, worker_offline_s=60, dead_worker_after_s=LEASE_S)
    with ServerThread(server_store, settings, clock) as running:
        yield running
    server_store.close()


@pytest.fixture
def patient_server(store_url, clock) -> Iterator[ServerThread]:
    """A live server whose store waits on a lock for longer than any test runs."""
    server_store = open_store(store_url, busy_timeout_s=PATIENT_S)
    with ServerThread(server_store, ServerSettings(heartbeat_timeout_s=LEASE_S), clock) as running:
        yield running
    server_store.close()


def job_status(api: httpx.Client, job_id: str) -> str:
    status: str = api.get(f"/jobs/{job_id}").json()["status"]
    return status


def test_a_worker_registered_after_the_start_and_gone_silent_is_flagged_on_time(store_url, clock):
    """The start holds back only the silences that began before it: a worker heard first after the
    start is flagged ``CORRAL_DEAD_WORKER_AFTER_S`` after its last contact, inside the first lease
    (the whole first lease used to suspend every flag)."""
    settings = ServerSettings(heartbeat_timeout_s=LEASE_S, dead_worker_after_s=5)
    server_store = open_store(store_url)
    try:
        with ServerThread(server_store, settings, clock) as server, httpx.Client(base_url=server.url) as api:
            clock.advance(1)
            register(api)
            submit(api)
            claim(api)
            clock.advance(4)
            server.run_loop("dead_worker_sweep")
            assert api.get("/workers/w1").json()["flagged_dead_at"] is None
            clock.advance(1.5)  # 5.5 s of silence, 6.5 s after the start: well inside the lease
            server.run_loop("dead_worker_sweep")
            assert api.get("/workers/w1").json()["flagged_dead_at"] is not None
    finally:
        server_store.close()


def test_a_stall_past_the_lease_requeues_nothing_until_a_lease_after_the_recovery(
    busy_server, store_url, clock
):
    """Another session holds the store's lock for two leases: the worker's heartbeats are refused
    503 meanwhile. Once it is gone, the reaper's first pass sees the store recovered and reaps
    nothing; a worker that really died is reaped a whole lease after the recovery."""
    with httpx.Client(base_url=busy_server.url, timeout=30) as api:
        register(api)
        job = submit(api)
        claimed = claim(api)
        fence = {"worker_id": "w1", "attempt": claimed["attempt"]}
        with locked(store_url):
            refused = api.post(f"/jobs/{job['id']}/heartbeat", params=fence)
            assert refused.status_code == 503 and error_code(refused) == "store_busy"
            assert busy_server.state.store_health.failing
            clock.advance(LEASE_S * 2)
            busy_server.reap()  # the store still refuses writes: the pass does nothing
        busy_server.reap()
        assert not busy_server.state.store_health.failing
        assert job_status(api, job["id"]) == "running"
        assert api.get("/workers/w1").json()["status"] == "active"
        clock.advance(LEASE_S - 1)
        busy_server.reap()
        busy_server.run_loop("dead_worker_sweep")
        assert job_status(api, job["id"]) == "running"
        assert api.get("/workers/w1").json()["flagged_dead_at"] is None
        clock.advance(2)  # the worker never came back: a whole lease after the recovery it is gone
        busy_server.reap()
        assert job_status(api, job["id"]) == "pending"


def test_a_reaper_pass_decides_each_lease_on_the_hearing_of_the_moment(server, api, clock, monkeypatch):
    """The pass reads the candidates, then decides each on its locked row: a store that failed in
    between (the pass's own write waited through an outage that refused the heartbeats) reaps
    nothing, though the lease looked lapsed when the pass began."""
    register(api)
    job = submit(api)
    claim(api)
    clock.advance(LEASE_S + 1)
    store, health = server.state.store, server.state.store_health
    change = store.jobs.change

    def change_after_an_outage(job_id: str, decide: Any) -> Any:
        health.failed(errors.StoreBusy("another request waited out the busy timeout meanwhile"))
        return change(job_id, decide)

    monkeypatch.setattr(store.jobs, "change", change_after_an_outage)
    server.reap()
    assert job_status(api, job["id"]) == "running"
    assert health.failing


def test_a_store_that_cannot_write_is_a_503_and_not_ready_until_a_write_commits(server, api, monkeypatch):
    """A full disk (here: the store's writes refused as SQLite and PostgreSQL refuse them on one):
    503 ``store_unavailable`` with ``Retry-After``, never a 500; ``/readyz`` says 503 while writes
    fail, though reads and the lock still answer, and 200 once a write commits again."""
    register(api)
    store = server.state.store
    ping = store.ping

    def full(*args: Any, **kwargs: Any) -> Any:
        raise errors.StoreWriteFailed("the store cannot write; nothing was changed: database or disk is full")

    def ping_on_a_full_disk(timeout_s: float, write: bool = False) -> None:
        if write:
            full()
        ping(timeout_s)

    monkeypatch.setattr(store.workers, "worker_heartbeat", full)
    monkeypatch.setattr(store, "ping", ping_on_a_full_disk)
    assert api.get("/readyz").status_code == 200  # no write has failed yet
    refused = api.post("/workers/w1/heartbeat", json={})
    assert refused.status_code == 503, refused.text
    assert error_code(refused) == "store_unavailable" and refused.headers["retry-after"] == "1"
    assert api.get("/workers/w1").status_code == 200  # reads still answer
    not_ready = api.get("/readyz")
    assert not_ready.status_code == 503 and error_code(not_ready) == "store_unavailable"
    assert not_ready.headers["retry-after"] == "1"
    monkeypatch.undo()  # the disk has room again
    assert api.get("/readyz").status_code == 200
    assert not server.state.store_health.failing
    assert api.post("/workers/w1/heartbeat", json={}).status_code == 200


def test_while_the_store_fails_writes_are_refused_at_once_and_the_recovery_is_still_seen(
    patient_server, store_url
):
    """Another session holds the store's lock, and the server knows its store is failing (a write
    waited out the busy timeout): the writes, the claim included, are answered 503 ``store_busy``
    with ``Retry-After`` at once, not queued behind the lock (the store is patient: a request that
    reached it would wait a minute); reads still answer on SQLite. The refusals start a check of
    the store: once the lock is gone it commits, and the writes go through again."""
    health = patient_server.state.store_health
    with httpx.Client(base_url=patient_server.url, timeout=PATIENT_S + 30) as api:
        register(api)
        job = submit(api)
        claimed = claim(api)
        fence = {"worker_id": "w1", "attempt": claimed["attempt"]}

        def job_beat() -> httpx.Response:
            return api.post(f"/jobs/{job['id']}/heartbeat", params=fence, json={})

        with locked(store_url):
            health.failed(errors.StoreBusy("a heartbeat waited out the busy timeout"))
            refused = [
                job_beat(),
                api.post("/workers/w1/heartbeat", json={}),
                api.get("/jobs/next", params={"worker_id": "w1"}),
                api.post("/jobs", json={"command": "true"}),
                api.post(f"/jobs/{job['id']}/cancel"),
            ]
            for answer in refused:
                assert answer.status_code == 503, answer.text
                assert error_code(answer) == "store_busy" and answer.headers["retry-after"] == "1"
            assert api.post("/no/such/route").status_code == 404
            if store_url.startswith("sqlite"):  # PostgreSQL's LOCK TABLE holds the reads too
                assert api.get(f"/jobs/{job['id']}").json()["status"] == "running"
            assert health.failing
        # the check the refusals started commits once the lock is gone (each refusal starts
        # another, should that one have given up meanwhile)
        deadline = time.monotonic() + 30
        while (answer := job_beat()).status_code != 200 and time.monotonic() < deadline:
            assert answer.status_code == 503 and error_code(answer) == "store_busy", answer.text
            time.sleep(0.05)
        assert answer.status_code == 200 and not health.failing, answer.text
        assert job_status(api, job["id"]) == "running"
