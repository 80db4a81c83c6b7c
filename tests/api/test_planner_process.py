"""The admission pass planned in a process of its own (``loops.planner``), on SQLite and PostgreSQL:
the same plan as a pass on the server's thread, a child that died replaced at the next pass, and
none left once the server closed it."""

from __future__ import annotations

import os
import signal

import pytest

from corral.config import ServerSettings
from corral.core.placement import CycleMemo
from corral.domain.records import JobSpec
from corral.domain.resources import Resources
from corral.server.loops.admission import PlanSettings, plan_pass
from corral.server.loops.planner import PlannerConfig, PlannerGone, PlannerProcess
from corral.server.state import ServerState
from corral.testing.clock import FakeClock
from tests.contract import protocol
from tests.contract.test_store import NOW, POLICY, register, submit_one


def _settings(store) -> PlanSettings:
    return PlanSettings.of(ServerState(store, ServerSettings(store_threads=0), FakeClock(NOW)))


def _cluster(store) -> str:
    """Two 2-GPU workers, one GPU busy on each, and a 2 x 1-GPU gang that fits."""
    for worker_id in ("w1", "w2"):
        register(store, worker_id, gpus=2, vram_mb=1000)
        submit_one(store, resources=Resources(gpus=1))
        store.claim_many(worker_id, NOW, POLICY, 1)
    fits = protocol.submit(
        store, [JobSpec(command="train", gang_size=2, resources=Resources(gpus=1))], NOW + 1
    )
    return fits.items[0].gang_id


@pytest.fixture
def planner(store, store_url):
    process = PlannerProcess(PlannerConfig(store_url, 5.0, "warning", _settings(store)))
    yield process
    process.close()


def test_the_planner_process_plans_what_the_server_thread_would(store, planner):
    fits = _cluster(store)
    here = plan_pass(store, _settings(store), CycleMemo(), {}, NOW + 10)
    there = planner.plan(NOW + 10, {})
    assert there == here
    assert [reservation.gang_id for reservation in there.decisions.reservations] == [fits]
    assert there.gangs_waiting
    # the child keeps its records and memo between passes: the same plan again
    assert planner.plan(NOW + 11, {}) == plan_pass(store, _settings(store), CycleMemo(), {}, NOW + 11)


class _EndsTheChild:
    """Unpickled by the child as it reads the request: the child exits mid-pass."""

    def __reduce__(self):
        return (os._exit, (3,))


def test_a_planner_that_died_mid_pass_fails_that_pass_and_is_replaced(store, planner):
    _cluster(store)
    first = planner.plan(NOW + 10, {})
    process = planner._process
    with pytest.raises(PlannerGone):
        planner.plan(_EndsTheChild(), {})  # type: ignore[arg-type]
    assert process is not None and process.wait(10) == 3
    assert planner.plan(NOW + 12, {}).decisions == first.decisions
    assert planner._process is not None and planner._process.pid != process.pid


def test_a_planner_killed_between_passes_is_replaced_before_the_next(store, planner):
    _cluster(store)
    first = planner.plan(NOW + 10, {})
    process = planner._process
    assert process is not None
    os.kill(process.pid, signal.SIGKILL)
    process.wait(10)
    assert planner.plan(NOW + 12, {}).decisions == first.decisions
    assert planner._process is not None and planner._process.pid != process.pid


def test_an_error_in_the_pass_is_the_pass_error_and_the_child_stays(store, planner):
    _cluster(store)
    planner.plan(NOW + 10, {})
    process = planner._process
    with pytest.raises(TypeError):
        planner.plan("not an instant", {})  # type: ignore[arg-type]
    assert planner._process is process and process.poll() is None
    assert planner.plan(NOW + 12, {}).decisions.reservations


def test_a_closed_planner_leaves_no_child_and_starts_none(store, planner):
    _cluster(store)
    planner.plan(NOW + 10, {})
    process = planner._process
    planner.close()
    assert process is not None and process.poll() is not None, "the child ended with its input"
    with pytest.raises(PlannerGone):
        planner.plan(NOW + 11, {})
    assert planner._process is None
