"""A final outcome is kept until it is delivered or refused (issue 12: a 16 s outage once made
finished work run twice, the worker having given up its ``done`` after 6 tries)."""

from __future__ import annotations

from corral.client import ApiError, ServerUnreachable
from corral.worker.reporting import OUTCOME_MAX_BACKOFF_S, REPORT_TRIES, deliver, deliver_outcome


def _flaky(failures: int, then: object = "ok"):
    calls = []

    def send():
        calls.append(1)
        if len(calls) <= failures:
            raise ServerUnreachable("http://x", OSError("refused"))
        if isinstance(then, Exception):
            raise then
        return then

    return send, calls


def test_an_outcome_outlives_any_number_of_failed_tries():
    send, calls = _flaky(100)
    slept: list[float] = []
    assert deliver_outcome(send, "done report", {}, sleep=slept.append) == "ok"
    assert len(calls) == 101
    assert max(slept) == OUTCOME_MAX_BACKOFF_S
    assert sum(slept) > 16 * 10, "well past the outage that used to lose the report"


def test_an_outcome_refused_with_409_is_dropped_at_once():
    send, calls = _flaky(3, ApiError(409, "stale_attempt", "moved on"))
    assert deliver_outcome(send, "done report", {}, sleep=lambda _: None) is None
    assert len(calls) == 4


def test_other_reports_still_give_up():
    send, calls = _flaky(100)
    assert deliver(send, "checkpoint upload", {}, sleep=lambda _: None) is None
    assert len(calls) == REPORT_TRIES
