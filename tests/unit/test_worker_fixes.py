"""Regressions of the worker's reviewed defects: malformed answers and claims, shutdown hand-backs,
the lease after the main process exits, stops that race with an exit, stray process groups."""

from __future__ import annotations

import contextlib
import math
import os
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from corral.client import ApiError
from corral.config import WorkerSettings
from corral.worker import executor
from corral.worker.agent import Agent
from corral.worker.executor import JobProcess
from corral.worker.job_run import JobRun, StopReason
from corral.worker.job_watch import JobProbe, build_watch
from corral.worker.reporting import deliver
from corral.worker.resources import Offer
from corral.worker.samplers.process import ProcessTreeSampler
from corral.worker.watchdogs import Verdict
from corral.worker.workspace import JobWorkspace
from tests.unit.test_worker_checkpoints import FakeClient

FIELDS = {"job_id": "j-1"}


def make_run(client: Any, command: str, **settings: Any) -> JobRun:
    options = {"heartbeat_s": 0.05, "preempt_grace_s": 0.5, **settings}
    claim = {"id": "j-1", "attempt": 1, "command": command}
    return JobRun(claim, client, WorkerSettings(**options), "w1", lambda run: None)


def finish(run: JobRun) -> None:
    assert run.finished.wait(15), "the attempt did not end"


def wait_for_file(path: Path) -> None:
    deadline = time.monotonic() + 10
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


# --- 1. malformed answers --------------------------------------------------------------------


@pytest.mark.parametrize("answer", [["preempt"], "preempt", 7])
def test_a_malformed_heartbeat_answer_does_not_kill_the_job(answer: Any):
    client = FakeClient()
    client.heartbeat_answer = answer
    run = make_run(client, "sleep 0.3")
    run.start()
    finish(run)
    assert client.names() == ["done"]
    assert any(call[0] == "job_heartbeat" for call in client.calls)


def test_an_unreadable_answer_to_a_report_counts_as_delivered():
    sends: list[int] = []

    def send() -> dict[str, Any]:
        sends.append(1)
        raise ApiError(200, "bad_response", "answer is not JSON")

    assert deliver(send, "done report", FIELDS, sleep=lambda _: None) is None
    assert len(sends) == 1


class BrokenDoneClient(FakeClient):
    def done(self, job_id: str, worker_id: str, attempt: int) -> Any:
        self._record("done", job_id)
        raise RuntimeError("answer decoded into something unexpected")

    def watchdog(self, *args: Any) -> Any:
        self._record("watchdog", *args)
        return ["not", "a", "dict"]


def test_a_report_that_blows_up_is_not_followed_by_a_fail_report():
    client = BrokenDoneClient()
    run = make_run(client, "true")
    run.start()
    finish(run)
    assert client.names() == ["done"]


def test_a_malformed_answer_to_a_trip_report_is_logged_not_raised():
    client = BrokenDoneClient()
    run = make_run(client, "true")
    run._report_trip(Verdict("budget", True, {"budget_s": 1}), 143)
    assert client.names() == ["watchdog"]


# --- 2. shutdown hands the job back ----------------------------------------------------------


def test_a_job_stopped_at_shutdown_is_released(tmp_path: Path):
    client = FakeClient()
    run = make_run(client, f"touch {tmp_path}/up; sleep 30")
    run.start()
    wait_for_file(tmp_path / "up")
    run.request_stop(StopReason.SHUTDOWN)
    finish(run)
    assert client.names() == ["fail"]
    assert client.calls[-1][2:4] == (143, "worker shut down")
    assert client.calls[-1][-1] == ("release", True)


def make_agent(client: Any, **settings: Any) -> Agent:
    agent = Agent(WorkerSettings(**settings), "w1", "host", Offer(1, 1024, 0, 0, None))
    agent._api = client
    return agent


def test_a_job_claimed_during_shutdown_is_released():
    client = FakeClient()
    agent = make_agent(client)
    agent._accepting = False
    agent._start_job({"id": "j-1", "attempt": 2, "command": "true"})
    assert client.calls == [("fail", "j-1", None, "worker shut down", "", ("release", True))]


# --- 3. the lease outlives the post-exit work ------------------------------------------------


def test_heartbeats_continue_while_leftovers_are_stopped():
    client = FakeClient()
    # The main process exits at once; its background child ignores SIGTERM, so the stop of the
    # leftovers waits out the whole grace before SIGKILL.
    run = make_run(client, "(trap '' TERM; sleep 30) & exit 0", preempt_grace_s=0.6)
    run.start()
    finish(run)
    assert client.names() == ["done"]
    beats = [call for call in client.calls if call[0] == "job_heartbeat"]
    assert len(beats) >= 4, beats


# --- 4. stray process groups and reused PIDs -------------------------------------------------


def test_a_child_in_its_own_group_does_not_outlive_the_stop():
    process = JobProcess("timeout 100 sleep 101; true", dict(os.environ), 1024, grace_s=0.5)
    deadline = time.monotonic() + 10
    while len(children := psutil.Process(process.pid).children(recursive=True)) < 2:
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.02)
    assert any(os.getpgid(child.pid) != process.pid for child in children)
    try:
        assert process.stop()
        process.finish()
        time.sleep(0.1)
        alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        assert alive == []
    finally:
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()


