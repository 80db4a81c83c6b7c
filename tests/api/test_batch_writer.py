"""``POST /jobs/batch`` in the writer process (``executor.Work.WRITE``), as ``corral server`` runs
it on PostgreSQL: the route's own cases hold there (validation, limits, arrays, dependencies,
topology, time limits), an Idempotency-Key replays and conflicts as on a thread, the work is the
child's (the server's process does none of the batch's Python), and a writer that ended mid-call
fails that call with 503 instead of writing the batch again on a thread."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

import pytest

from corral.config import ServerSettings
from corral.server import offload
from corral.server.executor import Work
from corral.store import open_store
from corral.testing.clock import FakeClock
from corral.testing.server import ServerThread
from tests.api.conftest import error_code, register
from tests.api.test_arrays_api import test_a_batch_may_hold_an_array_and_a_job_after_an_earlier_one  # noqa: F401
from tests.api.test_edges_api import test_a_batch_may_create_at_most_ten_thousand_tasks  # noqa: F401
from tests.api.test_jobs_api import test_batch_creates_all_or_nothing  # noqa: F401
from tests.api.test_topology_api import test_an_unknown_level_is_400_naming_the_field  # noqa: F401
from tests.conftest import postgres_schema_url


@pytest.fixture
def store_url() -> Iterator[str]:
    """PostgreSQL only: the server runs no writer on SQLite (``app.create_app``)."""
    yield from postgres_schema_url()


@pytest.fixture
def server(store_url: str, clock: FakeClock, settings: ServerSettings) -> Iterator[ServerThread]:
    """A live server that runs its child processes, as ``corral server`` does."""
    server_store = open_store(store_url)
    with ServerThread(server_store, settings, clock, store_url=store_url) as running:
        yield running
    server_store.close()


def _writer(server: ServerThread) -> offload.StoreProcess:
    writer = server.state.executor.writer
    assert writer is not None, "the server runs a writer on PostgreSQL"
    return writer


def test_the_batch_is_stored_by_the_writer_process(api, server):
    jobs = [{"command": f"job-{index}", "name": f"n{index}"} for index in range(50)]
    response = api.post("/jobs/batch", json={"jobs": jobs})
    assert response.status_code == 201, response.text
    assert response.headers["content-type"] == "application/json"
    items = response.json()["items"]
    assert [item["command"] for item in items] == [job["command"] for job in jobs]
    process = _writer(server)._process
    assert process is not None and process.pid != os.getpid(), "submitted by the writer process"
    stored = api.get(f"/jobs/{items[7]['id']}").json()
    assert stored == items[7]
    assert "corral_jobs_submitted_total 50.0" in api.get("/metrics").text


def test_the_writer_starts_with_the_server_not_at_the_first_batch(api, server):
    waits = server.state.executor._writer_waits
    assert waits is not None
    waits.submit(lambda: None).result(30)  # its one thread ran the start submitted before this
    process = _writer(server)._process
    assert process is not None and process.poll() is None, "started before any batch"
    assert api.post("/jobs/batch", json={"jobs": [{"command": "a"}]}).status_code == 201
    assert _writer(server)._process is process, "the first batch used the child started with the server"


def test_an_idempotency_key_replays_and_conflicts_through_the_writer(api, server):
    headers = {"Idempotency-Key": "batch-1"}
    body = {"jobs": [{"command": "a"}, {"command": "b", "gang_size": 2}]}
    first = api.post("/jobs/batch", json=body, headers=headers)
    again = api.post("/jobs/batch", json=body, headers=headers)
    assert first.status_code == again.status_code == 201
    assert [item.get("id", item.get("gang_id")) for item in again.json()["items"]] == [
        item.get("id", item.get("gang_id")) for item in first.json()["items"]
    ]
    assert len(api.get("/jobs").json()["items"]) == 3
    other = api.post("/jobs/batch", json={"jobs": [{"command": "c"}]}, headers=headers)
    assert (other.status_code, error_code(other)) == (409, "conflict")


def test_a_writer_that_ended_mid_batch_is_503_and_the_next_batch_starts_another(api, server, monkeypatch):
    assert api.post("/jobs/batch", json={"jobs": [{"command": "warm"}]}).status_code == 201
    writer = _writer(server)
    first = writer._process
    assert first is not None
    real_call = writer.call

    def killed_mid_call(*args):
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        return real_call(*args)

    monkeypatch.setattr(writer, "call", killed_mid_call)
    # the child is found dead as this call starts, so it is replaced and the batch goes through
    assert api.post("/jobs/batch", json={"jobs": [{"command": "after"}]}).status_code == 201
    monkeypatch.undo()

    def gone(*args):
        raise offload.OffloadGone("the writer process ended (the pipe closed)")

    monkeypatch.setattr(writer, "call", gone)
    lost = api.post("/jobs/batch", json={"jobs": [{"command": "lost"}]})
    assert (lost.status_code, error_code(lost)) == (503, "store_unavailable")
    assert sorted(job["command"] for job in api.get("/jobs").json()["items"]) == ["after", "warm"], (
        "not written again on a thread"
    )


@pytest.mark.parametrize("settings", [ServerSettings(store_process_timeout_s=123)])
def test_the_child_processes_take_the_timeout_setting(server):
    executor = server.state.executor
    assert [child.timeout_s for child in (executor.planner, executor.reader, executor.writer)] == [123] * 3


def test_a_stuck_writer_is_stopped_past_its_timeout_and_the_next_batch_goes_through(api, server):
    """A writer that stops answering (here frozen with SIGSTOP) holds its batch only until the
    timeout (``CORRAL_STORE_PROCESS_TIMEOUT_S``, made 2 s once the writer has started: its start
    counts too, seconds on a loaded box): then it is killed, the batch answered 503 (whether it was
    written is not known), and a new writer takes the next one."""
    assert api.post("/jobs/batch", json={"jobs": [{"command": "warm"}]}).status_code == 201
    _writer(server).timeout_s = 2.0
    stuck = _writer(server)._process
    assert stuck is not None
    os.kill(stuck.pid, signal.SIGSTOP)
    try:
        held = api.post("/jobs/batch", json={"jobs": [{"command": "held"}]})
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stuck.pid, signal.SIGCONT)
    assert (held.status_code, error_code(held)) == (503, "store_unavailable")
    message = held.json()["error"]["message"]
    assert "did not answer within 2s" in message and "look for its jobs (GET /jobs)" in message
    assert stuck.wait(10) == -signal.SIGKILL
    _writer(server).timeout_s = None  # the new writer's start
    assert api.post("/jobs/batch", json={"jobs": [{"command": "after"}]}).status_code == 201
    assert _writer(server)._process is not None and _writer(server)._process.pid != stuck.pid
    assert sorted(job["command"] for job in api.get("/jobs").json()["items"]) == ["after", "warm"]


def test_a_pool_set_just_before_limits_the_batch_in_the_writer(api, server):
    """The writer reads the pools as they stand: a pool's maximum set a moment ago holds."""
    assert api.post("/jobs/batch", json={"jobs": [{"command": "warm"}]}).status_code == 201
    assert api.put("/pools/team", json={"max_walltime_s": 7200}).status_code == 200
    jobs = [{"command": "true", "pool": "team"}, {"command": "true", "pool": "team", "walltime_s": 7201}]
    refused = api.post("/jobs/batch", json={"jobs": jobs})
    assert (refused.status_code, error_code(refused)) == (400, "invalid_request")
    assert "jobs.1.walltime_s" in refused.json()["error"]["message"]
    taken = api.post("/jobs/batch", json={"jobs": jobs[:1]})
    assert taken.status_code == 201, taken.text


