"""Preemption end to end (seed 003): a real server, a real worker with one GPU, real jobs and signals.

A class-2 job that checkpoints runs; a class-7 job arrives. The admission cycle stops the class-2
job for it: its worker sends SIGUSR1, ``jobkit.on_checkpoint`` saves, the upload ends the checkpoint
phase, SIGTERM stops it, it goes back to the queue, the class-7 job runs on the GPU it freed, and
then the class-2 job resumes from the step it saved.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from corral.client import Client
from tests.e2e.conftest import FAST_SERVER_FLAGS, wait_for, wait_status

pytestmark = pytest.mark.e2e

GPU_WORKER_FLAGS = ("--gpus", "1", "--vram-mb", "16000", "--gpu-model", "FakeGPU")

LOW = """
import os, sys, time
from corral import jobkit

out = sys.argv[1]
attempt = os.environ["CORRAL_ATTEMPT"]
state = jobkit.load_checkpoint()
step = int(state) if state else 0
with open(f"{out}/start-{attempt}", "w") as marker:
    marker.write(str(step))


def save():
    with open(f"{out}/saved-{attempt}", "w") as marker:
        marker.write(str(step))
    return str(step).encode()


jobkit.on_checkpoint(save)
while step < 60:
    time.sleep(0.05)
    step += 1
    jobkit.beat(step)
with open(f"{out}/done", "w") as marker:
    marker.write(str(step))
"""


def test_a_class_7_job_takes_the_gpu_and_the_class_2_job_checkpoints_then_resumes(
    start_server, start_worker, tmp_path: Path
) -> None:
    server = start_server(*FAST_SERVER_FLAGS, "--checkpoint-timeout-s", "20")
    start_worker(server.url, "w0", *GPU_WORKER_FLAGS)
    script = tmp_path / "low.py"
    script.write_text(LOW)
    with Client(server.url) as client:
        low = client.submit_body(
            {
                "command": f"exec {sys.executable} {script} {tmp_path}",
                "resources": {"gpus": 1},
                "preemption_class": 2,
                "checkpoint": "auto",
            }
        )["id"]
        wait_for(lambda: (tmp_path / "start-1").exists(), 15, "the class-2 job to start")
        wait_for(lambda: client.get_job(low)["progress"], 10, "a progress beat")
        high = client.submit_body(
            {"command": f"echo ran > {tmp_path}/high", "resources": {"gpus": 1}, "preemption_class": 7}
        )["id"]

        saved = int(wait_for(lambda: _read(tmp_path / "saved-1"), 15, "the save SIGUSR1 asked for"))
        wait_status(client, high, {"done"}, 20)
        assert (tmp_path / "high").read_text().strip() == "ran"
        finished = wait_status(client, low, {"done"}, 30)
        assert finished["preempted_count"] == 1
        resumed_from = int((tmp_path / "start-2").read_text())
        assert resumed_from >= saved > 0, "the second attempt started from the step it saved"
        events = [(event.from_status, event.to, event.reason.code if event.reason else None)
                  for event in client.events(low)]  # fmt: skip
        assert ("running", "preempting", "preempted_priority") in events
        assert ("preempted", "pending", "preempted_requeued") in events
    metrics = httpx.get(f"{server.url}/metrics").text
    assert "corral_preemption_checkpoint_duration_seconds_count 1.0" in metrics
    assert "corral_preemption_failed_checkpoint_total 0.0" in metrics


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() and path.read_text() else None


def test_a_gang_of_three_is_made_room_for_by_exactly_the_minimal_set(
    start_server, start_worker, tmp_path: Path
) -> None:
    """Four one-GPU workers, three running class-2 jobs: a class-7 gang of three needs the idle
    worker and two victims, the newest (cheapest) two; the oldest runs on untouched."""
    server = start_server(*FAST_SERVER_FLAGS)
    for index in range(4):
        start_worker(server.url, f"w{index}", *GPU_WORKER_FLAGS)
    with Client(server.url) as client:
        wait_for(lambda: len(client.workers()) == 4, 10, "four workers")
        lows = []
        for index in range(3):
            job = client.submit_body(
                {"command": f"echo $CORRAL_ATTEMPT >> {tmp_path}/low-{index}; exec sleep 60",
                 "resources": {"gpus": 1}, "preemption_class": 2}
            )["id"]  # fmt: skip
            wait_status(client, job, {"running"}, 10)
            lows.append(job)
        gang = client.submit_body(
            {"command": f"echo $RANK > {tmp_path}/rank-$RANK", "gang_size": 3, "resources": {"gpus": 1},
             "preemption_class": 7}
        )  # fmt: skip
        for rank in range(3):
            wait_for(lambda rank=rank: (tmp_path / f"rank-{rank}").exists(), 20, f"rank {rank} to run")
        # A victim's count grows when it is re-queued, which may come after its worker is free.
        counts = lambda: [client.get_job(job)["preempted_count"] for job in lows]  # noqa: E731
        wait_for(lambda: sum(counts()) >= 2, 20, "both victims re-queued")
        preempted = [job for job, count in zip(lows, counts(), strict=True) if count == 1]
        assert preempted == lows[1:], "exactly the two newest were preempted"
        assert (tmp_path / "low-0").read_text().split() == ["1"], "the oldest was never touched"
        tasks = client.gang(gang["gang_id"]).tasks
        assert len({task.worker_id for task in tasks}) == 3
        for job in lows:
            client.cancel(job)
