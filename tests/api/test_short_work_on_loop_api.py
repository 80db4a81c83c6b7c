"""PostgreSQL's short work (a claim, a report, a heartbeat) runs on the event loop itself, its waits
on the database the loop's (``corral.store.on_loop``, issue 26 item 3): no store thread crossing
per call. What must keep holding: a heartbeat held up by a lock holds up no other request, a
heartbeat whose lock waits add up (in one round trip) is answered as on a store thread, never 503
for work the database committed, a statement's error leaves the session's connection and its
transaction as a store thread leaves them, a connection lost is a 503 and the next call
reconnects, and ``store_on_loop`` false puts the work back on the store threads."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
import psycopg
import pytest

from corral.config import ServerSettings
from corral.store import on_loop, open_store
from corral.testing.server import ServerThread

from ..conftest import postgres_schema_url
from .conftest import claim, error_code, register, submit

pytestmark = pytest.mark.skipif(not on_loop.available(), reason="greenlet is not installed")

T = TypeVar("T")

#: a lock wait no request of a test outlasts: a heartbeat waits on the row until the test lets it go
PATIENT_S = 60.0


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from postgres_schema_url()


def serve(url: str, clock: Any, busy_timeout_s: float = PATIENT_S, **settings: Any) -> Iterator[ServerThread]:
    server_store = open_store(url, busy_timeout_s=busy_timeout_s)
    settings.setdefault("store_busy_timeout_s", busy_timeout_s)
    try:
        with ServerThread(server_store, ServerSettings(**settings), clock) as running:
            yield running
    finally:
        server_store.close()


@pytest.fixture
def pg_server(pg_url: str, clock: Any) -> Iterator[ServerThread]:
    yield from serve(pg_url, clock)


def record_threads(monkeypatch: pytest.MonkeyPatch, server: ServerThread) -> list[str]:
    """The thread each worker heartbeat's store call runs on, in order."""
    workers = server.state.store.workers
    heartbeat = workers.worker_heartbeat
    threads: list[str] = []

    def recorded(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return heartbeat(*args, **kwargs)

    monkeypatch.setattr(workers, "worker_heartbeat", recorded)
    return threads


def beat_with_jobs(api: httpx.Client, worker_id: str, leases: list[dict[str, Any]]) -> httpx.Response:
    jobs = [{"id": lease["id"], "attempt": lease["attempt"]} for lease in leases]
    running = [lease["id"] for lease in leases]
    return api.post(f"/workers/{worker_id}/heartbeat", json={"running": running, "jobs": jobs})


def test_a_heartbeat_runs_its_store_work_on_the_event_loop_not_a_store_thread(pg_server, monkeypatch):
    threads = record_threads(monkeypatch, pg_server)
    with httpx.Client(base_url=pg_server.url, timeout=30) as api:
        register(api, gpus=2)
        submit(api, resources={"gpus": 1})
        leases = [claim(api)]
        answer = beat_with_jobs(api, "w1", leases)
    assert answer.status_code == 200 and answer.json() == {"jobs": {leases[0]["id"]: {}}}, answer.text
    assert threads and not any(name.startswith("corral-store") for name in threads), threads


def test_with_store_on_loop_false_the_heartbeat_goes_to_a_store_thread(pg_url, clock, monkeypatch):
    for server in serve(pg_url, clock, store_on_loop=False):
        threads = record_threads(monkeypatch, server)
        with httpx.Client(base_url=server.url, timeout=30) as api:
            register(api)
            assert api.post("/workers/w1/heartbeat", json={}).status_code == 200
        assert threads and all(name.startswith("corral-store") for name in threads), threads


def test_a_heartbeat_waiting_on_its_workers_locked_row_holds_up_no_other_request(pg_server, pg_url):
    with httpx.Client(base_url=pg_server.url, timeout=PATIENT_S + 30) as api:
        register(api, "w1")
        register(api, "w2")
        with psycopg.connect(pg_url) as holder, ThreadPoolExecutor(1) as pool:
            holder.execute("SELECT id FROM workers WHERE id = 'w1' FOR UPDATE")
            held = pool.submit(api.post, "/workers/w1/heartbeat", json={})
            waiting = wait_for_a_lock_wait(pg_server, pg_url)
            # w1's heartbeat waits on the row, on the loop: the other worker, the probes, a
            # submit are all answered meanwhile
            assert api.post("/workers/w2/heartbeat", json={}).status_code == 200
            assert api.get("/healthz").status_code == 200
            assert api.post("/jobs", json={"command": "true"}).status_code == 201
            assert not held.done()
            holder.rollback()
            assert held.result().status_code == 200
    assert waiting


def wait_for_a_lock_wait(server: ServerThread, url: str) -> bool:
    """Until a session of ``server`` waits on a lock (the heartbeat sent is held)."""
    with psycopg.connect(url, autocommit=True) as watcher:
        for _ in range(600):
            pids = [connection.info.backend_pid for connection in connections_of(server)]
            row = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid = ANY(%s)",
                (pids,),
            ).fetchone()
            if row and row[0]:
                return True
            time.sleep(0.05)
    return False


def test_a_lost_connection_is_a_503_and_the_next_heartbeat_reconnects(pg_server, pg_url):
    health = pg_server.state.store_health
    with httpx.Client(base_url=pg_server.url, timeout=30) as api:
        register(api)
        assert api.post("/workers/w1/heartbeat", json={}).status_code == 200
        # PostgreSQL ends every session of this server (a restart, a failover)
        pids = [connection.info.backend_pid for connection in connections_of(pg_server)]
        with psycopg.connect(pg_url, autocommit=True) as admin:
            for pid in pids:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        lost = api.post("/workers/w1/heartbeat", json={})
        assert lost.status_code == 503 and error_code(lost) == "store_unavailable", lost.text
        # the refusals start a check of the store; it reconnects, and the heartbeats go through
        deadline = time.monotonic() + 30
        while (answer := api.post("/workers/w1/heartbeat", json={})).status_code != 200:
            assert answer.status_code == 503 and time.monotonic() < deadline, answer.text
            time.sleep(0.05)
    assert not health.failing


