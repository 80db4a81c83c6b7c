"""A job is contained on its host (issue 21), end to end: a real server, real workers, real jobs."""

from __future__ import annotations

import pytest

from corral.client import Client
from tests.e2e.conftest import wait_for, wait_status

pytestmark = pytest.mark.e2e


def test_a_job_writing_a_huge_step_costs_no_other_job_its_lease(
    server, client: Client, start_worker, tmp_path
):
    """The issue's attack: a step no heartbeat can carry once kept every lease on the worker from
    being renewed, and the neighbours' jobs were run again. Now the step is left out."""
    start_worker(server.url, "w1", "--heartbeat-s", "0.1")
    hostile = client.submit(
        {"command": f'echo 123456789012345678901234567890 > "$CORRAL_BEAT_FILE"; touch {tmp_path}/a; sleep 3'}
    )["id"]
    neighbour = client.submit({"command": f'echo 5 > "$CORRAL_BEAT_FILE"; touch {tmp_path}/b; sleep 3'})["id"]
    wait_for(lambda: (tmp_path / "a").exists() and (tmp_path / "b").exists(), 15, "both jobs to start")
    wait_for(lambda: client.get_job(neighbour)["progress"], 10, "the neighbour's step")
    for job_id in (hostile, neighbour):
        ended = wait_status(client, job_id, {"done", "failed"}, 20)
        assert ended["status"] == "done", ended
        assert ended["attempts"] == 1, "never re-run: its lease was kept"
