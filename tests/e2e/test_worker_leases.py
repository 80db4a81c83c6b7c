"""The worker's batched calls against the real server: leases in the worker heartbeat (answered per
job), and a claim of several jobs, which a server that does not know ``max`` answers with one
plain claim (the worker then claims one at a time)."""

from __future__ import annotations

from corral.client import ApiError, Client
from corral.worker.calls import WorkerClient
from tests.e2e.conftest import log_records, wait_status

REGISTRATION = {
    "id": "w1",
    "address": "127.0.0.1",
    "resources": {"cpus": 4, "gpus": 0, "memory_mb": 4096, "vram_mb": 0},
}


def test_the_worker_heartbeat_renews_leases_and_answers_each_job(server, client: Client):
    with WorkerClient(server.url) as worker:
        worker.register_worker(REGISTRATION)
        for _ in range(3):
            client.submit_body({"command": "sleep 30", "resources": {"cpus": 1}})
        claimed = worker.claim_several("w1", 0, 3)
        if not claimed.understood:
            # A server without ``max``: one plain claim; the worker claims one at a time.
            assert len(claimed.items) == 1
        claims = [item for item in claimed.items if not isinstance(item, Exception)]
        while len(claims) < 2:
            one = worker.claim("w1")
            assert one is not None
            claims.append(one)
        first, second = claims[:2]
        body = {
            "running": [first.id, second.id],
            "jobs": [
                {"id": first.id, "attempt": first.attempt, "progress": {"step": 5}, "rss_mb": 12.5},
                {"id": second.id, "attempt": second.attempt + 1},
            ],
        }
        answer = worker.worker_beat("w1", body)
    assert answer is not None and answer.jobs is not None
    assert answer.jobs[first.id].action is None and answer.jobs[first.id].error is None
    refused = answer.jobs[second.id].error
    assert refused is not None and refused.code == "stale_attempt"
    assert client.get_job(first.id).status == "running"


def test_a_worker_keeps_its_leases_in_the_worker_heartbeat(start_server, start_worker):
    """Jobs three times as long as the lease: only renewed leases let them end done, in one
    attempt; the worker never fell back to a job heartbeat per job."""
    server = start_server("--heartbeat-timeout-s", "1", "--reaper-tick-s", "0.2")
    worker = start_worker(server.url, "w1")
    with Client(server.url) as client:
        jobs = [client.submit_body({"command": "sleep 3", "resources": {"cpus": 1}}) for _ in range(4)]
        for job in jobs:
            ended = wait_status(client, job.id, {"done", "failed"}, timeout_s=20)
            assert ended["status"] == "done", ended
            assert ended["attempts"] == 1
    fallback = "the server does not take job heartbeats in the worker heartbeat; one per job"
    assert not log_records([worker], fallback)


def test_report_done_ends_the_job_and_a_second_report_is_refused(server, client: Client):
    with WorkerClient(server.url) as worker:
        worker.register_worker(REGISTRATION)
        job = client.submit_body({"command": "true", "resources": {"cpus": 1}})
        claim = worker.claim("w1")
        assert claim is not None and claim.id == job["id"]
        assert worker.report_done(claim.id, "w1", claim.attempt) is None
        assert wait_status(client, claim.id, {"done", "failed"})["status"] == "done"
        # A refusal is an ApiError, as for ``done``: the worker's delivery drops a 409.
        try:
            worker.report_done(claim.id, "w1", claim.attempt)
        except ApiError as error:
            assert error.status == 409
        else:
            raise AssertionError("a second done report was accepted")
