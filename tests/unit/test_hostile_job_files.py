"""Whatever a job writes to its beat, defer, done and checkpoint files affects that job alone: a
number too large for JSON, binary, megabytes, a FIFO, a symlink to ``/dev/zero``. Every read is
bounded and never waits, every value is checked, and every heartbeat body still encodes, against a
scripted client and real jobs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from corral.config import WorkerSettings
from corral.testing.fake_client import FakeClient, claim_answer
from corral.worker import job_files
from corral.worker.checkpoint_phase import MAX_DEFER_S
from corral.worker.checkpoints import read_written
from corral.worker.job_run import JobRun
from corral.worker.samplers import Samplers
from corral.worker.samplers.process import ProcessTreeSampler
from tests.unit.worker_support import FIELDS, finish, wait_for, wait_for_file

CHECKPOINT = {"action": "checkpoint", "preemption_epoch": 4, "deadline_s": 600}
PREEMPT = {"action": "preempt", "preemption_epoch": 4}
SPIN = "while :; do sleep 0.05; done"

#: what a hostile job leaves at "$F", one shell line each
HOSTILE = {
    "huge_integer": 'echo 123456789012345678901234567890 > "$F"',
    "binary": "printf '\\000\\377\\376 7\\n\\001' > \"$F\"",
    "megabytes": 'head -c 4000000 /dev/zero | tr "\\0" 9 > "$F"',
    "fifo": 'rm -f "$F"; mkfifo "$F"',
    "symlink_to_dev_zero": 'rm -f "$F"; ln -s /dev/zero "$F"',
}


def _lay_out(case: str, path: Path) -> None:
    """``HOSTILE[case]`` written at ``path`` by a shell, as the job would."""
    os.system(f'F="{path}"; {HOSTILE[case]}')  # noqa: S605 - the test's own fixed lines


# --- the reads themselves --------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_bounded_reads_never_wait_and_never_yield_a_value_no_heartbeat_can_carry(case: str, tmp_path: Path):
    path = tmp_path / "file"
    _lay_out(case, path)
    head = job_files.read_head(path, job_files.BEAT_BYTES)
    assert head is None or len(head) <= job_files.BEAT_BYTES
    assert job_files.parse_step(head) is None
    assert job_files.parse_step(job_files.read_value(path, job_files.BEAT_BYTES)) is None
    seconds = job_files.parse_seconds(job_files.read_value(path, job_files.DEFER_BYTES))
    # a huge number of seconds is a number: the phase caps it at MAX_DEFER_S
    assert seconds is None or case == "huge_integer"
    whole = job_files.read_whole(path, 1024)
    assert whole is None or len(whole) <= 1024
    if case in ("fifo", "symlink_to_dev_zero"):
        assert head is None and whole is None
        assert read_written(path, FIELDS) is None


def test_plain_values_still_read():
    assert job_files.parse_step(b"42\n") == 42
    assert job_files.parse_step(b"-3") == -3
    assert job_files.parse_step(b"\xb2") is None  # a digit to str.isdigit, not to int()
    assert job_files.parse_seconds(b"90\n") == 90.0
    assert job_files.parse_seconds(b"1e400") is None
    assert job_files.parse_seconds(b"nan") is None
    assert job_files.sane_time(-1.0) is None
    assert job_files.sane_time(1.7e9) == 1.7e9


def test_a_checkpoint_of_another_owner_is_not_read(tmp_path: Path):
    path = tmp_path / "checkpoint.out"
    path.write_bytes(b"saved")
    assert read_written(path, FIELDS, owner=os.getuid()) == b"saved"
    assert read_written(path, FIELDS, owner=os.getuid() + 1) is None
    link = tmp_path / "link"
    link.symlink_to(path)
    assert read_written(link, FIELDS) is None


# --- real jobs, a scripted client ------------------------------------------------------------


def _watched_run(client: FakeClient, command: str) -> JobRun:
    """An attempt with its watchdogs (so its heartbeats read the beat file)."""
    claim = claim_answer(job_id="j-1", attempt=1, command=command)
    settings = WorkerSettings(heartbeat_s=0.05, preempt_grace_s=0.5)
    samplers = Samplers(gpu=None, memory=ProcessTreeSampler())
    return JobRun(claim, client, settings, "w1", lambda run: None, samplers=samplers)


def _bodies(client: FakeClient) -> list[dict[str, Any]]:
    with client.lock:
        return list(client.heartbeat_bodies)


def _more_beats(client: FakeClient, count: int = 10) -> None:
    target = len(_bodies(client)) + count
    wait_for(lambda: len(_bodies(client)) >= target, f"{count} more heartbeats")


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_beat_file_costs_the_job_its_step_and_nothing_else(case: str, tmp_path: Path):
    client = FakeClient()
    command = f'F="$CORRAL_BEAT_FILE"; {HOSTILE[case]}; touch {tmp_path}/up; {SPIN}'
    run = _watched_run(client, command)
    run.start()
    wait_for_file(tmp_path / "up")
    _more_beats(client)
    bodies = _bodies(client)
    for body in bodies:
        orjson.dumps(body)  # every heartbeat encodes
    assert not any("progress" in body for body in bodies), bodies[-1]
    client.heartbeat_answer = PREEMPT
    finish(run)
    assert client.names()[-1] == "preempted"


def test_a_plain_step_still_shows(tmp_path: Path):
    client = FakeClient()
    run = _watched_run(client, f'echo 7 > "$CORRAL_BEAT_FILE"; touch {tmp_path}/up; {SPIN}')
    run.start()
    wait_for_file(tmp_path / "up")
    wait_for(lambda: any(body.get("progress") == {"step": 7} for body in _bodies(client)), "step 7")
    client.heartbeat_answer = PREEMPT
    finish(run)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_defer_file_asks_for_nothing_and_a_later_number_still_goes(case: str, tmp_path: Path):
    client = FakeClient()
    hostile = HOSTILE[case].replace("'", "'\\''")
    trap = f"trap 'F=\"$CORRAL_DEFER_FILE\"; {hostile}; touch {tmp_path}/hinted' USR1"
    fix = f'[ -e {tmp_path}/fix ] && rm -f "$CORRAL_DEFER_FILE" && echo 30 > "$CORRAL_DEFER_FILE"'
    fix += f" && rm {tmp_path}/fix"
    run = _watched_run(client, f"{trap}; touch {tmp_path}/up; while :; do {fix}; sleep 0.05; done")
    run.start()
    wait_for_file(tmp_path / "up")
    client.heartbeat_answer = CHECKPOINT
    wait_for_file(tmp_path / "hinted")
    _more_beats(client)

    def asked() -> list[float]:
        return [body["defer_s"] for body in _bodies(client) if "defer_s" in body]

    # A huge number is still a number of seconds: asked for once, capped.
    first = [MAX_DEFER_S] if case == "huge_integer" else []
    assert asked() == first
    for body in _bodies(client):
        orjson.dumps(body)
    (tmp_path / "fix").touch()
    wait_for(lambda: asked() == [*first, 30.0], "the plain deferral")
    client.heartbeat_answer = PREEMPT
    finish(run)


@pytest.mark.parametrize("case", ["fifo", "symlink_to_dev_zero"])
def test_a_done_file_that_is_no_file_still_ends_the_phase(case: str, tmp_path: Path):
    """The done file is only looked at (one ``stat``): whatever it is, "saved" is the job's word."""
    client = FakeClient()
    hostile = HOSTILE[case].replace("'", "'\\''")
    save = f'echo state > "$CORRAL_CHECKPOINT_OUT"; F="$CORRAL_CHECKPOINT_DONE_FILE"; {hostile}'
    run = _watched_run(client, f"trap '{save}' USR1; touch {tmp_path}/up; {SPIN}")
    run.start()
    wait_for_file(tmp_path / "up")
    client.heartbeat_answer = CHECKPOINT
    wait_for(lambda: any(call[0] == "upload_checkpoint" for call in client.reports()), "the upload")
    client.heartbeat_answer = PREEMPT
    finish(run)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_checkpoint_never_hangs_the_report(case: str, tmp_path: Path):
    client = FakeClient()
    # Laid out beside the path and dated before it is moved in: a heartbeat between the write and
    # the ``touch`` would rightly report the file's real time.
    laid_out = f'F="$CORRAL_CHECKPOINT_OUT.part"; {HOSTILE[case]}; touch -h -d 1960-01-01 "$F"'
    run = _watched_run(client, f'{laid_out}; mv "$F" "$CORRAL_CHECKPOINT_OUT"; true')
    run.start()
    finish(run)
    assert client.names()[-1] == "done"
    uploaded = [call[-1] for call in client.reports() if call[0] == "upload_checkpoint"]
    assert all(len(data) <= 4_000_000 for data in uploaded)
    if case in ("fifo", "symlink_to_dev_zero"):
        assert uploaded == []
    for body in _bodies(client):
        orjson.dumps(body)
        assert "checkpoint_at" not in body  # a time before the epoch is left out
