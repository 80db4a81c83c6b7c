"""Logs end to end: a real worker ships a real job's output while it runs, `corral logs -f` shows it
live and ends with the attempt, and the whole output is there after the end."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from corral.client import Client
from tests.e2e.conftest import clean_environment, wait_for, wait_status

pytestmark = pytest.mark.e2e


def test_logs_follow_shows_a_running_job_live_and_the_whole_output_after(
    server, client: Client, start_worker, tmp_path
):
    start_worker(server.url, "w1")
    gate = tmp_path / "go"
    command = (
        f"echo first; echo to-stderr >&2; while [ ! -e {gate} ]; do sleep 0.05; done; seq 1 2000; echo last"
    )
    job = client.submit({"command": command})
    follower = subprocess.Popen(
        [sys.executable, "-m", "corral", "logs", job["id"], "-f", "--server", server.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_environment(),
    )
    assert follower.stdout is not None
    # live: the first lines arrive while the job is still blocked on the gate
    assert follower.stdout.readline() == b"first\n"
    assert follower.stdout.readline() == b"to-stderr\n"
    assert client.get_job(job["id"])["status"] == "running"
    gate.touch()
    rest, err = follower.communicate(timeout=30)
    assert follower.returncode == 0, err
    expected = "\n".join(str(number) for number in range(1, 2001)) + "\nlast\n"
    assert rest.decode() == expected
    wait_status(client, job["id"], {"done"})
    whole = client.logs(job["id"])
    assert whole.text == "first\nto-stderr\n" + expected
    assert whole.attempt == 1


def test_logs_follow_ends_cleanly_on_ctrl_c(server, client: Client, start_worker):
    start_worker(server.url, "w1")
    job = client.submit({"command": "echo up; sleep 60"})
    wait_for(lambda: client.logs(job["id"]).text == "up\n" or None, 15, "the first line")
    follower = subprocess.Popen(
        [sys.executable, "-m", "corral", "logs", job["id"], "--follow", "--server", server.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_environment(),
    )
    assert follower.stdout is not None
    assert follower.stdout.readline() == b"up\n"
    time.sleep(0.3)
    follower.send_signal(signal.SIGINT)
    _, err = follower.communicate(timeout=10)
    assert follower.returncode == 130
    assert b"Traceback" not in err
    client.cancel(job["id"])
