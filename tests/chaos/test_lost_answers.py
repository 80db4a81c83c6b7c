"""Answers lost on the way back: the server applied the call, the worker never heard (a server
killed between its commit and its reply, a dropped connection). The worker retries with the same
key and the server hands back what it already gave, so nothing is run twice or lost."""

from __future__ import annotations

from pathlib import Path

from corral.client import Client
from corral.testing.proxy import AnswerDroppingProxy
from tests.chaos.conftest import FAST_SERVER, assert_history, describe_failures, wait_all_terminal
from tests.e2e.conftest import wait_for


def _first_claim_that_started_work(head: bytes, status: int) -> bool:
    return head.startswith(b"GET /jobs/next") and status == 200


def test_a_lost_claim_answer_is_handed_out_again_and_the_gang_finishes(
    db_url: str, start_server, start_worker, tmp_path: Path
):
    """The CI failure of a kill -9 mid-claim, made certain: rank r's claim is committed, its answer
    lost. Before, the worker never ran r; its heartbeat no longer listed r, the gang drained, and
    since the other rank had ended ``done`` the gang failed. Now the retried claim (same
    Idempotency-Key) answers r again, and every rank runs once, at attempt 1."""
    server = start_server("--db", db_url, *FAST_SERVER)
    runs = tmp_path / "runs.txt"
    dropped_once = []

    def drop(head: bytes, status: int) -> bool:
        if dropped_once or not _first_claim_that_started_work(head, status):
            return False
        dropped_once.append(head)
        return True

    with AnswerDroppingProxy(server.url, drop) as proxy:
        start_worker(proxy.url, "w1", "--cpus", "2")
        start_worker(server.url, "w2", "--cpus", "2")
        with Client(server.url) as client:
            client.submit_body(
                {
                    "command": f'echo "$RANK $CORRAL_ATTEMPT" >> {runs}; sleep 1',
                    "gang_size": 2,
                    "resources": {"cpus": 2},
                }
            )
            ended = wait_all_terminal(client, 2, 40)
            assert set(ended.values()) == {"done"}, describe_failures(client, ended)
            assert proxy.dropped, "the proxy never lost a claim's answer: the test proved nothing"
    assert sorted(runs.read_text().splitlines()) == ["0 1", "1 1"]
    assert_history(db_url)


def test_a_lost_claim_answer_costs_a_single_job_no_attempt(db_url: str, start_server, start_worker):
    """A single job's lost claim answer used to cost it a counted attempt (lost, re-queued, run
    again at attempt 2); the retried claim now answers the same run."""
    server = start_server("--db", db_url, *FAST_SERVER)
    with AnswerDroppingProxy(server.url, _first_claim_that_started_work) as proxy:
        start_worker(proxy.url, "w1", "--cpus", "1")
        with Client(server.url) as client:
            job = client.submit_body({"command": "true", "resources": {"cpus": 1}})
            wait_for(lambda: proxy.dropped or None, 15, "a claim answer to be lost")
            proxy.drop = lambda head, status: False
            ended = wait_all_terminal(client, 1, 30)
            assert ended == {job.id: "done"}, describe_failures(client, ended)
            assert client.get_job(job.id).attempts == 1
    assert_history(db_url)


def test_a_lost_answer_to_a_batch_of_final_reports_reports_nothing_twice(
    db_url: str, start_server, start_worker
):
    """The worker's batched final reports (``POST /workers/{id}/reports``): the server applies a
    batch, its answer is lost (twice), the worker sends each report again. The retries are refused
    as already applied (the fence), so the done job ends once at attempt 1 and the failing job
    spends exactly its two attempts, each re-queue once."""
    server = start_server("--db", db_url, *FAST_SERVER)

    def drop(head: bytes, status: int) -> bool:
        return head.startswith(b"POST /workers/w1/reports") and status == 200 and len(proxy.dropped) < 2

    with AnswerDroppingProxy(server.url, drop) as proxy:
        start_worker(proxy.url, "w1", "--cpus", "2", "--report-window-s", "0.05")
        with Client(server.url) as client:
            finished = client.submit_body({"command": "true", "resources": {"cpus": 1}})
            failing = client.submit_body({"command": "exit 3", "resources": {"cpus": 1}, "max_retries": 2})
            ended = wait_all_terminal(client, 2, 40)
            assert ended == {finished.id: "done", failing.id: "failed"}, describe_failures(client, ended)
            assert len(proxy.dropped) == 2, "the proxy lost no batch's answer: the test proved nothing"
            assert client.get_job(finished.id).attempts == 1
            failed = client.get_job(failing.id)
            assert (failed.attempts, failed.exit_code) == (2, 3)
            moves = [event.to for event in client.events(failing.id)]
            assert moves == ["pending", "running", "pending", "running", "failed"], moves
    assert_history(db_url)