def test_a_reaped_job_whose_group_is_gone_is_sent_nothing(monkeypatch):
    process = JobProcess("exit 0", dict(os.environ), 1024, grace_s=0.5)
    assert process.wait(5) == 0
    process.finish()
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(executor.os, "killpg", lambda group, number: sent.append((group, number)))
    assert not process.stop()
    assert sent == []


# --- 5. a stop that races with the exit ------------------------------------------------------


def test_an_exit_hidden_by_the_reaping_lock_is_not_taken_for_a_running_job():
    process = JobProcess("exit 0", dict(os.environ), 1024, grace_s=0.5)
    deadline = time.monotonic() + 5
    # Exited but not reaped (a zombie), while another thread "holds" the lock: poll says None.
    while executor.is_live_member(process.pid, process.pid):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    real_poll = process._popen.poll
    process._popen.poll = lambda: None  # type: ignore[method-assign]
    try:
        assert not process.stop()
    finally:
        process._popen.poll = real_poll  # type: ignore[method-assign]
    assert process.wait(5) == 0
    process.finish()
    assert not process.stopped_while_running


# --- 6. a preempt during another stop --------------------------------------------------------


def test_a_preempt_during_a_shutdown_stop_is_acked(tmp_path: Path):
    client = FakeClient()
    command = f"trap 'sleep 0.3; exit 143' TERM; touch {tmp_path}/up; while :; do sleep 0.05; done"
    run = make_run(client, command, preempt_grace_s=2.0)
    run.start()
    wait_for_file(tmp_path / "up")
    run.request_stop(StopReason.SHUTDOWN)
    run.request_stop(StopReason.PREEMPT, 4)
    finish(run)
    assert client.names() == ["preempted"]
    assert client.calls[-1] == ("preempted", "j-1", "w1", 1, 4)


# --- 7. unhealthy GPUs are said before the report --------------------------------------------


class HeartbeatClient(FakeClient):
    def worker_heartbeat(self, worker_id: str, body: dict[str, Any] | None = None) -> None:
        self._record("worker_heartbeat", worker_id, body)


def test_unhealthy_gpus_are_heartbeated_at_once():
    client = HeartbeatClient()
    agent = make_agent(client)
    agent._registered = True
    run = make_run(client, "true")
    run.gpu_indices = [1]
    agent._gpus_unhealthy(run)  # the heartbeat thread is not even started
    assert client.calls == [("worker_heartbeat", "w1", {"running": [], "unhealthy_gpus": [1]})]


# --- 8. a 404 on claim does not spin ---------------------------------------------------------


class NotFoundClaims:
    def __init__(self) -> None:
        self.claims = 0

    def claim(self, worker_id: str, wait_s: float = 0.0) -> Any:
        self.claims += 1
        raise ApiError(404, "not_found", "unknown worker")


def test_a_404_on_claim_waits_before_registering_again():
    agent = make_agent(FakeClient(), poll_s=0.3)
    claims = NotFoundClaims()
    agent._claims = claims  # type: ignore[assignment]
    agent._registered = True
    started = time.monotonic()
    agent._claim_once()
    assert time.monotonic() - started >= 0.25
    assert claims.claims == 1
    assert not agent._registered


# --- 9. malformed claims ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "claim",
    [
        {"id": "j-1", "attempt": 3},
        {"id": "j-1", "attempt": 3, "command": "true", "gpu_indices": ["a"]},
        {"id": "j-1", "attempt": 3, "command": "true", "gpu_indices": "0,1"},
        {"id": "j-1", "attempt": 3, "command": "true", "env": ["A=1"]},
    ],
)
def test_a_malformed_claim_is_failed_at_once(claim: dict[str, Any]):
    client = FakeClient()
    agent = make_agent(client)
    agent._start_job(claim)
    assert client.names() == ["fail"]
    call = client.calls[-1]
    assert call[1] == "j-1" and call[2] is None and call[3].startswith("malformed claim")
    assert ("release", True) not in call
    assert agent.running_job_ids() == []


@pytest.mark.parametrize("claim", [{"id": "j-1", "attempt": "x", "command": "true"}, ["j-1"], {"attempt": 1}])
def test_a_claim_without_usable_id_and_attempt_is_not_reported(claim: Any):
    client = FakeClient()
    make_agent(client)._start_job(claim)
    assert client.calls == []


@pytest.mark.parametrize("bad", ["abc", -1, 0, math.nan, math.inf, True, [1]])
def test_bad_durations_in_a_claim_fall_back_to_the_worker_defaults(tmp_path: Path, bad: Any):
    settings = WorkerSettings()
    claim = {"budget_s": bad, "stall_timeout_s": bad}
    probe = JobProbe(os.getpid(), ProcessTreeSampler(), None)
    watch = build_watch(settings, claim, [], tmp_path / "beat", probe, None, FIELDS)
    budget, stall = watch.watchdogs[:2]
    assert budget.budget_s == settings.default_budget_s(False)  # type: ignore[attr-defined]
    assert budget.source == "worker"  # type: ignore[attr-defined]
    assert stall.timeout_s == settings.stall_timeout_s  # type: ignore[attr-defined]


# --- CUDA numbers GPUs as NVML does ----------------------------------------------------------


def test_jobs_get_the_pci_bus_device_order():
    workspace = JobWorkspace("j-1", 1)
    try:
        environment = workspace.environment({"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, [0, 2], False)
    finally:
        workspace.remove()
    assert environment["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert environment["CUDA_VISIBLE_DEVICES"] == "0,2"
