"""A preemption's checkpoint phase on the worker, against a scripted client and real jobs: SIGUSR1
once per epoch, and only to a job that handles it; the upload for the epoch after the job's
"saved" and never the same bytes twice; a deferral forwarded once per request; ``checkpoint_at`` in
the heartbeats; a job that exits mid-phase uploading once."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from corral.client import ServerUnreachable
from corral.testing.fake_client import FakeClient
from corral.worker.checkpoints import AttemptUploads
from tests.unit.worker_support import FIELDS, finish, make_run, wait_for, wait_for_file

CHECKPOINT = {"action": "checkpoint", "preemption_epoch": 4, "deadline_s": 600}
PREEMPT = {"action": "preempt", "preemption_epoch": 4}
# Spins in the shell, so a trap runs within 50 ms of its signal.
SPIN = "while :; do sleep 0.05; done"


def uploads(client: FakeClient) -> list[tuple[Any, ...]]:
    return [call for call in client.reports() if call[0] == "upload_checkpoint"]


def beats(client: FakeClient) -> int:
    with client.lock:
        return len(client.heartbeat_bodies)


def more_beats(client: FakeClient, count: int = 10) -> None:
    """Wait until ``count`` more heartbeats went out (what the worker does with them is done)."""
    target = beats(client) + count
    wait_for(lambda: beats(client) >= target, f"{count} more heartbeats")


def test_the_first_checkpoint_answer_hints_once_and_uploads_the_save_for_the_epoch(tmp_path: Path):
    client = FakeClient()
    hint = f'n=$((n+1)); echo $n >> {tmp_path}/hints; echo saved-$n > "$CORRAL_CHECKPOINT_OUT"'
    command = f"n=0; trap '{hint}; touch \"$CORRAL_CHECKPOINT_DONE_FILE\"' USR1; touch {tmp_path}/up; {SPIN}"
    run = make_run(client, command)
    run.start()
    wait_for_file(tmp_path / "up")
    client.heartbeat_answer = CHECKPOINT
    wait_for(lambda: uploads(client), "the phase's upload")
    more_beats(client)  # every one of them answered "checkpoint" for epoch 4 again

    assert (tmp_path / "hints").read_text() == "1\n"
    assert uploads(client) == [("upload_checkpoint", "j-1", "w1", 1, 4, b"saved-1\n")]
    assert client.names() == ["upload_checkpoint"]  # the job runs on until the stop

    client.heartbeat_answer = PREEMPT
    finish(run)
    # The end does not upload the same bytes again: the ack follows at once.
    assert client.names() == ["upload_checkpoint", "preempted"]
    assert client.reports()[-1] == ("preempted", "j-1", "w1", 1, 4)


def test_the_upload_waits_for_the_jobs_saved_signal(tmp_path: Path):
    client = FakeClient()
    # The job writes its checkpoint on the hint, but says "saved" only once the test creates `go`.
    trap = f"trap 'echo state > \"$CORRAL_CHECKPOINT_OUT\"; touch {tmp_path}/hinted' USR1"
    say = f'[ -e {tmp_path}/go ] && [ -e {tmp_path}/hinted ] && touch "$CORRAL_CHECKPOINT_DONE_FILE"'
    command = f"{trap}; touch {tmp_path}/up; while :; do {say}; sleep 0.05; done"
    client.heartbeat_answer = CHECKPOINT
    run = make_run(client, command)
    run.start()
    wait_for_file(tmp_path / "hinted")
    more_beats(client)
    assert uploads(client) == []

    (tmp_path / "go").touch()
    wait_for(lambda: uploads(client), "the phase's upload")
    assert uploads(client) == [("upload_checkpoint", "j-1", "w1", 1, 4, b"state\n")]
    client.heartbeat_answer = PREEMPT
    finish(run)
    assert client.names() == ["upload_checkpoint", "preempted"]


def test_a_new_epoch_hints_again_and_a_later_save_goes_up_with_the_ack(tmp_path: Path):
    """Epoch 4's phase, then epoch 5's (the server called 4 off and preempts again): one hint and
    one upload each. The SIGTERM handler's save is newer than the phase's: the end uploads it."""
    client = FakeClient()
    hint = 'n=$((n+1)); echo phase-$n > "$CORRAL_CHECKPOINT_OUT"; touch "$CORRAL_CHECKPOINT_DONE_FILE"'
    term = 'echo final > "$CORRAL_CHECKPOINT_OUT"; exit 143'
    command = f"n=0; trap '{hint}' USR1; trap '{term}' TERM; touch {tmp_path}/up; {SPIN}"
    run = make_run(client, command)
    run.start()
    wait_for_file(tmp_path / "up")
    client.heartbeat_answer = CHECKPOINT
    wait_for(lambda: len(uploads(client)) == 1, "epoch 4's upload")
    client.heartbeat_answer = {**CHECKPOINT, "preemption_epoch": 5}
    wait_for(lambda: len(uploads(client)) == 2, "epoch 5's upload")
    client.heartbeat_answer = CHECKPOINT  # epoch 4's late answer: nothing
    more_beats(client, 5)
    client.heartbeat_answer = {**PREEMPT, "preemption_epoch": 5}
    finish(run)

    assert client.reports() == [
        ("upload_checkpoint", "j-1", "w1", 1, 4, b"phase-1\n"),
        ("upload_checkpoint", "j-1", "w1", 1, 5, b"phase-2\n"),
        ("upload_checkpoint", "j-1", "w1", 1, 5, b"final\n"),
        ("preempted", "j-1", "w1", 1, 5),
    ]


def test_a_job_without_a_sigusr1_handler_is_not_hinted_and_survives_to_its_stop(tmp_path: Path):
    client = FakeClient()
    run = make_run(client, f"touch {tmp_path}/up; sleep 30")
    run.start()
    wait_for_file(tmp_path / "up")
    client.heartbeat_answer = CHECKPOINT
    more_beats(client)
    client.heartbeat_answer = PREEMPT
    finish(run)
    # Stopped by the SIGTERM of the stop and acked, not killed by a SIGUSR1 and failed.
    assert client.names() == ["preempted"]


def test_a_handler_installed_late_still_gets_the_hint(tmp_path: Path):
    """A Python job installs its handler after its imports: the hint waits for it."""
    program = (
        "import os, time, pathlib; time.sleep(0.3); from corral import jobkit; "
        "jobkit.on_checkpoint(lambda: b'late'); "
        f"pathlib.Path('{tmp_path}/up').touch()\n"
        "while True: time.sleep(0.05)"
    )
    client = FakeClient(heartbeat=CHECKPOINT)
    run = make_run(client, f'exec {sys.executable} -c "{program}"')
    run.start()
    wait_for(lambda: uploads(client), "the phase's upload")
    assert uploads(client) == [("upload_checkpoint", "j-1", "w1", 1, 4, b"late")]
    client.heartbeat_answer = PREEMPT
    finish(run)
    assert client.names() == ["upload_checkpoint", "preempted"]


def test_a_saved_signal_without_a_checkpoint_uploads_nothing(tmp_path: Path):
    client = FakeClient()
    command = f"trap 'touch \"$CORRAL_CHECKPOINT_DONE_FILE\"; touch {tmp_path}/said' USR1; {SPIN}"
    client.heartbeat_answer = CHECKPOINT
    run = make_run(client, command)
    run.start()
    wait_for_file(tmp_path / "said")
    more_beats(client)
    client.heartbeat_answer = PREEMPT
    finish(run)
    assert client.names() == ["preempted"]


# --- the job ends during the phase -----------------------------------------------------------


def test_a_job_that_saves_and_exits_mid_phase_uploads_once(tmp_path: Path):
    client = FakeClient(heartbeat=CHECKPOINT)
    save = 'echo last > "$CORRAL_CHECKPOINT_OUT"; touch "$CORRAL_CHECKPOINT_DONE_FILE"; exit 0'
    run = make_run(client, f"trap '{save}' USR1; {SPIN}")
    run.start()
    finish(run)
    sent = uploads(client)
    # The phase's upload (epoch 4) or the end's (none), whichever came first; never both.
    assert len(sent) == 1, sent
    assert sent[0][-1] == b"last\n"
    assert client.names() == ["upload_checkpoint", "done"]


def test_a_job_that_crashes_mid_phase_uploads_once_without_the_epoch(tmp_path: Path):
    client = FakeClient(heartbeat=CHECKPOINT)
    run = make_run(client, f"trap 'echo half > \"$CORRAL_CHECKPOINT_OUT\"; exit 3' USR1; {SPIN}")
    run.start()
    finish(run)
    assert client.reports()[0] == ("upload_checkpoint", "j-1", "w1", 1, None, b"half\n")
    assert client.names() == ["upload_checkpoint", "fail"]


# --- what the heartbeats carry ---------------------------------------------------------------


def test_a_deferral_is_forwarded_once_per_request(tmp_path: Path):
    client = FakeClient()
    # Written before the hint: not an answer to it, never forwarded.
    early = 'echo 5 > "$CORRAL_DEFER_FILE"'
    again = f'[ -e {tmp_path}/again ] && echo 30 > "$CORRAL_DEFER_FILE" && rm {tmp_path}/again'
    trap = "trap 'echo 90 > \"$CORRAL_DEFER_FILE\"' USR1"
    command = f"{early}; {trap}; touch {tmp_path}/up; while :; do {again}; sleep 0.05; done"
    run = make_run(client, command)
    run.start()
    wait_for_file(tmp_path / "up")
    more_beats(client, 3)
    client.heartbeat_answer = CHECKPOINT

    def asked() -> list[float]:
        with client.lock:
            return [body["defer_s"] for body in client.heartbeat_bodies if "defer_s" in body]

    wait_for(lambda: asked() == [90.0], "the deferral")
    more_beats(client)
    assert asked() == [90.0]
    (tmp_path / "again").touch()
    wait_for(lambda: asked() == [90.0, 30.0], "the second deferral")
    more_beats(client)
    assert asked() == [90.0, 30.0]
    client.heartbeat_answer = PREEMPT
    finish(run)


class UnreachableOnce(FakeClient):
    """The first heartbeat that carries a deferral does not reach the server."""

    def __init__(self, heartbeat: Any = None) -> None:
        super().__init__(heartbeat)
        self.failed = False

    def job_heartbeat(
        self, job_id: str, worker_id: str, attempt: int, body: Any = None, busy_retry_s: float | None = None
    ) -> Any:
        if body and "defer_s" in body and not self.failed:
            self.failed = True
            self._record("job_heartbeat", job_id)
            self.heartbeat_bodies.append(body)
            raise ServerUnreachable("connection refused")
        return super().job_heartbeat(job_id, worker_id, attempt, body)


def test_a_deferral_whose_heartbeat_did_not_arrive_goes_again(tmp_path: Path):
    client = UnreachableOnce(heartbeat=CHECKPOINT)
    run = make_run(client, f"trap 'echo 60 > \"$CORRAL_DEFER_FILE\"' USR1; {SPIN}")
    run.start()

    def asked() -> list[float]:
        with client.lock:
            return [body["defer_s"] for body in client.heartbeat_bodies if "defer_s" in body]

    wait_for(lambda: len(asked()) == 2, "the deferral, twice")
    more_beats(client)
    assert asked() == [60.0, 60.0]
    client.heartbeat_answer = PREEMPT
    finish(run)


def test_heartbeats_carry_when_the_job_last_saved(tmp_path: Path):
    client = FakeClient()
    before = time.time()
    command = 'sleep 0.5; echo 3 > "$CORRAL_CHECKPOINT_OUT"; sleep 0.4'
    run = make_run(client, command)
    run.start()
    finish(run)
    after = time.time()
    stamps = [body.get("checkpoint_at") for body in client.heartbeat_bodies]
    assert stamps[0] is None, stamps
    saved = [stamp for stamp in stamps if stamp is not None]
    assert saved, stamps
    assert before - 0.01 <= saved[0] <= after
    assert len(set(saved)) == 1  # one save, one time


# --- the attempt's uploads -------------------------------------------------------------------


def test_uploads_never_repeat_bytes_and_stop_after_the_final_one(tmp_path: Path):
    client = FakeClient()
    out = tmp_path / "checkpoint.out"
    sent = AttemptUploads(client, "j-1", "w1", 1, out, FIELDS)  # type: ignore[arg-type]
    assert sent.upload(4) is False  # nothing written yet
    out.write_bytes(b"one")
    assert sent.upload(4) is True
    assert sent.upload(None) is True  # the same bytes: the server has them
    os.utime(out)
    out.write_bytes(b"two")
    assert sent.upload(4, final=True) is True
    out.write_bytes(b"three")
    assert sent.upload(None) is False  # after the final one: nothing
    assert client.reports() == [
        ("upload_checkpoint", "j-1", "w1", 1, 4, b"one"),
        ("upload_checkpoint", "j-1", "w1", 1, 4, b"two"),
    ]


def test_a_phase_the_server_calls_off_uploads_nothing_for_it(tmp_path: Path):
    """A plain answer while the phase waits: the preemption was called off. A "saved" after it
    uploads nothing for the epoch; the attempt's end uploads as usual."""
    client = FakeClient(heartbeat=CHECKPOINT)
    trap = f"trap 'echo state > \"$CORRAL_CHECKPOINT_OUT\"; touch {tmp_path}/hinted' USR1"
    say = f'[ -e {tmp_path}/go ] && touch "$CORRAL_CHECKPOINT_DONE_FILE" && exit 0'
    run = make_run(client, f"{trap}; while :; do {say}; sleep 0.05; done")
    run.start()
    wait_for_file(tmp_path / "hinted")
    client.heartbeat_answer = {}
    more_beats(client, 3)
    (tmp_path / "go").touch()
    finish(run)
    assert client.reports() == [("upload_checkpoint", "j-1", "w1", 1, None, b"state\n"), ("done", "j-1")]
