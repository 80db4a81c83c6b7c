"""A locked store is an answer, not a freeze (issue 13, point 0), and the event loop never waits on
the store (point 1).

Another session holds the store's lock (``BEGIN EXCLUSIVE`` on the SQLite file, ``LOCK TABLE jobs``
on PostgreSQL): ``/healthz`` still answers at once, ``/readyz`` says 503 within a second, a change
is refused 503 ``store_busy`` with ``Retry-After`` once it has waited ``busy_timeout_s`` (never a
500), and the SDK sends it again until the lock is gone.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from corral.client import ApiError, Client
from corral.domain import errors
from corral.domain.resources import Resources
from corral.observability.metrics import Metrics
from corral.server.loops.runner import Loop, LoopGroup
from corral.store import open_store
from corral.store.base import WorkerRegistration
from corral.testing.server import ServerThread
from corral.worker.calls import WorkerClient

from .conftest import claim, error_code, register, submit

BUSY_S = 0.5
#: a busy timeout no request of a test outlasts: a change waits on the lock until the test lets it go
PATIENT_S = 60.0


@pytest.fixture
def busy_server(store_url, clock, settings) -> Iterator[ServerThread]:
    """A live server whose store gives up on a lock after ``BUSY_S``."""
    server_store = open_store(store_url, busy_timeout_s=BUSY_S)
    with ServerThread(server_store, settings, clock) as running:
        yield running
    server_store.close()


@pytest.fixture
def patient_server(store_url, clock, settings) -> Iterator[ServerThread]:
    """A live server whose store waits on a lock for longer than any test runs."""
    server_store = open_store(store_url, busy_timeout_s=PATIENT_S)
    with ServerThread(server_store, settings, clock) as running:
        yield running
    server_store.close()


@contextmanager
def locked(store_url: str) -> Iterator[Any]:
    """Another session holding the store's lock until the block ends (or ``release`` is called)."""
    if store_url.startswith("sqlite:///"):
        connection = sqlite3.connect(
            store_url.removeprefix("sqlite:///"), isolation_level=None, check_same_thread=False
        )
        connection.execute("BEGIN EXCLUSIVE")
    else:
        import psycopg

        connection = psycopg.connect(store_url)
        connection.execute("LOCK TABLE jobs")
    released = threading.Event()

    def release() -> None:
        if not released.is_set():
            released.set()
            connection.rollback() if not isinstance(connection, sqlite3.Connection) else connection.execute(
                "ROLLBACK"
            )
            connection.close()

    try:
        yield release
    finally:
        release()


def test_the_probes_answer_while_a_change_waits_on_the_lock(patient_server, store_url):
    """While a heartbeat waits on the lock (and goes on waiting: its store is patient), the
    liveness probes answer and ``/readyz`` says 503: none of them waits behind the heartbeat."""
    with httpx.Client(base_url=patient_server.url, timeout=30) as api:
        register(api, "w1")
        job = submit(api)
        claimed = claim(api, "w1")
        fence = {"worker_id": "w1", "attempt": claimed["attempt"]}
        with locked(store_url) as release:
            waiting: dict[str, Any] = {}

            def beat() -> None:
                with httpx.Client(base_url=patient_server.url, timeout=PATIENT_S + 30) as other:
                    waiting["answer"] = other.post(f"/jobs/{job['id']}/heartbeat", params=fence)

            beating = threading.Thread(target=beat)
            beating.start()
            assert api.get("/healthz").status_code == 200
            assert api.get("/health").status_code == 200
            readyz = api.get("/readyz")
            assert readyz.status_code == 503
            assert error_code(readyz) in ("store_busy", "store_unavailable")
            assert beating.is_alive(), "the heartbeat still waits on the lock"
            release()
            beating.join(30)
        assert waiting["answer"].status_code == 200, waiting["answer"].text
        assert api.get("/readyz").status_code == 200