def test_a_writer_that_ended_leaves_the_replica_taking_writes(api, server, monkeypatch):
    """The writer's end is not the store's failure: noted as one, the replica would refuse every
    write (a registration, a heartbeat, a submit) with 503 until a check of the store committed."""
    writer = _writer(server)

    def gone(*args):
        raise offload.OffloadGone("the writer process ended (the pipe closed)")

    monkeypatch.setattr(writer, "call", gone)
    lost = api.post("/jobs/batch", json={"jobs": [{"command": "lost"}]})
    assert (lost.status_code, error_code(lost)) == (503, "store_unavailable")
    assert "Retry-After" not in lost.headers, "whether it was applied is not known: no blind retry"
    monkeypatch.undo()
    assert not server.state.store_health.failing
    registered = api.post(
        "/workers/register", json={"id": "w1", "address": "127.0.0.1", "resources": {"cpus": 8}}
    )
    assert registered.status_code == 201, registered.text
    assert api.post("/jobs", json={"command": "true"}).status_code == 201


@pytest.mark.parametrize("settings", [ServerSettings(store_threads=2)])
def test_batches_waiting_for_the_writer_hold_no_store_thread(api, server, settings, monkeypatch):
    """The writer takes one batch at a time: the batches behind a long one (here, a writer that
    does not answer) wait for it without parking the store threads, so a single submit, a
    registration still go through meanwhile."""
    writer, executor = _writer(server), server.state.executor
    release, entered = threading.Event(), threading.Event()
    real_call, real_run = writer.call, executor.run
    handed: list[object] = []

    def stuck(*args):
        entered.set()
        release.wait(30)
        return real_call(*args)

    async def counted(work, *args, **kwargs):
        if work is Work.WRITE:
            handed.append(work)
            if len(handed) == 3:
                all_handed.set()
        return await real_run(work, *args, **kwargs)

    all_handed = threading.Event()
    monkeypatch.setattr(writer, "call", stuck)
    monkeypatch.setattr(executor, "run", counted)
    answers: list[int] = []

    def batch(index: int) -> None:
        answers.append(
            api.post("/jobs/batch", json={"jobs": [{"command": f"b{index}"}]}, timeout=60).status_code
        )

    senders = [threading.Thread(target=batch, args=(index,)) for index in range(3)]
    try:
        for sender in senders:
            sender.start()
        assert entered.wait(30) and all_handed.wait(30), "three batches handed to the writer"
        assert api.post("/jobs", json={"command": "single"}, timeout=20).status_code == 201
        registered = api.post(
            "/workers/register",
            json={"id": "w1", "address": "127.0.0.1", "resources": {"cpus": 8}},
            timeout=20,
        )
        assert registered.status_code == 201
    finally:
        release.set()
        for sender in senders:
            sender.join(60)
    assert answers == [201, 201, 201]


def test_the_writer_weighs_a_batch_against_the_workers_registered_just_before(api, server):
    """The writer keeps the workers' verdicts as the server does: a worker registered or gone on
    this replica a moment ago counts for the next batch (``workers_generation``)."""

    def batched_reason() -> str:
        response = api.post("/jobs/batch", json={"jobs": [{"command": "true", "resources": {"gpus": 16}}]})
        assert response.status_code == 201, response.text
        return response.json()["items"][0]["reason"]["code"]

    register(api, "w1", gpus=8)
    assert batched_reason() == "unschedulable"
    register(api, "big", gpus=16)
    assert batched_reason() == "queued"
    assert api.post("/workers/big/leave").status_code == 200
    assert batched_reason() == "unschedulable"
