"""Arrays and dependencies end to end (API.md "Arrays and dependencies"): a real server, a real
worker, real jobs. An array's %N throttle holds while its tasks run, a job after the array starts
only once every task is done, and a job after a failed one is cancelled."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from corral.client import Client
from tests.e2e.conftest import clean_environment, wait_for, wait_status

pytestmark = pytest.mark.e2e

# each task notes when it started and ended (seconds, from the same host clock), and its env
TASK = (
    "date +%s.%N > {dir}/$CORRAL_ARRAY_INDEX.start;"
    " env | grep ^CORRAL_ARRAY_ > {dir}/$CORRAL_ARRAY_INDEX.env;"
    " sleep 0.6; date +%s.%N > {dir}/$CORRAL_ARRAY_INDEX.end"
)


def _submit_cli(server_url: str, *argv: str) -> str:
    """``corral submit`` as a user runs it; its one line of output."""
    done = subprocess.run(
        [sys.executable, "-m", "corral", "submit", "--server", server_url, "--no-workdir", *argv],
        capture_output=True,
        text=True,
        env=clean_environment(),
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = most = 0
    for _, change in edges:  # an end sorts before a start at the same instant
        running += change
        most = max(most, running)
    return most


def test_an_array_runs_at_most_its_throttle_and_a_job_after_it_waits_for_all(
    server, client: Client, start_worker, tmp_path: Path
):
    start_worker(server.url, "w1", "--cpus", "8")
    marks = tmp_path / "marks"
    marks.mkdir()
    array_id = _submit_cli(server.url, "--array", "0-3%2", "--", TASK.format(dir=marks))
    assert array_id.startswith("a-")
    after_mark = tmp_path / "after.start"
    after_id = _submit_cli(server.url, "--after", f"ok:{array_id}", "--", f"date +%s.%N > {after_mark}")

    wait_status(client, after_id, {"done", "failed", "cancelled"}, timeout_s=60)
    array = client.array(array_id)
    assert array.counts == {"done": 4}
    intervals = [
        (float((marks / f"{index}.start").read_text()), float((marks / f"{index}.end").read_text()))
        for index in range(4)
    ]
    assert _most_at_once(intervals) <= 2, intervals
    assert client.get_job(after_id)["status"] == "done"
    assert client.events(after_id)[0].reason.code == "dependency"  # submitted waiting
    assert float(after_mark.read_text()) >= max(end for _, end in intervals)
    environment = dict(line.split("=", 1) for line in (marks / "3.env").read_text().split())
    assert environment == {"CORRAL_ARRAY_ID": array_id, "CORRAL_ARRAY_INDEX": "3", "CORRAL_ARRAY_SIZE": "4"}


def test_a_job_after_a_failing_job_is_cancelled(server, client: Client, start_worker, tmp_path: Path):
    start_worker(server.url, "w1")
    failing = _submit_cli(server.url, "--max-retries", "1", "--", "exit 3")
    never = tmp_path / "never-ran"
    after_id = _submit_cli(server.url, "--after", f"ok:{failing}", "--", f"touch {never}")
    wait_status(client, failing, {"failed"}, timeout_s=30)
    cancelled = wait_status(client, after_id, {"cancelled", "done", "failed"}, timeout_s=30)
    assert (cancelled["status"], cancelled["reason"]["code"]) == ("cancelled", "dependency_never_satisfied")
    assert not never.exists()
    wait_for(lambda: client.get_job(after_id)["finished_at"], 5, "the cancelled job's end time")
