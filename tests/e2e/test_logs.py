"""Logs end to end: a real worker ships a real job's output while it runs, `corral logs -f` shows it
live and ends with the attempt, and the whole output is there after the end."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
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
    job = client.submit_body({"command": command})
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


def test_a_follower_sees_each_line_while_the_job_waits_for_it_to_be_seen(
    start_server, start_worker, tmp_path
):
    """Each line reaches a ``follow=1`` reader while the job that printed it is blocked until the
    reader has it: with job heartbeats 5 minutes apart, only a shipper that sends soon after the
    output arrives (not at the heartbeat) lets the job go on. (Issue 23: ``logs -f`` showed output
    in bursts, at each heartbeat.) The latency itself is measured by bench/log_latency.py."""
    server = start_server("--heartbeat-timeout-s", "900")
    start_worker(server.url, "w1", "--heartbeat-s", "300")
    gates = [tmp_path / f"seen-{number}" for number in range(3)]
    steps = "; ".join(
        f"echo line {number}; while [ ! -e {gate} ]; do sleep 0.02; done" for number, gate in enumerate(gates)
    )
    with Client(server.url) as client:
        job = client.submit_body({"command": f"{steps}; echo last"})
        seen = []
        # A read timeout far past any delay of the shipper, and far before the next heartbeat.
        with httpx.stream(
            "GET", f"{server.url}/jobs/{job['id']}/logs", params={"follow": "1"}, timeout=30
        ) as answer:
            assert answer.status_code == 200
            for line in answer.iter_lines():
                seen.append(line)
                if line.startswith("line "):
                    # the job waits for this line to be seen: it has not gone past it
                    assert client.get_job(job["id"])["status"] == "running"
                    gates[int(line.split()[1])].touch()
        assert seen == ["line 0", "line 1", "line 2", "last"]
        wait_status(client, job["id"], {"done"})


def test_logs_follow_ends_cleanly_on_ctrl_c(server, client: Client, start_worker):
    start_worker(server.url, "w1")
    job = client.submit_body({"command": "echo up; sleep 60"})
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
