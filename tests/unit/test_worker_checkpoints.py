"""The worker's checkpoint transfers against a scripted client: an upload at every end of an attempt
but a lost job, always before the final report (the ack, done, fail, the trip), refusals that never
hold the report back, downloads with the inline fallback, every rank's checkpoint for a gang rank,
and the bytes kept exact throughout."""

from __future__ import annotations

import base64
import logging
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from corral.client import ApiError, ServerUnreachable
from corral.testing.fake_client import FakeClient
from corral.worker import checkpoints
from corral.worker.executor import JobProcess
from corral.worker.job_run import StopReason
from corral.worker.watchdogs import Verdict
from tests.unit.worker_support import FIELDS, finish, make_run, run_attempt, wait_for, wait_for_file

BLOB = b"\x00\xffstep=7\r\n\x80"


# --- upload ----------------------------------------------------------------------------------


def test_upload_sends_the_exact_bytes_for_the_epoch(tmp_path: Path):
    client = FakeClient()
    (tmp_path / "out").write_bytes(BLOB)
    assert checkpoints.upload(client, "j-1", "w1", 2, 5, tmp_path / "out", FIELDS)  # type: ignore[arg-type]
    assert client.calls == [("upload_checkpoint", "j-1", "w1", 2, 5, BLOB)]


@pytest.mark.parametrize("content", [None, b""])
def test_no_file_or_an_empty_one_uploads_nothing(tmp_path: Path, content: bytes | None):
    client = FakeClient()
    if content is not None:
        (tmp_path / "out").write_bytes(content)
    assert not checkpoints.upload(client, "j-1", "w1", 1, 1, tmp_path / "out", FIELDS)  # type: ignore[arg-type]
    assert client.calls == []


@pytest.mark.parametrize(
    "error", [ApiError(413, "too_large", "too big"), ApiError(409, "stale_epoch", "epoch 1 is not 2")]
)
def test_a_refused_upload_is_not_retried(tmp_path: Path, error: ApiError):
    client = FakeClient()
    client.upload_error = error
    (tmp_path / "out").write_bytes(BLOB)
    assert not checkpoints.upload(client, "j-1", "w1", 1, 1, tmp_path / "out", FIELDS)  # type: ignore[arg-type]
    assert len(client.calls) == 1