def connections_of(server: ServerThread) -> list[Any]:
    """The server store's open connections (the loop's sessions' among them)."""
    store = server.state.store
    with store._connections_lock:
        return [connection for connection in store._connections if not connection.closed]


#: the lock timeout of the tests whose statements wait on locks that are let go in time
BUSY_S = 3.0
#: rows locked, each let go ``0.3 * BUSY_S`` after the one before: every wait well under the lock
#: timeout (a loaded machine may be late by two seconds), their sum (in one pipeline: one wait
#: for its answer) past twice it and a second (the bound a wait on the loop once had)
HELD_ROWS = 10


def hold_rows_in_turn(url: str, holding: threading.Event) -> None:
    """Lock the scratch rows, each from a connection of its own, then let them go one by one."""
    holders = [psycopg.connect(url) for _ in range(HELD_ROWS)]
    try:
        for row, holder in enumerate(holders, 1):
            holder.execute("SELECT id FROM scratch WHERE id = %s FOR UPDATE", (row,))
        holding.set()
        for holder in holders:
            time.sleep(0.3 * BUSY_S)
            holder.rollback()
    finally:
        for holder in holders:
            holder.close()


@pytest.fixture
def briefly_locking_server(pg_url: str, clock: Any) -> Iterator[ServerThread]:
    """A server whose statements wait ``BUSY_S`` at most for a lock (then ``store_busy``)."""
    yield from serve(pg_url, clock, busy_timeout_s=BUSY_S)


def test_a_heartbeat_whose_lock_waits_add_up_in_one_round_trip_is_answered_and_written(
    briefly_locking_server, pg_url, monkeypatch
):
    """PostgreSQL answers a pipeline at its sync: one wait on the socket covers every statement's
    lock wait. Each is under the lock timeout, so on a store thread the work succeeds; on the loop
    it must too (it was answered 503 "nothing written" while the database committed it)."""
    server = briefly_locking_server
    store = server.state.store
    store.autocommit.execute("CREATE TABLE scratch (id int PRIMARY KEY, v int NOT NULL)")
    store.autocommit.execute(f"INSERT INTO scratch SELECT g, 0 FROM generate_series(1, {HELD_ROWS}) g")
    workers = store.workers
    heartbeat = workers.worker_heartbeat
    on_the_loop: list[bool] = []

    def with_grouped_writes(*args: Any, **kwargs: Any) -> Any:
        on_the_loop.append(on_loop.session() is not None)
        store.autocommit.together(
            [("UPDATE scratch SET v = v + 1 WHERE id = ?", (row,)) for row in range(1, HELD_ROWS + 1)]
        )
        return heartbeat(*args, **kwargs)

    with httpx.Client(base_url=server.url, timeout=PATIENT_S) as api:
        register(api)
        monkeypatch.setattr(workers, "worker_heartbeat", with_grouped_writes)
        holding = threading.Event()
        holder = threading.Thread(target=hold_rows_in_turn, args=(pg_url, holding))
        holder.start()
        try:
            assert holding.wait(30)
            answer = api.post("/workers/w1/heartbeat", json={})
        finally:
            holder.join()
    with psycopg.connect(pg_url) as reader:
        written = [row[0] for row in reader.execute("SELECT v FROM scratch ORDER BY id")]
    assert on_the_loop == [True]
    assert answer.status_code == 200, answer.text
    assert written == [1] * HELD_ROWS


def in_a_session_on_the_loop(work: Callable[[], T]) -> T:
    """``work()`` as the server runs a claim or a heartbeat on PostgreSQL: on the event loop in a
    session of its own."""

    async def main() -> T:
        with ThreadPoolExecutor(1, thread_name_prefix="test-store") as threads:
            return await on_loop.run(work, on_loop.Session(), threads)

    return asyncio.run(main())


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[Any]:
    store = open_store(pg_url, busy_timeout_s=PATIENT_S)
    try:
        yield store
    finally:
        store.close()


def test_a_statements_error_on_the_loop_keeps_the_connection_as_a_store_thread_does(pg_store):
    """A statement psycopg runs that fails (``1/0``; a lock timeout, a deadlock alike) was read
    whole: the connection stays, as on a store thread, and a savepoint that caught the error rolls
    back to it and the transaction goes on (the connection was closed under it)."""

    def savepointed() -> tuple[bool, str, Any]:
        connection = pg_store.connection()
        with pg_store._transaction() as transaction:
            transaction.execute("SELECT 1")
            transaction.execute("SAVEPOINT one_change")
            try:
                transaction.execute("SELECT 1/0")
            except psycopg.errors.DivisionByZero as error:
                caught = type(error).__name__
                transaction.execute("ROLLBACK TO SAVEPOINT one_change")
            transaction.execute("RELEASE SAVEPOINT one_change")
            after = transaction.execute("SELECT 42")
        return pg_store.connection() is connection and not connection.closed, caught, after

    def plain_error() -> bool:
        connection = pg_store.connection()
        with pytest.raises(psycopg.errors.DivisionByZero):
            pg_store.autocommit.execute("SELECT 1/0")
        return pg_store.connection() is connection and not connection.closed

    assert in_a_session_on_the_loop(savepointed) == (True, "DivisionByZero", [(42,)])
    assert in_a_session_on_the_loop(plain_error)
