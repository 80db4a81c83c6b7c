"""The worker's checkpoint transfers against a scripted client: upload before the ack, refusals that
never hold the ack back, downloads with the inline fallback, and the bytes kept exact throughout."""

from __future__ import annotations

import base64
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from corral.client import ApiError, ServerUnreachable
from corral.config import WorkerSettings
from corral.worker import checkpoints
from corral.worker.executor import JobProcess
from corral.worker.job_run import JobRun

BLOB = b"\x00\xffstep=7\r\n\x80"
FIELDS = {"job_id": "j-1"}


class FakeClient:
    """The SDK calls the worker makes, recorded in order; each answer as the test scripts it."""

    def __init__(self, heartbeat: dict[str, Any] | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.heartbeat_answer = heartbeat or {}
        self.upload_error: Exception | None = None
        self.download_answer: bytes | Exception | None = None
        self.lock = threading.Lock()

    def _record(self, *call: Any) -> None:
        with self.lock:
            self.calls.append(call)

    def names(self) -> list[str]:
        with self.lock:
            return [call[0] for call in self.calls if call[0] != "job_heartbeat"]

    def job_heartbeat(self, job_id: str, worker_id: str, attempt: int) -> dict[str, Any]:
        self._record("job_heartbeat", job_id)
        return self.heartbeat_answer

    def upload_checkpoint(self, job_id: str, worker_id: str, attempt: int, epoch: int, data: bytes) -> None:
        self._record("upload_checkpoint", job_id, worker_id, attempt, epoch, data)
        if self.upload_error is not None:
            raise self.upload_error

    def download_checkpoint(self, job_id: str) -> bytes | None:
        self._record("download_checkpoint", job_id)
        if isinstance(self.download_answer, Exception):
            raise self.download_answer
        return self.download_answer

    def preempted(self, job_id: str, worker_id: str, attempt: int, epoch: int) -> dict[str, Any]:
        self._record("preempted", job_id, worker_id, attempt, epoch)
        return {"status": "preempted"}

    def done(self, job_id: str, worker_id: str, attempt: int) -> dict[str, Any]:
        self._record("done", job_id)
        return {"status": "done"}

    def fail(self, job_id: str, worker_id: str, attempt: int, *rest: Any, **options: Any) -> dict[str, Any]:
        self._record("fail", job_id, *rest, *sorted(options.items()))
        return {"status": "failed"}


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


def run_attempt(client: FakeClient, command: str, env: dict[str, str] | None = None) -> None:
    claim = {"id": "j-1", "attempt": 1, "command": command, "env": env or {}}
    settings = WorkerSettings(heartbeat_s=0.05, preempt_grace_s=0.5)
    run = JobRun(claim, client, settings, "w1", lambda run: None)  # type: ignore[arg-type]
    run.start()
    assert run.finished.wait(15), "the attempt did not end"


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
