"""Reservations end to end (API.md "Time limits and reservations"): a real server, two real workers
of 2 GPUs, real jobs. A 2x2 gang blocked behind a 2-GPU job with a limit is planned at that limit;
a short job backfills the reserved room on the other worker, a job without a walltime does not,
and the gang starts within a cycle of the limit."""

from __future__ import annotations

from datetime import datetime

import pytest

from corral.client import Client
from tests.e2e.conftest import FAST_SERVER_FLAGS, wait_for, wait_status

pytestmark = pytest.mark.e2e

GPU_FLAGS = ("--gpus", "2", "--vram-mb", "16000", "--gpu-model", "FakeGPU")
LIMIT_S = 15


def _time(text: str | None) -> float:
    assert text is not None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_a_big_gang_is_planned_at_the_limit_and_short_work_backfills_its_room(
    start_server, start_worker
) -> None:
    server = start_server(*FAST_SERVER_FLAGS)
    start_worker(server.url, "w1", *GPU_FLAGS)
    with Client(server.url) as client:
        limited = client.submit_body(
            {"command": "exec sleep 60", "resources": {"gpus": 2}, "walltime_s": LIMIT_S}
        )["id"]
        running = wait_status(client, limited, {"running"}, 15)
        assert running["worker_id"] == "w1"
        start_worker(server.url, "w2", *GPU_FLAGS)
        gang = client.submit_body({"command": "sleep 1", "gang_size": 2, "resources": {"gpus": 2}})
        task = wait_for(
            lambda: (job := client.get_job(gang["tasks"][0]))["estimated_start_at"] and job,
            10,
            "the gang's estimated start",
        )
        assert task["estimated_start_at"] == running["deadline_at"]
        assert task["planned_workers"] == ["w1", "w2"]
        assert client.why(gang["tasks"][0])["reasons"][0]["code"] == "reserved_for_later"

        short = client.submit_body({"command": "sleep 1", "resources": {"gpus": 1}, "walltime_s": 2})["id"]
        backfilled = wait_status(client, short, {"running", "done"}, 10)
        assert backfilled["worker_id"] == "w2", "it ends before the gang starts"
        endless = client.submit_body({"command": "sleep 1", "resources": {"gpus": 1}})["id"]
        wait_status(client, short, {"done"}, 10)
        # A claim of w2 after ``endless`` was queued: the probe, queued behind it, starts there; the
        # claim takes the first job that fits in queue order, so it passed over ``endless``.
        probe = client.submit_body({"command": "sleep 1", "resources": {"gpus": 1}, "walltime_s": 2})["id"]
        probed = wait_status(client, probe, {"running", "done"}, 10)
        assert probed["worker_id"] == "w2"
        assert client.get_job(endless)["status"] == "pending"
        assert client.why(endless)["reasons"][0]["code"] == "backfill_refused"

        started = [
            wait_status(client, task_id, {"running", "done"}, LIMIT_S + 15) for task_id in gang["tasks"]
        ]
        deadline = _time(running["deadline_at"])
        for rank in started:
            assert deadline <= _time(rank["started_at"]) < deadline + 3, "within a cycle of the limit"
        later = wait_status(client, endless, {"running", "done"}, 20)
        assert _time(later["started_at"]) >= _time(started[0]["started_at"]), "it waited for the gang"