def test_an_oversized_file_is_not_read(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(checkpoints, "MAX_UPLOAD_BYTES", 4)
    client = FakeClient()
    (tmp_path / "out").write_bytes(BLOB)
    assert not checkpoints.upload(client, "j-1", "w1", 1, 1, tmp_path / "out", FIELDS)  # type: ignore[arg-type]
    assert client.calls == []


# --- download --------------------------------------------------------------------------------


def test_download_only_when_the_claim_says_resume(tmp_path: Path):
    client = FakeClient()
    client.download_answer = BLOB
    assert not checkpoints.download(client, "j-1", {}, tmp_path / "in", FIELDS)  # type: ignore[arg-type]
    assert client.calls == []
    assert checkpoints.download(client, "j-1", {"CORRAL_RESUME": "1"}, tmp_path / "in", FIELDS)  # type: ignore[arg-type]
    assert (tmp_path / "in").read_bytes() == BLOB


def test_download_falls_back_to_the_inline_copy(tmp_path: Path):
    client = FakeClient()
    client.download_answer = ServerUnreachable("http://x", OSError("refused"))
    env = {"CORRAL_RESUME": "1", "CHECKPOINT_DATA": base64.b64encode(BLOB).decode()}
    assert checkpoints.download(client, "j-1", env, tmp_path / "in", FIELDS, tries=1)  # type: ignore[arg-type]
    assert (tmp_path / "in").read_bytes() == BLOB


def test_nothing_to_download_starts_without_a_checkpoint(tmp_path: Path):
    client = FakeClient()  # the server answers 204
    env = {"CORRAL_RESUME": "1", "CHECKPOINT_DATA": "!!"}
    assert not checkpoints.download(client, "j-1", env, tmp_path / "in", FIELDS)  # type: ignore[arg-type]
    assert not (tmp_path / "in").exists()


# --- the attempt -----------------------------------------------------------------------------


def test_a_preempted_job_has_its_checkpoint_uploaded_before_the_ack(tmp_path: Path):
    client = FakeClient(heartbeat={"action": "preempt", "preemption_epoch": 3})
    # printf's octal escapes: the two bytes 0x00 0xff, then text
    save = 'printf "\\000\\377step=7" > "$CORRAL_CHECKPOINT_OUT"'
    command = f"trap '{save}; exit 143' TERM; while :; do sleep 0.05; done"
    run_attempt(client, command)
    assert client.names() == ["upload_checkpoint", "preempted"]
    # Heartbeats go on during the upload (the lease must not lapse), so they are left out here.
    reports = [call for call in client.calls if call[0] != "job_heartbeat"]
    assert reports[-2] == ("upload_checkpoint", "j-1", "w1", 1, 3, b"\x00\xffstep=7")
    assert reports[-1] == ("preempted", "j-1", "w1", 1, 3)


def test_a_refused_upload_still_acks(tmp_path: Path):
    client = FakeClient(heartbeat={"action": "preempt", "preemption_epoch": 3})
    client.upload_error = ApiError(413, "too_large", "too big")
    run_attempt(
        client, "trap 'echo state > \"$CORRAL_CHECKPOINT_OUT\"; exit 143' TERM; while :; do sleep 0.05; done"
    )
    assert client.names() == ["upload_checkpoint", "preempted"]


def test_a_job_that_writes_no_checkpoint_is_only_acked(tmp_path: Path):
    client = FakeClient(heartbeat={"action": "preempt", "preemption_epoch": 1})
    run_attempt(client, "while :; do sleep 0.05; done")
    assert client.names() == ["preempted"]


def test_a_resumed_job_reads_the_downloaded_checkpoint(tmp_path: Path):
    client = FakeClient()
    client.download_answer = BLOB
    copy = tmp_path / "seen"
    run_attempt(client, f'cp "$CORRAL_CHECKPOINT_IN" {copy}', {"CORRAL_RESUME": "1"})
    assert client.names() == ["download_checkpoint", "done"]
    assert copy.read_bytes() == BLOB


# --- every end of an attempt uploads, before its report ---------------------------------------

SAVE_STEP_3 = 'echo 3 > "$CORRAL_CHECKPOINT_OUT"; '
RUNS_UNTIL_STOPPED = "touch {up}; while :; do sleep 0.05; done"


def test_a_job_that_exits_0_has_its_checkpoint_uploaded_before_done():
    client = FakeClient()
    run_attempt(client, SAVE_STEP_3 + "exit 0")
    assert client.reports() == [("upload_checkpoint", "j-1", "w1", 1, None, b"3\n"), ("done", "j-1")]


def test_a_crashed_job_has_its_checkpoint_uploaded_before_the_failure():
    client = FakeClient()
    run_attempt(client, SAVE_STEP_3 + "exit 3")
    assert client.names() == ["upload_checkpoint", "fail"]
    assert client.reports()[0] == ("upload_checkpoint", "j-1", "w1", 1, None, b"3\n")
    assert client.reports()[1][2] == 3  # its exit code


def test_a_rank_that_died_on_its_own_before_its_stop_uploads_without_the_epoch(tmp_path: Path):
    """A gang drains, but the rank's collective had already failed: the server's stop (epoch 2)
    comes after the rank's main process exited on its own. Its own outcome is reported, so its
    checkpoint goes in the form the server takes from a rank that was not stopped: no epoch."""
    client = FakeClient()
    # A leftover that ignores SIGTERM keeps the attempt winding down (for the grace) after the
    # main process has exited: the stop surely arrives then.
    leftover = "(trap '' TERM; while :; do sleep 0.05; done) & "
    run = make_run(client, SAVE_STEP_3 + leftover + "exit 1", preempt_grace_s=1.0)
    run.start()
    wait_for(lambda: run._process is not None and run._process.poll() is not None)
    run.request_stop(StopReason.PREEMPT, 2)
    finish(run)
    assert client.reports()[0] == ("upload_checkpoint", "j-1", "w1", 1, None, b"3\n")
    assert client.names() == ["upload_checkpoint", "fail"]


def test_a_watchdog_trip_uploads_before_its_report(tmp_path: Path):
    client = FakeClient()
    run = make_run(client, SAVE_STEP_3 + RUNS_UNTIL_STOPPED.format(up=tmp_path / "up"))
    run.start()
    wait_for_file(tmp_path / "up")
    run._watchdog_tripped(Verdict("budget", True, {"budget_s": 1}))
    finish(run)
    assert client.reports() == [
        ("upload_checkpoint", "j-1", "w1", 1, None, b"3\n"),
        ("watchdog", "j-1", "budget"),
    ]


def test_a_shutdown_hand_back_uploads_before_releasing_the_job(tmp_path: Path):
    client = FakeClient()
    run = make_run(client, SAVE_STEP_3 + RUNS_UNTIL_STOPPED.format(up=tmp_path / "up"))
    run.start()
    wait_for_file(tmp_path / "up")
    run.request_stop(StopReason.SHUTDOWN)
    finish(run)
    assert client.names() == ["upload_checkpoint", "fail"]
    assert client.reports()[0] == ("upload_checkpoint", "j-1", "w1", 1, None, b"3\n")
    assert client.reports()[1][-1] == ("release", True)


def test_a_lost_job_uploads_nothing_and_reports_nothing(tmp_path: Path):
    client = FakeClient()
    client.heartbeat_error = ApiError(409, "stale_attempt", "attempt 1 is not 2")
    run_attempt(client, SAVE_STEP_3 + RUNS_UNTIL_STOPPED.format(up=tmp_path / "up"))
    assert client.names() == []
    assert any(call[0] == "job_heartbeat" for call in client.calls)


def test_a_refused_upload_still_reports_the_failure():
    client = FakeClient()
    client.upload_error = ApiError(409, "not_running", "the attempt already ended")
    run_attempt(client, SAVE_STEP_3 + "exit 3")
    assert client.names() == ["upload_checkpoint", "fail"]


def test_the_upload_waits_until_the_whole_group_is_gone():
    """A leftover of the job that saves on its way out (it got SIGTERM once the main process
    exited): what is uploaded is what it wrote, not what was there when the main process ended."""
    client = FakeClient()
    leftover = "(trap 'echo late > \"$CORRAL_CHECKPOINT_OUT\"; exit 0' TERM; while :; do sleep 0.05; done) & "
    # The main process gives the leftover time to install its trap, then exits.
    run_attempt(client, SAVE_STEP_3 + leftover + "sleep 0.3; exit 0")
    assert client.reports()[0] == ("upload_checkpoint", "j-1", "w1", 1, None, b"late\n")
    assert client.names() == ["upload_checkpoint", "done"]


def test_an_attempt_whose_supervision_failed_still_uploads_before_its_failure(monkeypatch):
    client = FakeClient()

    def broken_finish(process: JobProcess) -> str:
        raise RuntimeError("the worker's own bug")

    monkeypatch.setattr(JobProcess, "finish", broken_finish)
    run_attempt(client, SAVE_STEP_3 + "exit 0")
    assert client.names() == ["upload_checkpoint", "fail"]
    assert client.reports()[1][3].startswith("worker error")


# --- a gang rank sees every rank's checkpoint ------------------------------------------------

GANG_ENV = {"CORRAL_GANG_ID": "g-1", "RANK": "1", "CORRAL_RESUME": "1"}
LIST_GANG_DIRECTORY = (
    'cd "$CORRAL_GANG_CHECKPOINT_DIR" && for f in *; do [ -e "$f" ] && cp "$f" {copy}/; done'
)


def test_every_listed_rank_is_downloaded_into_the_gang_directory(tmp_path: Path):
    client = FakeClient()
    client.download_answer = BLOB  # this rank's own (j-1)
    client.downloads = {"j-0": b"rank 0 at step 3"}
    listed = [{"gang_index": 0, "job_id": "j-0"}, {"gang_index": 1, "job_id": "j-1"}]
    run_attempt(client, LIST_GANG_DIRECTORY.format(copy=tmp_path), GANG_ENV, gang_checkpoints=listed)
    assert (tmp_path / "rank-0").read_bytes() == b"rank 0 at step 3"
    assert (tmp_path / "rank-1").read_bytes() == BLOB
    # Its own checkpoint is fetched once, for CORRAL_CHECKPOINT_IN, and copied into the directory.
    downloads = [call[1] for call in client.calls if call[0] == "download_checkpoint"]
    assert downloads == ["j-1", "j-0"]
    assert client.names()[-1] == "done"


def test_a_peer_checkpoint_that_cannot_be_fetched_does_not_stop_the_start(tmp_path: Path):
    client = FakeClient()
    client.downloads = {"j-0": ApiError(404, "not_found", "no such job"), "j-2": b"rank 2"}
    listed = [{"gang_index": 0, "job_id": "j-0"}, {"gang_index": 2, "job_id": "j-2"}]
    env = {"CORRAL_GANG_ID": "g-1", "RANK": "1", "CORRAL_RESUME": "1"}
    run_attempt(client, LIST_GANG_DIRECTORY.format(copy=tmp_path), env, gang_checkpoints=listed)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["rank-2"]
    assert client.names()[-1] == "done"


def test_once_a_peer_download_failed_every_try_the_rest_get_one_try(tmp_path: Path):
    client = FakeClient()
    client.download_answer = ServerUnreachable("http://x", OSError("refused"))
    ranks = [(0, "j-0"), (1, "j-1"), (2, "j-2")]
    assert checkpoints.download_gang(client, ranks, tmp_path, None, FIELDS, tries=2) == []  # type: ignore[arg-type]
    downloads = [call[1] for call in client.calls]
    assert downloads == ["j-0", "j-0", "j-1", "j-2"]


def test_a_gang_rank_without_listed_checkpoints_gets_an_empty_directory(tmp_path: Path):
    client = FakeClient()
    command = 'ls -A "$CORRAL_GANG_CHECKPOINT_DIR" > {out}'.format(out=tmp_path / "listing")
    run_attempt(client, command, {"CORRAL_GANG_ID": "g-1"}, gang_checkpoints=[])
    assert (tmp_path / "listing").read_text() == ""
    assert client.names() == ["done"]


# --- the stop --------------------------------------------------------------------------------

# A Python job under ``sh -c`` (sh stays the main process): SIGTERM ends sh at once while Python's
# handler takes 0.1 s to save, then exits.
SAVING_ON_SIGTERM = (
    "import signal, sys, time, pathlib\n"
    "def save(*_):\n"
    "    time.sleep(0.1); pathlib.Path(sys.argv[1]).write_bytes(b'saved'); sys.exit(143)\n"
    "signal.signal(signal.SIGTERM, save)\n"
    "pathlib.Path(sys.argv[2]).touch()\n"
    "while True: time.sleep(0.05)\n"
)


def test_a_job_saving_on_sigterm_is_not_killed_while_it_saves(tmp_path: Path, caplog):
    """The run thread's ``finish`` and the stop thread both watch the group; one's /proc scan must
    not make the other miss the save's end and send SIGKILL at the end of the grace."""
    caplog.set_level(logging.INFO, logger="corral.worker.executor")
    script = tmp_path / "saving.py"
    script.write_text(SAVING_ON_SIGTERM)
    command = f"{sys.executable} {script} {tmp_path}/saved {tmp_path}/up; true"
    process = JobProcess(command, dict(os.environ), 1024, grace_s=0.4)
    deadline = time.monotonic() + 10
    while not (tmp_path / "up").exists():
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.02)

    stopper = threading.Thread(target=process.stop)
    stopper.start()
    assert process.wait(5) == 143  # sh, at once
    process.finish()
    stopper.join()

    assert (tmp_path / "saved").read_bytes() == b"saved"
    assert "sent SIGKILL" not in caplog.text