def test_a_locked_store_is_an_answer_not_a_freeze(busy_server, store_url):
    with httpx.Client(base_url=busy_server.url, timeout=30) as api:
        register(api, "w1")
        job = submit(api)
        claimed = claim(api, "w1")
        fence = {"worker_id": "w1", "attempt": claimed["attempt"]}
        with locked(store_url):
            waiting: dict[str, Any] = {}

            def beat() -> None:
                with httpx.Client(base_url=busy_server.url, timeout=30) as other:
                    waiting["answer"] = other.post(f"/jobs/{job['id']}/heartbeat", params=fence)

            beating = threading.Thread(target=beat)
            beating.start()
            beating.join(10)
            answer = waiting["answer"]
            assert answer.status_code == 503, answer.text
            assert error_code(answer) == "store_busy"
            assert answer.headers["retry-after"] == "1"
            beat_answer = api.post("/workers/w1/heartbeat", json={"running": [job["id"]]})
            assert beat_answer.status_code == 503 and error_code(beat_answer) == "store_busy"
            assert "retry-after" in beat_answer.headers
            # A read: served beside the writer (SQLite's WAL), or refused as busy (PostgreSQL's
            # LOCK TABLE blocks readers too); never a 500, never a hang.
            read = api.get(f"/jobs/{job['id']}")
            assert read.status_code in (200, 503)
        assert api.get("/readyz").status_code == 200
        assert api.post(f"/jobs/{job['id']}/heartbeat", params=fence).status_code == 200


def test_the_sdk_sends_a_busy_request_again_until_the_store_answers(busy_server, store_url):
    with Client(busy_server.url) as client, WorkerClient(busy_server.url) as worker:
        worker.register_worker({"id": "w1", "address": "127.0.0.1", "resources": {"cpus": 4}})
        client.submit_body({"command": "true"})
        job = worker.claim("w1")
        assert job is not None
        with locked(store_url) as release:
            freed = threading.Event()

            def free() -> None:
                freed.set()  # before the release: a heartbeat that gets through finds it set
                release()

            threading.Timer(1.2, free).start()
            worker.job_heartbeat(job.id, "w1", job.attempt)
            assert freed.is_set(), "the heartbeat got through only once the lock was gone"
    with WorkerClient(busy_server.url, busy_retry_s=0) as impatient, locked(store_url):
        with pytest.raises(ApiError) as refused:
            impatient.job_heartbeat(job.id, "w1", job.attempt)
        assert (refused.value.status, refused.value.code) == (503, "store_busy")
    with WorkerClient(busy_server.url) as patient, locked(store_url):  # patient, but not for this one call
        with pytest.raises(ApiError) as refused:
            patient.job_heartbeat(job.id, "w1", job.attempt, busy_retry_s=0)
        assert (refused.value.status, refused.value.code) == (503, "store_busy")


def test_a_locked_store_raises_store_busy_not_a_driver_error(store_url):
    store = open_store(store_url, busy_timeout_s=BUSY_S)
    try:
        store.workers.register_worker(WorkerRegistration("w1", "127.0.0.1", Resources(cpus=1)), 1.0)
        with locked(store_url), pytest.raises(errors.StoreBusy):
            store.workers.worker_heartbeat("w1", 2.0, None, running=[])
        assert store.workers.worker_heartbeat("w1", 2.0, None, running=[]).worker.last_heartbeat_at == 2.0
    finally:
        store.close()


def test_a_slow_store_call_holds_up_no_other_request(server, monkeypatch):
    """A 5,000-job list (here: a list held up until the test lets it go) runs on a store thread:
    heartbeats and probes are answered meanwhile."""
    store = server.state.store
    slow_list = store.jobs.list_jobs
    gate = threading.Event()

    def list_jobs(*args: Any) -> Any:
        gate.wait(30)
        return slow_list(*args)

    monkeypatch.setattr(store.jobs, "list_jobs", list_jobs)
    with httpx.Client(base_url=server.url, timeout=30) as api:
        register(api, "w1")
        submit(api)
        listing = threading.Thread(target=lambda: httpx.get(f"{server.url}/jobs?limit=5000", timeout=30))
        listing.start()
        for send in (
            lambda: api.get("/healthz"),
            lambda: api.post("/workers/w1/heartbeat", json={}),
            lambda: api.get("/jobs/next", params={"worker_id": "w1"}),
        ):
            answer = send()
            assert answer.status_code == 200, answer.text
        assert listing.is_alive()  # still listing: the answers above did not wait for it
        gate.set()
        listing.join(10)


def test_a_loop_pass_runs_on_its_own_thread():
    """A pass blocked in its work (here: until the test lets it go) leaves the event loop free,
    and a wake-up may come from any thread."""
    passes: list[str] = []
    entered, gate = threading.Event(), threading.Event()

    def tick() -> None:
        entered.set()
        gate.wait(30)
        passes.append(threading.current_thread().name)

    async def run() -> int:
        group = LoopGroup([Loop("slow", 0.01, tick, jitter=0)], Metrics())
        group.start(on_death=lambda name, error: None)
        assert await asyncio.to_thread(entered.wait, 30), "the pass never started"
        turns = 0
        for _ in range(5):  # the event loop turns while the pass is blocked
            await asyncio.sleep(0)
            threading.Thread(target=group.wake, args=("slow",)).start()
            turns += 1
        assert not passes, "the pass is still blocked"
        gate.set()
        await group.stop()
        return turns

    assert asyncio.run(run()) == 5
    assert passes and all(name.startswith("corral-loop-slow") for name in passes)


