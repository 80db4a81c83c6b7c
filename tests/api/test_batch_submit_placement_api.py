"""Where a submission's store work runs (``executor``): a batch (thousands of jobs decoded, checked
and inserted) is long work in Python, so it runs with the short switch interval and counts as long
work beside the event loop, which then sends its short calls (heartbeats) to the store threads; a
single submit is ordinary store work. As ordinary store work a 20,000-job submit kept the
interpreter for 5 ms slices at each of the loop's waits on PostgreSQL and left its replica a
heartbeat backlog of seconds (``bench/fleet.py --timeline``, issue 26)."""

from __future__ import annotations

import sys
import threading
from typing import Any

import httpx
import pytest

from corral.server import switching
from corral.server.routes import jobs as job_routes


@pytest.fixture
def placements(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, str, bool, float]]:
    """For each submission's store work: batch or not, its thread, whether long work ran beside
    the loop meanwhile, and the switch interval."""
    seen: list[tuple[bool, str, bool, float]] = []
    store_submission = job_routes._store_submission

    def recorded(state: Any, body: bytes, batch: bool, *args: Any) -> Any:
        seen.append(
            (batch, threading.current_thread().name, switching.long_work_beside(), sys.getswitchinterval())
        )
        return store_submission(state, body, batch, *args)

    monkeypatch.setattr(job_routes, "_store_submission", recorded)
    return seen


def test_a_batch_submit_is_long_work_and_a_single_one_is_not(
    api: httpx.Client, server: Any, placements: list[tuple[bool, str, bool, float]]
) -> None:
    normal_s = sys.getswitchinterval()
    response = api.post("/jobs/batch", json={"jobs": [{"command": "true"}, {"command": "true"}]})
    assert response.status_code == 201, response.text
    response = api.post("/jobs", json={"command": "true"})
    assert response.status_code == 201, response.text
    [batched, single] = placements
    batch, batch_thread, batch_long, batch_interval = batched
    short_s = min(server.state.settings.switch_interval_s, normal_s)
    assert batch and batch_thread.startswith("corral-store") and batch_long and batch_interval == short_s
    assert not single[0] and single[1].startswith("corral-store") and not single[2]
    assert single[3] == normal_s
    assert not switching.long_work_beside(), "no long work once the batch is stored"
