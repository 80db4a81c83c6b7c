"""Time limits end to end (API.md "Time limits"): a real server, a real worker, real jobs and
signals. ``walltime_s`` is a limit: the worker ends the attempt at it, the job fails with reason
``walltime_exceeded`` and is not retried; a job that checkpoints gets the hint first, and what it
saved is kept."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

import pytest

from corral.client import Client
from tests.e2e.conftest import FAST_SERVER_FLAGS, wait_for, wait_status

pytestmark = pytest.mark.e2e


def _time(text: str | None) -> float:
    assert text is not None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_a_job_past_its_walltime_is_ended_failed_and_not_retried(
    start_server, start_worker, tmp_path: Path
) -> None:
    server = start_server(*FAST_SERVER_FLAGS)
    start_worker(server.url, "w0")
    with Client(server.url) as client:
        job = client.submit_body(
            {"command": f"echo $$ > {tmp_path}/pid-$CORRAL_ATTEMPT; exec sleep 60", "walltime_s": 2,
             "max_retries": 3}
        )["id"]  # fmt: skip
        running = wait_status(client, job, {"running"}, 15)
        assert _time(running["deadline_at"]) == pytest.approx(_time(running["started_at"]) + 2, abs=0.01)
        failed = wait_status(client, job, {"failed", "done", "pending"}, 20)
        assert failed["status"] == "failed", failed
        assert failed["reason"]["code"] == "walltime_exceeded"
        assert failed["attempts"] == 1, "a job that reached its own limit is not retried"
        assert failed["deadline_at"] is None
        assert "walltime exceeded" in (failed["error"] or "")
        ran_s = _time(failed["finished_at"]) - _time(failed["started_at"])
        assert 2 <= ran_s < 15, "ended at its limit, not by sleep 60"
        assert not (tmp_path / "pid-2").exists()


CHECKPOINTING = """
import os, sys, time
from corral import jobkit

out = sys.argv[1]
step = 0


def save():
    with open(f"{out}/saved", "w") as marker:
        marker.write(str(step))
    return str(step).encode()


jobkit.on_checkpoint(save)
with open(f"{out}/started", "w") as marker:
    marker.write("1")
while True:
    time.sleep(0.05)
    step += 1
"""


def test_a_checkpointing_job_gets_the_hint_before_its_limit_and_keeps_its_checkpoint(
    start_server, start_worker, tmp_path: Path
) -> None:
    server = start_server(*FAST_SERVER_FLAGS)
    start_worker(server.url, "w0", "--walltime-warning-s", "2")
    script = tmp_path / "job.py"
    script.write_text(CHECKPOINTING)
    with Client(server.url) as client:
        job = client.submit_body(
            {"command": f"exec {sys.executable} {script} {tmp_path}", "walltime_s": 4, "checkpoint": "auto"}
        )["id"]
        wait_for(lambda: (tmp_path / "started").exists(), 15, "the job to start")
        saved = wait_for(
            lambda: (tmp_path / "saved").exists() and (tmp_path / "saved").read_text(), 15, "the hint"
        )
        assert client.get_job(job)["status"] == "running", "the hint comes before the limit"
        failed = wait_status(client, job, {"failed", "done", "pending"}, 20)
        assert failed["status"] == "failed" and failed["reason"]["code"] == "walltime_exceeded"
        assert failed["attempts"] == 1
        assert failed["has_checkpoint"]
        assert client.download_checkpoint(job) == saved.encode()