def test_a_long_list_is_streamed_in_pieces_and_reads_as_one_page(api):
    """Past 500 jobs the list is sent in pieces: the same items, order and cursor as pages."""
    response = api.post("/jobs/batch", json={"jobs": [{"command": "true"} for _ in range(1100)]})
    assert response.status_code == 201
    paged, after = [], None
    while True:
        page = api.get("/jobs", params={"limit": 500, **({"after": after} if after else {})}).json()
        paged += [item["id"] for item in page["items"]]
        if not (after := page["next"]):
            break
    first = api.get("/jobs", params={"limit": 1000})
    assert first.status_code == 200 and first.headers["content-type"] == "application/json"
    body = first.json()
    assert [item["id"] for item in body["items"]] == paged[:1000]
    rest = api.get("/jobs", params={"limit": 1000, "after": body["next"]}).json()
    assert [item["id"] for item in rest["items"]] == paged[1000:] and rest["next"] is None
    whole = api.get("/jobs", params={"limit": 5000, "status": "pending"}).json()
    assert [item["id"] for item in whole["items"]] == paged and whole["next"] is None
    exact = api.get("/jobs", params={"limit": 1100}).json()
    assert len(exact["items"]) == 1100 and exact["next"] is not None
    assert api.get("/jobs", params={"limit": 1000, "after": exact["next"]}).json() == {
        "items": [],
        "next": None,
    }


def test_sqlite_writers_take_turns_first_come_first_served():
    from corral.store.sqlite import _TakingTurns

    turns = _TakingTurns()
    assert turns.acquire(timeout=1)
    assert not turns.acquire(timeout=0.05)  # held: a waiter gives up after its timeout
    order: list[int] = []

    def writer(index: int) -> None:
        assert turns.acquire(timeout=5)
        order.append(index)
        turns.release()

    waiting = []
    for index in range(4):
        thread = threading.Thread(target=writer, args=(index,))
        thread.start()
        waiting.append(thread)
        time.sleep(0.02)  # queued in this order
    turns.release()
    for thread in waiting:
        thread.join(5)
    assert order == [0, 1, 2, 3]
    assert turns.acquire(timeout=0.05)


def test_store_threads_zero_runs_the_store_on_the_event_loop(store_url, clock):
    """``CORRAL_STORE_THREADS=0``: the old way (no thread crossing), the same answers."""
    from corral.config import ServerSettings

    server_store = open_store(store_url)
    try:
        with (
            ServerThread(server_store, ServerSettings(store_threads=0), clock) as running,
            httpx.Client(base_url=running.url, timeout=10) as api,
        ):
            assert not running.state.executor.has_threads
            register(api, "w1")
            job = submit(api)
            claimed = claim(api, "w1")
            done = api.post(
                f"/jobs/{job['id']}/done", params={"worker_id": "w1", "attempt": claimed["attempt"]}
            )
            assert done.json()["status"] == "done"
            assert api.get("/jobs", params={"limit": 1000}).json()["items"][0]["status"] == "done"
    finally:
        server_store.close()


def test_a_batch_of_final_reports_on_a_locked_store_answers_each_report_busy(busy_server, store_url):
    """Each report of the batch is answered 503 ``store_busy`` as its own route would be (the worker
    sends those again), nothing of it applied; once the lock is gone the same batch goes through."""
    with httpx.Client(base_url=busy_server.url, timeout=30) as api:
        register(api)
        jobs = [submit(api) for _ in range(2)]
        for _ in jobs:
            claim(api)
        items = [{"job_id": job["id"], "attempt": 1, "outcome": "done"} for job in jobs]
        with locked(store_url):
            busy = api.post("/workers/w1/reports", json={"reports": items})
        assert busy.status_code == 200, busy.text
        answers = busy.json()["items"]
        assert [(answer["status"], answer["error"]["code"]) for answer in answers] == [
            (503, "store_busy")
        ] * 2
        assert {api.get(f"/jobs/{job['id']}").json()["status"] for job in jobs} == {"running"}
    # the store is known to have failed until a write commits again: the worker's client sends the
    # request again while the server refuses it (503 with Retry-After), until it goes through
    with WorkerClient(busy_server.url) as worker:
        assert worker.final_reports("w1", items) == [None, None]
