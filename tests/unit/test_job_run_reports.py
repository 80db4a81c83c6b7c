"""What an attempt reports, and that it reports once: malformed heartbeat answers, reports whose
answers blow up, the shutdown hand-back, the lease while leftovers are stopped after the main
process exited, a stop the server asks for while another stop is under way, and what the
heartbeats carry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.client import ApiError
from corral.config import WorkerSettings
from corral.testing.fake_client import FakeClient, claim_answer
from corral.worker.job_run import JobRun, StopReason
from corral.worker.reporting import deliver
from corral.worker.samplers import Samplers
from corral.worker.samplers.fake import FakeGpuSampler
from corral.worker.samplers.process import ProcessTreeSampler
from corral.worker.watchdogs import Verdict
from tests.unit.worker_support import FIELDS, finish, make_run, run_attempt, wait_for_file

# --- malformed answers -----------------------------------------------------------------------


@pytest.mark.parametrize("answer", [["preempt"], "preempt", 7, {"action": "explode"}])
def test_a_malformed_heartbeat_answer_does_not_kill_the_job(answer: Any):
    """The SDK refuses an answer that breaks the contract (``bad_response``); the job runs on."""
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

    def watchdog(self, *args: Any, **options: Any) -> Any:
        self._record("watchdog", *args)
        raise ApiError(200, "bad_response", "answer breaks the JobAnswer schema", ["not", "a", "job"])


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


# --- shutdown hands the job back -------------------------------------------------------------


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


# --- the lease outlives the post-exit work ---------------------------------------------------


def test_heartbeats_continue_while_leftovers_are_stopped(tmp_path: Path):
    client = FakeClient()
    # The main process exits as soon as its background child ignores SIGTERM (not before: a
    # SIGTERM that came first would end the child at once), so the stop of the leftovers waits out
    # the whole grace before SIGKILL.
    ready = tmp_path / "ready"
    command = f"(trap '' TERM; touch {ready}; sleep 30) & while [ ! -e {ready} ]; do sleep 0.01; done; exit 0"
    run = make_run(client, command, preempt_grace_s=0.6)
    run.start()
    finish(run)
    assert client.names() == ["done"]
    beats = [call for call in client.calls if call[0] == "job_heartbeat"]
    assert len(beats) >= 4, beats


# --- a preempt during another stop -----------------------------------------------------------


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


def test_heartbeats_carry_the_step_the_gpus_and_the_memory(tmp_path: Path):
    """The server shows what the job's heartbeats report (``corral show``): the last step beaten,
    the utilisation of the job's GPUs and its process tree's memory."""
    gpu_file = tmp_path / "gpu.json"
    gpu_file.write_text('{"util_pct": 73.5, "mem_used_mb": 1000}')
    client = FakeClient()
    samplers = Samplers(gpu=FakeGpuSampler(gpu_file), memory=ProcessTreeSampler())
    claim = claim_answer(command='echo 42 > "$CORRAL_BEAT_FILE"; sleep 0.6', gpu_indices=[0])
    settings = WorkerSettings(heartbeat_s=0.05, preempt_grace_s=0.5)
    run = JobRun(claim, client, settings, "w1", lambda run: None, samplers=samplers)
    run.start()
    finish(run)
    reported = [body for body in client.heartbeat_bodies if "progress" in body]
    assert reported, client.heartbeat_bodies
    assert reported[-1]["progress"] == {"step": 42}
    assert reported[-1]["gpu_util_pct"] == 73.5
    # read while the tree ran (the last beat may come as it exits, when nothing is left to count)
    assert max(body.get("rss_mb") or 0 for body in reported) > 0


# --- the walltime limit ----------------------------------------------------------------------


def test_a_job_at_its_walltime_is_stopped_and_reported_failed_walltime_exceeded(tmp_path: Path):
    """Without samplers (no watchdogs built) the limit still holds: it is not a watchdog."""
    client = FakeClient()
    run = make_run(
        client, f"trap 'echo term > {tmp_path}/term; exit 143' TERM; sleep 30 & wait", walltime_s=0.3
    )
    run.start()
    finish(run)
    assert client.names() == ["fail"]
    (call,) = [call for call in client.calls if call[0] == "fail"]
    assert ("reason", "walltime_exceeded") in call
    assert any(isinstance(part, str) and part.startswith("walltime exceeded") for part in call)
    assert (tmp_path / "term").read_text().strip() == "term", "stopped by SIGTERM, the stop path"


def test_a_job_that_ends_within_its_walltime_is_done():
    client = FakeClient()
    run_attempt(client, "sleep 0.1", walltime_s=30)
    assert client.names() == ["done"]
