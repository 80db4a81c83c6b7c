"""The worker's final reports in batches (``corral.worker.final_reports``): attempts ending within
the window share one request, each thread gets its own outcome (its refusal, or the request's
failure), a server without the batch route makes every report go by its own route from then on,
and through a real attempt on the scripted client the batch carries what the single routes did."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from corral.client import ApiError
from corral.client_errors import ServerUnreachable
from corral.testing.fake_client import FakeClient
from corral.worker import final_reports
from corral.worker.final_reports import FinalReports
from corral.worker.reporting import deliver_outcome
from tests.unit.worker_support import FIELDS, finish, make_run

#: long enough that only a full batch (``MAX_BATCH``, made small here) ends a window in these tests
LONG_WINDOW_S = 30.0


class Sender:
    """A scripted ``final_reports``: ``answer(reports)`` as the client's answer or an exception."""

    def __init__(self, answer: Any = None) -> None:
        self.batches: list[list[dict[str, Any]]] = []
        self.answer = answer
        self.lock = threading.Lock()

    def final_reports(self, worker_id: str, reports: list[dict[str, Any]]) -> Any:
        with self.lock:
            self.batches.append(list(reports))
        answer = self.answer(reports) if self.answer is not None else [None] * len(reports)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def send_together(reports: FinalReports, sender: Sender, job_ids: list[str]) -> dict[str, Any]:
    """Each job's done from its own thread, as attempts report; each one's outcome (None or the
    raised error) and the single-route calls made."""
    outcomes: dict[str, Any] = {}
    singles: list[str] = []

    def report(job_id: str) -> None:
        try:
            reports.done(sender, job_id, 1, lambda: singles.append(job_id))
            outcomes[job_id] = None
        except Exception as error:
            outcomes[job_id] = error

    threads = [threading.Thread(target=report, args=(job_id,)) for job_id in job_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    outcomes["singles"] = singles
    return outcomes


@pytest.fixture
def full_at_three(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(final_reports, "MAX_BATCH", 3)


def test_reports_of_one_window_share_one_request_and_get_their_own_outcomes(full_at_three):
    stale = ApiError(409, "stale_attempt", "attempt 1 is not the job's")
    sender = Sender(lambda reports: [stale if report["job_id"] == "j-2" else None for report in reports])
    outcomes = send_together(FinalReports("w1", LONG_WINDOW_S), sender, ["j-1", "j-2", "j-3"])
    assert len(sender.batches) == 1
    assert sorted(report["job_id"] for report in sender.batches[0]) == ["j-1", "j-2", "j-3"]
    assert all(
        report == {"job_id": report["job_id"], "attempt": 1, "outcome": "done"}
        for report in sender.batches[0]
    )
    assert outcomes["j-1"] is None and outcomes["j-3"] is None
    assert outcomes["j-2"] is stale
    assert outcomes["singles"] == []


def test_a_failed_request_fails_every_report_of_it_and_each_is_sent_again(full_at_three):
    """``deliver_outcome`` retries each report; the retries of one window batch together again."""
    answers = iter([ServerUnreachable("http://server", ConnectionRefusedError("refused")), None])
    sender = Sender(lambda reports: next(answers) or [None] * len(reports))
    batcher = FinalReports("w1", LONG_WINDOW_S)
    singles: list[str] = []
    threads = [
        threading.Thread(
            target=deliver_outcome,
            args=(
                lambda job_id=job_id: batcher.done(sender, job_id, 1, lambda: singles.append(job_id)),
                "done",
                FIELDS,
            ),
            kwargs={"sleep": lambda _: None},
        )
        for job_id in ("j-1", "j-2", "j-3")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert [len(batch) for batch in sender.batches] == [3, 3]
    assert singles == []


def test_a_server_without_the_route_gets_each_report_by_its_own_route_from_then_on(full_at_three):
    sender = Sender(lambda reports: None)  # the client's answer to a 404: no such route
    batcher = FinalReports("w1", LONG_WINDOW_S)
    first = send_together(batcher, sender, ["j-1", "j-2", "j-3"])
    assert sorted(first["singles"]) == ["j-1", "j-2", "j-3"]
    assert not batcher.batching
    later = send_together(batcher, sender, ["j-4"])
    assert later["singles"] == ["j-4"]
    assert len(sender.batches) == 1, "the route is not asked for again"


def test_a_window_of_zero_sends_each_report_by_its_own_route():
    sender = Sender()
    batcher = FinalReports("w1", 0)
    assert sorted(send_together(batcher, sender, ["j-1", "j-2"])["singles"]) == ["j-1", "j-2"]
    assert sender.batches == []


def test_a_lone_report_goes_when_its_window_ends():
    sender = Sender()
    send_together(FinalReports("w1", 0.001), sender, ["j-1"])
    assert sender.batches == [[{"job_id": "j-1", "attempt": 1, "outcome": "done"}]]


def test_no_request_carries_more_reports_than_a_batch_holds(monkeypatch: pytest.MonkeyPatch):
    """However the reports of a window arrive (more than a request carries may be gathered before
    the first of them wakes), each request carries at most ``MAX_BATCH``, and every report goes."""
    monkeypatch.setattr(final_reports, "MAX_BATCH", 2)
    sender = Sender()
    batcher = FinalReports("w1", 0.05)
    job_ids = [f"j-{index}" for index in range(9)]
    outcomes = send_together(batcher, sender, job_ids)
    assert all(len(batch) <= 2 for batch in sender.batches), sender.batches
    assert sorted(report["job_id"] for batch in sender.batches for report in batch) == sorted(job_ids)
    assert [outcomes[job_id] for job_id in job_ids] == [None] * 9


def test_an_attempt_reports_done_and_fail_through_the_batch():
    """A real attempt on the scripted client: its done, and its failure with the tail and the
    reason, go as items of a batch, carrying what the single routes carried."""
    client = FakeClient()
    batcher = FinalReports("w1", 0.001)
    run = make_run(client, "true", final_reports=batcher)
    run.start()
    finish(run)
    failing = make_run(client, "echo out; exit 3", final_reports=batcher)
    failing.start()
    finish(failing)
    assert client.batches == [
        [{"job_id": "j-1", "attempt": 1, "outcome": "done"}],
        [
            {
                "job_id": "j-1",
                "attempt": 1,
                "outcome": "fail",
                "exit_code": 3,
                "error": "exited with code 3",
                "output_tail": "out\n",
            }
        ],
    ]
    assert client.names() == ["done", "fail"]


def test_an_attempt_falls_back_to_its_own_route_on_an_older_server():
    client = FakeClient()
    client.final_reports_answer = lambda reports: None
    batcher = FinalReports("w1", 0.001)
    run = make_run(client, "true", final_reports=batcher)
    run.start()
    finish(run)
    assert len(client.batches) == 1
    assert client.names() == ["done"]
    assert not batcher.batching


def test_a_refused_request_sends_its_reports_by_their_own_routes_this_time(full_at_three):
    """A batch refused as a whole (its body over a limit, say) loses none of its reports."""
    sender = Sender(lambda reports: ApiError(413, "too_large", "the body is over its limit"))
    batcher = FinalReports("w1", LONG_WINDOW_S)
    outcomes = send_together(batcher, sender, ["j-1", "j-2", "j-3"])
    assert sorted(outcomes["singles"]) == ["j-1", "j-2", "j-3"]
    assert [outcomes[job_id] for job_id in ("j-1", "j-2", "j-3")] == [None] * 3
    assert batcher.batching, "the route is there: later reports still go in batches"
