"""A scripted stand-in for the worker's client (``corral.worker.calls.WorkerClient``): the calls a
worker makes, recorded in order, each answered as the test scripts it.

Why a fake and not a real server: a worker test asks "what did the worker send, in what order"
(the upload before the report, nothing after a 409, a download that fails), which a recording
answers directly and a server only through its state. The fake has the methods of ``WorkerClient``
that the worker uses, with the same signatures, so a test passes it where a ``WorkerClient`` goes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from corral.client_errors import ApiError
from corral.protocol.answers import (
    ClaimAnswer,
    HeartbeatAnswer,
    JobAnswer,
    LogAppendedAnswer,
    WorkerHeartbeatAnswer,
)

Answer = bytes | Exception | None


def job_answer(job_id: str = "j-1", status: str = "running", **fields: Any) -> JobAnswer:
    """A job object as the server answers it, with only what a test cares about given."""
    base: dict[str, Any] = {
        "id": job_id,
        "command": "true",
        "status": status,
        "submitted_at": "2026-01-01T00:00:00.000Z",
    }
    return JobAnswer.model_validate({**base, **fields})


def claim_answer(job_id: str = "j-1", attempt: int = 1, command: str = "true", **fields: Any) -> ClaimAnswer:
    """A claim as ``GET /jobs/next`` answers it (running, at ``attempt``), with only what a test
    cares about given."""
    base: dict[str, Any] = {
        "id": job_id,
        "attempt": attempt,
        "command": command,
        "status": "running",
        "submitted_at": "2026-01-01T00:00:00.000Z",
    }
    return ClaimAnswer.model_validate({**base, **fields})


class FakeClient:
    """The SDK calls the worker makes, recorded in ``calls`` as ``(name, *arguments)``.

    Answers are the SDK's typed ones; a scripted heartbeat answer that breaks the contract is
    raised as ``ApiError`` ``bad_response``, as the SDK does.

    Scripting: ``heartbeat_answer`` (what every job heartbeat answers) or ``heartbeat_error``
    (raised instead, e.g. ``ApiError(409, ...)`` for a lost job); ``upload_error`` (raised by every
    checkpoint upload); ``download_answer`` (the job's checkpoint: bytes, None for 204, or an
    exception to raise) and ``downloads`` (the same, per job id, for gang peers).
    """

    def __init__(self, heartbeat: Any = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.heartbeat_answer: Any = heartbeat if heartbeat is not None else {}
        self.heartbeat_error: Exception | None = None
        self.upload_error: Exception | None = None
        self.download_answer: Answer = None
        self.downloads: dict[str, Answer] = {}
        self.heartbeat_bodies: list[dict[str, Any]] = []
        #: each job heartbeat's ``busy_retry_s`` (the worker sends its heartbeats once: 0)
        self.heartbeat_busy_retries: list[float | None] = []
        #: every watchdog report, whole (``calls`` keeps the job id and kind)
        self.trips: list[dict[str, Any]] = []
        #: each attempt's output as the log shipper sent it, by (job id, attempt); kept apart from
        #: ``calls`` (how many chunks depends on timing); ``log_error`` is raised by every append
        self.logs: dict[tuple[str, int], bytearray] = {}
        self.log_error: Exception | None = None
        #: the batched worker heartbeat's answer, from its body (see ``worker_beat``)
        self.worker_beat_answer: Callable[[dict[str, Any]], Any] | None = None
        #: each batch of final reports sent (``final_reports``), whole; and its scripted answer
        self.batches: list[list[dict[str, Any]]] = []
        self.final_reports_answer: Callable[[list[dict[str, Any]]], Any] | None = None
        #: when the last try of the last call went out (``WorkerClient.last_sent_at``); None: not said
        self.last_sent_at: float | None = None
        self.lock = threading.Lock()

    def _record(self, *call: Any) -> None:
        with self.lock:
            self.calls.append(call)

    def names(self) -> list[str]:
        """The names of the calls made, job heartbeats left out (their number depends on timing)."""
        with self.lock:
            return [call[0] for call in self.calls if call[0] != "job_heartbeat"]

    def reports(self) -> list[tuple[Any, ...]]:
        """The calls made, job heartbeats left out."""
        with self.lock:
            return [call for call in self.calls if call[0] != "job_heartbeat"]

    # --- the job protocol ------------------------------------------------------------------

    def job_heartbeat(
        self,
        job_id: str,
        worker_id: str,
        attempt: int,
        body: dict[str, Any] | None = None,
        busy_retry_s: float | None = None,
    ) -> Any:
        self._record("job_heartbeat", job_id)
        self.heartbeat_busy_retries.append(busy_retry_s)
        self.heartbeat_bodies.append(body or {})
        if self.heartbeat_error is not None:
            raise self.heartbeat_error
        try:
            return HeartbeatAnswer.model_validate(self.heartbeat_answer)
        except ValidationError as error:
            raise ApiError(200, "bad_response", str(error), self.heartbeat_answer) from error

    def upload_checkpoint(
        self, job_id: str, worker_id: str, attempt: int, epoch: int | None, data: bytes
    ) -> None:
        self._record("upload_checkpoint", job_id, worker_id, attempt, epoch, data)
        if self.upload_error is not None:
            raise self.upload_error

    def append_log(
        self, job_id: str, worker_id: str, attempt: int, offset: int, data: bytes
    ) -> LogAppendedAnswer:
        if self.log_error is not None:
            raise self.log_error
        with self.lock:
            stream = self.logs.setdefault((job_id, attempt), bytearray())
            if offset > len(stream):
                raise ApiError(409, "conflict", f"log offset {offset} is past the end ({len(stream)})")
            fresh = data[len(stream) - offset :]
            stream += fresh
            size = len(stream)
        return LogAppendedAnswer(job_id=job_id, attempt=attempt, size=size, accepted=len(fresh), dropped=0)

    def log_text(self, job_id: str = "j-1", attempt: int = 1) -> str:
        with self.lock:
            return bytes(self.logs.get((job_id, attempt), b"")).decode("utf-8", errors="replace")

    def download_checkpoint(self, job_id: str) -> bytes | None:
        self._record("download_checkpoint", job_id)
        answer = self.downloads.get(job_id, self.download_answer)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def preempted(self, job_id: str, worker_id: str, attempt: int, epoch: int) -> JobAnswer:
        self._record("preempted", job_id, worker_id, attempt, epoch)
        return job_answer(job_id, "preempted")

    def done(self, job_id: str, worker_id: str, attempt: int) -> JobAnswer:
        self._record("done", job_id)
        return job_answer(job_id, "done")

    def report_done(self, job_id: str, worker_id: str, attempt: int) -> None:
        """As the real client: ``done`` with its answer left unread (a double overriding ``done``
        is heard here too)."""
        self.done(job_id, worker_id, attempt)

    def fail(self, job_id: str, worker_id: str, attempt: int, *rest: Any, **options: Any) -> JobAnswer:
        self._record("fail", job_id, *rest, *sorted(options.items()))
        return job_answer(job_id, "failed")

    def final_reports(self, worker_id: str, reports: list[dict[str, Any]]) -> list[ApiError | None] | None:
        """``WorkerClient.final_reports``: the batch kept whole in ``batches``; answered by
        ``final_reports_answer(reports)`` when scripted (a list of outcomes, None as an older
        server answers, or an exception to raise), else as a current server: each report taken,
        and recorded in ``calls`` as its own route's call would be (``done``, ``fail``)."""
        with self.lock:
            self.batches.append([dict(report) for report in reports])
        if self.final_reports_answer is not None:
            answer = self.final_reports_answer(reports)
            if isinstance(answer, Exception):
                raise answer
            return answer  # type: ignore[no-any-return]
        for report in reports:
            if report["outcome"] == "done":
                self.done(report["job_id"], worker_id, report["attempt"])
            else:
                options = {name: report[name] for name in ("release", "reason") if name in report}
                fields = (report["exit_code"], report["error"], report["output_tail"])
                self.fail(report["job_id"], worker_id, report["attempt"], *fields, **options)
        return [None] * len(reports)

    def watchdog(
        self, job_id: str, worker_id: str, attempt: int, kind: str, detail: dict[str, Any] | str | None = None
    ) -> JobAnswer:
        self._record("watchdog", job_id, kind)
        self.trips.append(
            {"job_id": job_id, "worker_id": worker_id, "attempt": attempt, "kind": kind, "detail": detail}
        )
        return job_answer(job_id, "pending", watchdog_retries=1)

    # --- the worker ------------------------------------------------------------------------

    def worker_heartbeat(self, worker_id: str, body: dict[str, Any] | None = None) -> None:
        self._record("worker_heartbeat", worker_id, body)

    def leave_worker(self, worker_id: str) -> None:
        self._record("leave_worker", worker_id)

    def worker_beat(self, worker_id: str, body: dict[str, Any]) -> WorkerHeartbeatAnswer | None:
        """``WorkerClient.worker_beat``: recorded as a worker heartbeat; answered by
        ``worker_beat_answer(body)`` when scripted (a dict, or an exception to raise), else as an
        older server answers (no per-job answers)."""
        self._record("worker_heartbeat", worker_id, body)
        if self.worker_beat_answer is None:
            return None
        answer = self.worker_beat_answer(body)
        if isinstance(answer, Exception):
            raise answer
        return WorkerHeartbeatAnswer.model_validate(answer)
