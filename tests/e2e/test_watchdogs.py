"""The watchdogs end to end: a real server, real workers with tiny settings, real jobs, and a
``fake:`` GPU sampler whose file each test rewrites to make the GPU idle or busy.

Also, with real processes but no server: a job run's trip report (a fake client), and GPUs marked
unhealthy when a killed job will not die.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from corral.client import Client
from corral.config import WorkerSettings
from corral.testing.fake_client import FakeClient, claim_answer
from corral.worker import executor
from corral.worker.agent import Agent
from corral.worker.job_run import JobRun
from corral.worker.resources import Offer
from corral.worker.samplers import Samplers
from corral.worker.samplers.fake import FakeGpuSampler
from corral.worker.samplers.process import ProcessTreeSampler
from tests.e2e.conftest import ServerProcess, process_gone, wait_for, wait_status

pytestmark = pytest.mark.e2e

WATCHDOG_FLAGS = [
    "--stall-timeout-s", "1",
    "--stall-confirm-poll-s", "0.1",
    "--gpu-health-grace-s", "1",
    "--gpu-health-window-s", "1",
    "--heartbeat-s", "0.2",
    "--preempt-grace-s", "0.3",
]  # fmt: skip
GPU_FLAGS = ["--gpus", "1", "--vram-mb", "1000", "--gpu-model", "FakeGPU"]
# The GPU-health watchdog out of the way, for tests about the stall watchdog on a GPU job.
NO_HEALTH_FLAGS = ["--gpu-health-grace-s", "60", "--gpu-health-window-s", "60"]


def set_gpu(path: Path, util_pct: float, mem_used_mb: float = 1000) -> None:
    """Rewrite the fake sampler's file atomically (a reader never sees half of it)."""
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps({"util_pct": util_pct, "mem_used_mb": mem_used_mb}))
    partial.replace(path)


def watchdog_events(client: Client, job_id: str) -> list[dict[str, Any]]:
    return [e for e in client.events(job_id) if (e["reason"] or {}).get("code", "").startswith("watchdog")]


def wait_trips(client: Client, job_id: str, count: int, timeout_s: float = 10) -> list[dict[str, Any]]:
    return wait_for(
        lambda: (events := watchdog_events(client, job_id)) and len(events) >= count and events,
        timeout_s,
        f"{count} watchdog trip(s) of {job_id}",
    )


# The first attempt wedges; the re-run after the trip finishes at once, so the job ends done with
# exactly one trip behind it.
FIRST_ATTEMPT_ONLY = '[ "$CORRAL_ATTEMPT" = 1 ] || exit 0; '


def start_watched_worker(start_worker, server: ServerProcess, gpu_file: Path, *flags: str):
    return start_worker(server.url, "w1", *WATCHDOG_FLAGS, "--gpu-sampler", f"fake:{gpu_file}", *flags)


def test_budget_trip_stops_the_job_and_requeues_it(server, client: Client, start_worker, tmp_path: Path):
    worker = start_watched_worker(start_worker, server, tmp_path / "gpu.json")
    command = f"{FIRST_ATTEMPT_ONLY}echo $$ > {tmp_path}/pid; exec sleep 30"
    job = client.submit_body({"command": command, "budget_s": 1})

    done = wait_status(client, job["id"], {"done", "failed"})

    # Two runs, one counted attempt: the trip spent the watchdog cap, not one of max_retries.
    assert (done["status"], done["watchdog_retries"], done["attempts"]) == ("done", 1, 1), done
    [trip] = watchdog_events(client, job["id"])
    assert (trip["from"], trip["to"], trip["attempt"]) == ("running", "pending", 1)
    assert trip["reason"]["code"] == "watchdog_budget"
    assert "budget" in trip["reason"]["message"]
    assert process_gone(int((tmp_path / "pid").read_text()))
    log = worker.log()
    assert "watchdog tripped; stopping the job" in log and "watchdog trip reported" in log
    assert "fail report" not in log and "done report" not in log


