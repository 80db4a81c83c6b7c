"""Long work in processes of their own (``offload.StoreProcess``), on SQLite and PostgreSQL: the
admission pass planned there is the plan a pass on the server's thread makes, the large lists read
there are the same bytes, a child that died is replaced at the next call (and a read it was doing
is done on a thread instead), and none is left once the server closed it."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import time

import pytest

from corral.config import ServerSettings
from corral.core.admission import CycleMemo
from corral.domain.records import JobSpec
from corral.domain.resources import Resources
from corral.server.app import create_app
from corral.server.executor import Work
from corral.server.loops.admission import PlanSettings, plan_in_process, plan_pass
from corral.server.offload import OffloadGone, StoreProcess, StoreProcessConfig
from corral.server.routes.jobs import job_chunk
from corral.server.routes.workers import worker_page
from corral.server.state import ServerState
from corral.store import open_store
from corral.store.base import JobFilter
from corral.testing.clock import FakeClock
from tests.contract import protocol
from tests.helpers import NOW, POLICY, register, submit_one


def _settings(store) -> PlanSettings:
    return PlanSettings.of(ServerState(store, ServerSettings(store_threads=0), FakeClock(NOW)))


def _cluster(store) -> str:
    """Two 2-GPU workers, one GPU busy on each, and a 2 x 1-GPU gang that fits."""
    for worker_id in ("w1", "w2"):
        register(store, worker_id, gpus=2, vram_mb=1000)
        submit_one(store, resources=Resources(gpus=1))
        store.claims.claim_many(worker_id, NOW, POLICY, 1)
    fits = protocol.submit(
        store, [JobSpec(command="train", gang_size=2, resources=Resources(gpus=1))], NOW + 1
    )
    return fits.items[0].gang_id


@pytest.fixture
def planner(store_url):
    process = StoreProcess(StoreProcessConfig(store_url, 5.0, "warning"), "planner")
    yield process
    process.close()


def _plan(planner: StoreProcess, store, now, last_preemptive=None):
    return planner.call(plan_in_process, _settings(store), last_preemptive or {}, FakeClock(now))


def test_the_planner_process_plans_what_the_server_thread_would(store, planner):
    fits = _cluster(store)
    here = plan_pass(store, _settings(store), CycleMemo(), {}, FakeClock(NOW + 10))
    there = _plan(planner, store, NOW + 10)
    assert there == here
    assert [reservation.gang_id for reservation in there.decisions.reservations] == [fits]
    assert there.gangs_waiting
    # the child keeps its records and memo between passes: the same plan again
    assert _plan(planner, store, NOW + 11) == plan_pass(
        store, _settings(store), CycleMemo(), {}, FakeClock(NOW + 11)
    )


class _EndsTheChild:
    """Unpickled by the child as it reads the request: the child exits mid-pass."""

    def __reduce__(self):
        return (os._exit, (3,))


def test_a_planner_that_died_mid_pass_fails_that_pass_and_is_replaced(store, planner):
    _cluster(store)
    first = _plan(planner, store, NOW + 10)
    process = planner._process
    with pytest.raises(OffloadGone):
        planner.call(plan_in_process, _settings(store), {}, _EndsTheChild())
    assert process is not None and process.wait(10) == 3
    assert _plan(planner, store, NOW + 12).decisions == first.decisions
    assert planner._process is not None and planner._process.pid != process.pid


def test_a_planner_killed_between_passes_is_replaced_before_the_next(store, planner):
    _cluster(store)
    first = _plan(planner, store, NOW + 10)
    process = planner._process
    assert process is not None
    os.kill(process.pid, signal.SIGKILL)
    process.wait(10)
    assert _plan(planner, store, NOW + 12).decisions == first.decisions
    assert planner._process is not None and planner._process.pid != process.pid


class _NotAnInstant:
    """A clock whose time is not a number: the pass fails inside the child."""

    def now(self) -> str:
        return "not an instant"


def test_an_error_in_the_pass_is_the_pass_error_and_the_child_stays(store, planner):
    _cluster(store)
    _plan(planner, store, NOW + 10)
    process = planner._process
    with pytest.raises(TypeError):
        planner.call(plan_in_process, _settings(store), {}, _NotAnInstant())
    assert planner._process is process and process.poll() is None
    assert _plan(planner, store, NOW + 12).decisions.reservations


def test_a_closed_planner_leaves_no_child_and_starts_none(store, planner):
    _cluster(store)
    _plan(planner, store, NOW + 10)
    process = planner._process
    planner.close()
    assert process is not None and process.poll() is not None, "the child ended with its input"
    with pytest.raises(OffloadGone):
        _plan(planner, store, NOW + 11)
    assert planner._process is None


def _note_pid(store, memory) -> None:
    memory["warmed_by"] = os.getpid()


def _warmed_by(store, memory) -> int | None:
    return memory.get("warmed_by")


def _warm_up_fails(store, memory) -> None:
    raise ValueError("warm-up failed")


def test_a_warm_up_runs_in_the_child_started_ahead(planner):
    planner.start(_note_pid)
    process = planner._process
    assert process is not None
    assert planner.call(_warmed_by) == process.pid
    assert planner._process is process


def test_a_warm_up_that_fails_is_logged_and_the_child_serves_the_next_call(planner, caplog):
    planner.start(_warm_up_fails)
    assert "store process warm-up failed" in caplog.text
    assert planner.call(_warmed_by) is None


def _sleeps(store, memory, seconds: float) -> None:
    time.sleep(seconds)


def test_a_call_past_the_timeout_stops_the_child_and_the_next_call_gets_a_new_one(store_url, caplog):
    process = StoreProcess(StoreProcessConfig(store_url, 5.0, "warning"), "reader")
    try:
        process.call(_sleeps, 0)  # the child's start, however long it takes on a loaded box
        process.timeout_s = 1.0
        stuck = process._process
        assert stuck is not None
        with pytest.raises(OffloadGone, match="did not answer within 1s"):
            process.call(_sleeps, 120)
        assert stuck.poll() is not None, "the stuck child was stopped"
        assert "store process did not answer in time; stopping it" in caplog.text
        process.timeout_s = None  # the new child's start
        assert process.call(_warmed_by) is None
        assert process._process is not None and process._process.pid != stuck.pid
    finally:
        process.close()


def test_an_answer_read_as_the_deadline_passes_is_kept_and_the_next_call_gets_a_new_child(
    store_url, monkeypatch
):
    """The timer may fire between the answer's read and its cancel (the caller's thread off the
    CPU): the answer stands, and the child the timer killed is not the next call's (a batch sent
    to it would be answered 503 without ever reaching a writer)."""
    from corral.server import offload

    process = StoreProcess(StoreProcessConfig(store_url, 5.0, "warning"), "reader")
    try:
        process.call(_sleeps, 0)  # the child's start, however long it takes on a loaded box
        late = process._process
        assert late is not None
        read = offload.receive

        def read_then_descheduled(stream):
            answer = read(stream)
            time.sleep(1.0)  # past the deadline below, the answer already read
            return answer

        monkeypatch.setattr(offload, "receive", read_then_descheduled)
        process.timeout_s = 0.2
        assert process.call(_warmed_by) is None, "the answer read stands"
        monkeypatch.setattr(offload, "receive", read)
        assert process._process is None, "the killed child is not kept for the next call"
        assert late.poll() is not None
        process.timeout_s = None  # the new child's start
        assert process.call(_warmed_by) is None
        assert process._process is not None and process._process.pid != late.pid
    finally:
        process.close()


def test_a_child_started_ahead_serves_the_first_call_and_a_closed_one_starts_none(store, planner):
    _cluster(store)
    planner.start()
    process = planner._process
    assert process is not None and process.poll() is None
    assert _plan(planner, store, NOW + 10).decisions.reservations
    assert planner._process is process
    planner.close()
    planner.start()
    assert planner._process is None


def test_the_reader_process_encodes_the_same_lists(store, planner):
    _cluster(store)
    for _ in range(7):
        submit_one(store)
    assert planner.call(worker_page) == worker_page(store, {})
    everything = JobFilter()
    first = planner.call(job_chunk, everything, 4, None, None)
    assert first == job_chunk(store, {}, everything, 4, None, None)
    data, count, last = first
    assert count == 4 and data.count(b'"id":"j-') == 4
    assert planner.call(job_chunk, everything, 100, last, None) == job_chunk(
        store, {}, everything, 100, last, None
    )


def test_a_read_the_reader_could_not_do_is_done_on_a_thread(store, store_url, monkeypatch):
    _cluster(store)
    reader = StoreProcess(StoreProcessConfig(store_url, 5.0, "warning"), "reader")
    state = ServerState(store, ServerSettings(store_threads=2), FakeClock(NOW), reader_process=reader)
    try:
        expected = worker_page(store, {})
        assert asyncio.run(state.executor.run(Work.READ, worker_page)) == expected
        assert reader._process is not None, "read by the reader process"

        def gone(*args):
            raise OffloadGone("the reader process ended")

        monkeypatch.setattr(reader, "call", gone)
        assert asyncio.run(state.executor.run(Work.READ, worker_page)) == expected
    finally:
        asyncio.run(state.executor.close())


def test_a_child_that_cannot_open_the_store_is_gone_not_a_crash(tmp_path):
    broken = StoreProcess(
        StoreProcessConfig(f"sqlite:///{tmp_path}/missing/dir/c.db", 5.0, "warning"), "reader"
    )
    try:
        for _ in range(2):  # each call tries a new child
            with pytest.raises(OffloadGone):
                broken.call(worker_page)
    finally:
        broken.close()


def test_the_executor_plans_in_the_planner_process_what_it_plans_without_one(store, planner):
    """``Work.PLAN`` (the admission tick's call): the planner process where the server runs one,
    else the pass's own thread; the same plan either way."""
    _cluster(store)
    with_child = ServerState(store, ServerSettings(store_threads=0), FakeClock(NOW), planner_process=planner)
    without = ServerState(store, ServerSettings(store_threads=0), FakeClock(NOW))
    there = with_child.executor.call(Work.PLAN, plan_in_process, _settings(store), {}, FakeClock(NOW + 10))
    assert planner._process is not None, "planned by the planner process"
    here = without.executor.call(Work.PLAN, plan_in_process, _settings(store), {}, FakeClock(NOW + 10))
    assert there == here and here.decisions.reservations


def test_an_error_in_the_child_leaves_its_traceback_in_the_log(store, planner, capfd):
    """The server re-raises the child's error with its own traceback only (a traceback does not
    pickle): the child logs where in the work it was raised (an expected ``CorralError``, a 400 or
    a 409, is not logged)."""
    _cluster(store)
    _plan(planner, store, NOW + 10)
    with pytest.raises(TypeError):
        planner.call(plan_in_process, _settings(store), {}, _NotAnInstant())
    logged = capfd.readouterr().err
    assert "store process work raised" in logged and "plan_in_process" in logged
    assert '"helper": "planner"' in logged or '"helper":"planner"' in logged


def _first_threshold(store, memory) -> int:
    return gc.get_threshold()[0]


def test_a_child_collects_garbage_as_the_server_does(store_url):
    """The server's ``gc_threshold`` holds in its children too: the writer's batch allocates as
    much as a busy server does (with the interpreter's 700, ~1.3x the CPU on 10,000 jobs)."""
    settings = ServerSettings(gc_threshold=12_345)
    app = create_app(open_store(store_url), settings, store_url=store_url)
    state = app.state.corral
    try:
        children = [state.executor.planner, state.executor.reader]
        for child in children:
            assert child is not None and child.call(_first_threshold) == 12_345
    finally:
        for child in children:
            child.close()
        state.store.close()
