"""A job is contained on its host (issue 21), end to end: a real server, real workers, real jobs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from corral.client import Client
from tests.e2e.conftest import FAST_SERVER_FLAGS, FAST_WORKER_FLAGS, clean_environment, wait_for, wait_status
from tests.e2e.test_preemption import LOW

pytestmark = pytest.mark.e2e


def test_a_job_writing_a_huge_step_costs_no_other_job_its_lease(
    server, client: Client, start_worker, tmp_path
):
    """The issue's attack: a step no heartbeat can carry once kept every lease on the worker from
    being renewed, and the neighbours' jobs were run again. Now the step is left out."""
    start_worker(server.url, "w1", "--heartbeat-s", "0.1")
    hostile = client.submit_body(
        {"command": f'echo 123456789012345678901234567890 > "$CORRAL_BEAT_FILE"; touch {tmp_path}/a; sleep 3'}
    )["id"]
    neighbour = client.submit_body({"command": f'echo 5 > "$CORRAL_BEAT_FILE"; touch {tmp_path}/b; sleep 3'})[
        "id"
    ]
    wait_for(lambda: (tmp_path / "a").exists() and (tmp_path / "b").exists(), 15, "both jobs to start")
    wait_for(lambda: client.get_job(neighbour)["progress"], 10, "the neighbour's step")
    for job_id in (hostile, neighbour):
        ended = wait_status(client, job_id, {"done", "failed"}, 20)
        assert ended["status"] == "done", ended
        assert ended["attempts"] == 1, "never re-run: its lease was kept"


def test_a_second_worker_with_the_same_id_refuses_to_start_and_touches_nothing(
    server, client: Client, start_worker, tmp_path: Path
):
    first = start_worker(server.url, "w1")
    job = client.submit_body({"command": f"touch {tmp_path}/up; sleep 2"})["id"]
    wait_for(lambda: (tmp_path / "up").exists(), 15, "the job to start")
    command = [sys.executable, "-m", "corral", "worker", "--server", server.url, "--worker-id", "w1"]
    command += [*FAST_WORKER_FLAGS, "--state-dir", str(tmp_path / "state-w1")]
    second = subprocess.run(
        command, env=clean_environment(), capture_output=True, timeout=60, cwd=tmp_path, check=False
    )
    assert second.returncode == 1
    assert f"worker pid {first.process.pid} already runs" in second.stdout.decode() + second.stderr.decode()
    ended = wait_status(client, job, {"done", "failed"}, 20)
    assert ended["status"] == "done" and ended["attempts"] == 1, ended


def test_a_job_sees_none_of_its_workers_environment(server, client: Client, start_worker, tmp_path: Path):
    start_worker(server.url, "w1", env={"CORRAL_TOKEN": "worker-secret", "SOME_SECRET": "x", "LC_ALL": "C"})
    # A root worker with a token runs a job as its user's account: root's here.
    job = client.submit_body({"command": f"env > {tmp_path}/env", "env": {"MINE": "1"}, "user": "root"})["id"]
    assert wait_status(client, job, {"done", "failed"}, 20)["status"] == "done"
    names = {line.partition("=")[0] for line in (tmp_path / "env").read_text().splitlines()}
    assert "CORRAL_TOKEN" not in names and "SOME_SECRET" not in names
    assert {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LC_ALL", "MINE", "CORRAL_JOB_ID"} <= names


def test_a_job_starts_in_its_workdir_or_a_fresh_directory(
    server, client: Client, start_worker, tmp_path: Path
):
    start_worker(server.url, "w1")
    (tmp_path / "project").mkdir()
    placed = client.submit_body({"command": "pwd > where", "workdir": str(tmp_path / "project")})["id"]
    fresh = client.submit_body({"command": f"pwd > {tmp_path}/fresh"})["id"]
    for job in (placed, fresh):
        assert wait_status(client, job, {"done", "failed"}, 20)["status"] == "done"
    assert (tmp_path / "project" / "where").read_text().strip() == str(tmp_path / "project")
    assert Path((tmp_path / "fresh").read_text().strip()) != tmp_path  # never the worker's directory


def test_a_missing_workdir_fails_the_job_at_once(server, client: Client, start_worker, tmp_path: Path):
    start_worker(server.url, "w1")
    job = client.submit_body({"command": "true", "workdir": str(tmp_path / "gone"), "max_retries": 3})["id"]
    ended = wait_status(client, job, {"done", "failed"}, 20)
    assert (ended["status"], ended["reason"]["code"], ended["attempts"]) == (
        "failed",
        "workdir_unavailable",
        1,
    )
    assert "No such file" in ended["error"]


def test_a_program_under_a_shell_gets_the_checkpoint_hint_and_resumes(start_server, start_worker, tmp_path):
    """``corral submit -- python victim.py`` runs under ``/bin/sh -c`` without ``exec``: the hint
    still reaches the program (the shell around it does not handle SIGUSR1), which saves, and its
    next attempt resumes past step 0."""
    server = start_server(*FAST_SERVER_FLAGS, "--checkpoint-timeout-s", "20")
    start_worker(server.url, "w0", "--gpus", "1", "--vram-mb", "16000", "--gpu-model", "FakeGPU")
    script = tmp_path / "victim.py"
    script.write_text(LOW)
    with Client(server.url) as client:
        low = client.submit_body(
            {
                "command": f"{sys.executable} {script} {tmp_path}",
                "resources": {"gpus": 1},
                "preemption_class": 2,
                "checkpoint": "auto",
            }
        )["id"]
        wait_for(lambda: (tmp_path / "start-1").exists(), 15, "the class-2 job to start")
        wait_for(lambda: client.get_job(low)["progress"], 10, "a progress beat")
        high = client.submit_body({"command": "true", "resources": {"gpus": 1}, "preemption_class": 7})["id"]
        saved = int(wait_for(lambda: _text(tmp_path / "saved-1"), 15, "the save SIGUSR1 asked for"))
        wait_status(client, high, {"done"}, 20)
        wait_status(client, low, {"done"}, 30)
        assert int((tmp_path / "start-2").read_text()) >= saved > 0


def _text(path: Path) -> str | None:
    return path.read_text() if path.exists() and path.read_text() else None