def test_stall_trips_an_idle_job_and_spares_a_busy_one(server, client: Client, start_worker, tmp_path: Path):
    gpu_file = tmp_path / "gpu.json"
    set_gpu(gpu_file, util_pct=90)
    worker = start_watched_worker(start_worker, server, gpu_file, *GPU_FLAGS, *NO_HEALTH_FLAGS)
    command = f'{FIRST_ATTEMPT_ONLY}echo 1 > "$CORRAL_BEAT_FILE"; echo up > {tmp_path}/up; exec sleep 30'
    job = client.submit_body({"command": command, "resources": {"gpus": 1}})
    wait_for(lambda: (tmp_path / "up").exists(), 10, "the job to start")

    # Busy GPU: the stall is suspected every ~1.2 s and cleared; the job keeps running.
    wait_for(lambda: worker.log().count("stall suspected but the job is busy") >= 2, 10, "two suspicions")
    running = client.get_job(job["id"])
    assert (running["status"], running["watchdog_retries"], running["attempts"]) == ("running", 0, 1)

    set_gpu(gpu_file, util_pct=0)
    trip = wait_trips(client, job["id"], 1, timeout_s=5)[0]

    assert trip["reason"]["code"] == "watchdog_stall"
    assert '"gpu_util_max_pct":0' in trip["reason"]["message"].replace(" ", "")
    done = wait_status(client, job["id"], {"done", "failed"})
    assert (done["status"], done["watchdog_retries"]) == ("done", 1), done


def test_gpu_health_trips_a_gpu_job_with_an_idle_gpu(server, client: Client, start_worker, tmp_path: Path):
    gpu_file = tmp_path / "gpu.json"
    set_gpu(gpu_file, util_pct=0)
    start_watched_worker(start_worker, server, gpu_file, *GPU_FLAGS)
    job = client.submit_body({"command": f"{FIRST_ATTEMPT_ONLY}exec sleep 30", "resources": {"gpus": 1}})

    done = wait_status(client, job["id"], {"done", "failed"})

    assert (done["status"], done["watchdog_retries"]) == ("done", 1), done
    [trip] = watchdog_events(client, job["id"])
    assert trip["reason"]["code"] == "watchdog_gpu_health"


def test_trips_requeue_up_to_the_cap_then_fail(start_server, start_worker, tmp_path: Path):
    server: ServerProcess = start_server("--watchdog-max-retries", "1")
    start_watched_worker(start_worker, server, tmp_path / "gpu.json")
    with Client(server.url) as client:
        job = client.submit_body({"command": "exec sleep 30", "budget_s": 0.5})
        failed = wait_status(client, job["id"], {"failed"}, timeout_s=10)
        trips = watchdog_events(client, job["id"])

    assert failed["watchdog_retries"] == 1
    assert [(trip["from"], trip["to"]) for trip in trips] == [("running", "pending"), ("running", "failed")]
    assert all(trip["reason"]["code"] == "watchdog_budget" for trip in trips)


def test_a_job_that_never_beats_is_never_stall_tripped(server, client: Client, start_worker, tmp_path: Path):
    worker = start_watched_worker(start_worker, server, tmp_path / "gpu.json")
    job = client.submit_body({"command": "sleep 3"})

    done = wait_status(client, job["id"], {"done", "failed"}, timeout_s=10)

    assert done["status"] == "done", done
    assert done["watchdog_retries"] == 0
    assert watchdog_events(client, job["id"]) == []
    assert "stall suspected" not in worker.log()


# --- parts with real processes, no server ------------------------------------------------------


def run_job(command: str, settings: WorkerSettings, gpus: list[int], gpu_file: Path | None = None):
    client = FakeClient()
    finished = threading.Event()
    tripped: list[JobRun] = []
    unhealthy: list[JobRun] = []
    claim = claim_answer(command=command, gpu_indices=gpus, budget_s=0.5)
    samplers = Samplers(FakeGpuSampler(gpu_file) if gpu_file else None, ProcessTreeSampler())
    run = JobRun(
        claim,
        client,
        settings,
        "w1",
        lambda _: finished.set(),
        samplers=samplers,
        on_tripped=tripped.append,
        on_gpus_unhealthy=unhealthy.append,
    )
    run.start()
    assert finished.wait(15), "the job run did not finish"
    return run, client, tripped, unhealthy


def test_a_trip_is_reported_as_a_trip_only(tmp_path: Path):
    settings = WorkerSettings(heartbeat_s=0.2, preempt_grace_s=0.2)
    run, client, tripped, unhealthy = run_job("exec sleep 30", settings, [])

    assert client.names() == ["watchdog"]
    [trip] = client.trips
    detail = trip["detail"]
    assert (trip["job_id"], trip["worker_id"], trip["attempt"], trip["kind"]) == ("j-1", "w1", 1, "budget")
    assert detail["budget_s"] == 0.5 and detail["budget_source"] == "job"
    assert detail["elapsed_s"] >= 0.5 and detail["deadline_at"].endswith("Z")
    assert tripped == [run] and run.tripped and unhealthy == []


def test_a_job_that_survives_sigkill_marks_its_gpus_unhealthy(monkeypatch, tmp_path: Path):
    # Uninterruptible sleep cannot be staged in a test: the group is made to look alive forever.
    monkeypatch.setattr(executor.JobProcess, "_group_gone", lambda self: False)
    monkeypatch.setattr(executor, "KILL_WAIT_S", 0.2)
    settings = WorkerSettings(heartbeat_s=0.2, preempt_grace_s=0.1)
    gpu_file = tmp_path / "gpu.json"
    set_gpu(gpu_file, util_pct=50)
    run, client, _tripped, unhealthy = run_job("exec sleep 30", settings, [1, 3], gpu_file)

    assert unhealthy == [run]
    assert client.names() == ["watchdog"]

    agent = Agent(settings, "w1", "127.0.0.1", Offer(4, 4096, 4, 1000, "FakeGPU"))
    agent._gpus_unhealthy(run)
    agent._gpus_unhealthy(run)  # the same GPUs again: no new ERROR line
    assert agent.heartbeat_body() == {"running": [], "unhealthy_gpus": [1, 3]}


def test_a_tripped_job_is_no_longer_advertised():
    agent = Agent(WorkerSettings(), "w1", "127.0.0.1", Offer(4, 4096, 0, 0, None))

    class Run:
        def __init__(self, tripped: bool) -> None:
            self.tripped = tripped

    agent._runs = {("j-a", 1): Run(False), ("j-b", 1): Run(True)}  # type: ignore[dict-item]
    assert agent.heartbeat_body() == {"running": ["j-a"]}


def test_a_killed_group_of_zombies_is_gone(tmp_path: Path):
    # A background child the shell never waits for: after SIGKILL it may linger as a zombie of
    # PID 1, which must not count as a process that survived the kill.
    process = executor.JobProcess("sleep 30 & exec sleep 30", {}, 1024, 0.1, kill_wait_s=2)
    wait_for(lambda: len(executor.live_group_members(process.pid)) == 2, 5, "both processes")
    assert process.stop() is True
    assert not process.survived_kill, "the zombie counted as a process that survived the kill"
    process.finish()


def test_a_running_job_shows_its_step_gpu_and_memory(server, client: Client, start_worker, tmp_path: Path):
    """What the worker samples for its watchdogs reaches the job object through its heartbeats,
    and the worker's GPU readings reach the worker object."""
    gpu_file = tmp_path / "gpu.json"
    set_gpu(gpu_file, 64.0)
    start_watched_worker(
        start_worker, server, gpu_file, *GPU_FLAGS, *NO_HEALTH_FLAGS, "--worker-heartbeat-s", "0.2"
    )
    release = tmp_path / "release"
    command = f'echo 17 > "$CORRAL_BEAT_FILE"; while [ ! -e {release} ]; do sleep 0.05; done'
    job = client.submit_body({"command": command, "resources": {"gpus": 1}})
    shown = wait_for(
        lambda: (current := client.get_job(job["id"]))["progress"] and current["rss_mb"] and current,
        what="the job's readings",
    )
    assert (shown["progress"], shown["gpu_util_pct"]) == ({"step": 17}, 64.0)
    worker = wait_for(lambda: (current := client.worker("w1"))["gpu_stats"] and current, what="GPU readings")
    assert worker.to_wire()["gpu_stats"] == [{"index": 0, "util_pct": 64.0, "mem_used_mb": 1000.0}]
    release.touch()
    assert wait_status(client, job["id"], {"done", "failed"})["status"] == "done"
