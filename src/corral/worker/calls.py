"""The worker's own client: the calls only a worker makes (API.md "Workers" and "The job protocol
(workers)"), apart from the user-facing SDK (``corral.client.Client``), which has none of them.

``WorkerClient`` shares the SDK's plumbing (``corral.connection.Connection``: the transport, the
token, the busy retry, the answer models) and adds: register, the worker heartbeat and leave; the
claim; the job heartbeat and the reports (done, fail, watchdog, preempted); checkpoint and log
uploads, and the checkpoint download a claimed attempt resumes from.

Two of them have newer forms a server may not know, so each says when it was not understood, and
the agent falls back to the older form (``corral.worker.agent``):

- ``worker_beat``: ``POST /workers/{id}/heartbeat`` with ``jobs`` in the body, answered
  ``{"jobs": {id: answer}}``. An older server either refuses the unknown field (400) or answers
  ``{}``: the answer is then ``None`` and the jobs' leases were not renewed.
- ``final_reports``: ``POST /workers/{id}/reports``, the final reports (done, fail) of several
  attempts in one request, answered per report. An older server answers 404 (no such route): the
  answer is then ``None`` and nothing was reported.
- ``claim_several``: ``GET /jobs/next?worker_id=W&max=N``, answered 200 ``{"items": [claim, ...]}``
  or 204. An older server refuses ``max`` (400, raised as ``ApiError``), or ignores it and
  answers one plain claim (returned as a list of one, with ``understood`` False).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from corral.client_errors import ApiError
from corral.connection import Connection, parse
from corral.http_response import Response
from corral.protocol.answers import (
    CheckpointSaved,
    ClaimAnswer,
    ClaimsAnswer,
    HeartbeatAnswer,
    JobAnswer,
    LogAppendedAnswer,
    WorkerAnswer,
    WorkerHeartbeatAnswer,
)
from corral.worker.fence import HEARTBEAT_BUSY_RETRY_S

#: the most jobs one claim may ask for (the server's bound on ``max``)
MAX_CLAIM = 64


@dataclass
class Claimed:
    """What one claim call brought: the claims, each parsed or the ``bad_response`` error of an
    item that breaks the contract (the agent fails such a job), and whether the server understood
    ``max``."""

    items: list[ClaimAnswer | ApiError]
    understood: bool


def _claim_item(status: int, data: Any) -> ClaimAnswer | ApiError:
    try:
        return ClaimAnswer.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "answer"
        return ApiError(
            status, "bad_response", f"answer breaks the ClaimAnswer schema at {where}: {first['msg']}", data
        )


def _report_outcome(status: int, item: Any) -> ApiError | None:
    """One report's outcome in a batch's answer: None when taken (200), else its error."""
    if not isinstance(item, dict) or not isinstance(item.get("status"), int):
        return ApiError(status, "bad_response", "a report's answer has no status", item)
    if item["status"] == 200:
        return None
    error = item.get("error")
    if not isinstance(error, dict):
        return ApiError(status, "bad_response", "a refused report's answer has no error", item)
    return ApiError(item["status"], str(error.get("code", "")), str(error.get("message", "")), item)


class WorkerClient(Connection):
    """A worker's connection to its server (``Connection``'s settings; the worker's token must
    have the ``worker`` role). Every job report carries ``worker_id`` and ``attempt``, the fence
    the claim gave: a stale one is ``ApiError`` 409 ``stale_attempt`` and changes nothing."""

    # --- the worker ------------------------------------------------------------------------

    def register_worker(self, registration: dict[str, Any]) -> WorkerAnswer:
        return self._answer(WorkerAnswer, "POST", "/workers/register", registration)

    def worker_heartbeat(self, worker_id: str, body: dict[str, Any] | None = None) -> None:
        self.request("POST", f"/workers/{worker_id}/heartbeat", body or {})

    def leave_worker(self, worker_id: str) -> WorkerAnswer:
        """Say the worker is stopping: the server shows it offline at once."""
        return self._answer(WorkerAnswer, "POST", f"/workers/{worker_id}/leave")

    # --- the job protocol -----------------------------------------------------------------

    def claim(
        self, worker_id: str, wait_s: float = 0.0, idempotency_key: str | None = None
    ) -> ClaimAnswer | None:
        """Claim work: the job with ``attempt``, ``gpu_indices`` and ``env``, or ``None``.

        Retry a claim that got no answer (``ServerUnreachable``, a 5xx) with the same
        ``idempotency_key``: if the first one started a run, the retry answers that run again
        instead of leaving it to be lost with its lease."""
        response = self._claim_request(worker_id, wait_s, idempotency_key, None)
        data = self._decode(response)
        return None if data is None else parse(ClaimAnswer, response, data)

    def claim_many(
        self, worker_id: str, limit: int, wait_s: float = 0.0, idempotency_key: str | None = None
    ) -> list[ClaimAnswer]:
        """Claim up to ``limit`` (1 to 64) jobs that fit the worker together, started in one
        server transaction (``GET /jobs/next?max=``): each as ``claim`` answers it; empty when none.
        ``idempotency_key`` as for ``claim``."""
        response = self._claim_request(worker_id, wait_s, idempotency_key, limit)
        data = self._decode(response)
        return [] if data is None else list(parse(ClaimsAnswer, response, data).items)

    def _claim_request(
        self, worker_id: str, wait_s: float, idempotency_key: str | None, limit: int | None
    ) -> Response:
        params: dict[str, Any] = {"worker_id": worker_id}
        if limit is not None:
            params["max"] = limit
        if wait_s > 0:
            params["wait"] = wait_s
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self.request("GET", "/jobs/next", params=params, headers=headers, timeout_s=wait_s + 30.0)

    def job_heartbeat(
        self,
        job_id: str,
        worker_id: str,
        attempt: int,
        body: dict[str, Any] | None = None,
        busy_retry_s: float | None = None,
    ) -> HeartbeatAnswer:
        """``busy_retry_s``: as for ``request`` (the worker sends its heartbeats once)."""
        params = {"worker_id": worker_id, "attempt": attempt}
        return self._answer(
            HeartbeatAnswer,
            "POST",
            f"/jobs/{job_id}/heartbeat",
            body or {},
            params=params,
            busy_retry_s=busy_retry_s,
        )

    def done(self, job_id: str, worker_id: str, attempt: int) -> JobAnswer:
        params = {"worker_id": worker_id, "attempt": attempt}
        return self._answer(JobAnswer, "POST", f"/jobs/{job_id}/done", {}, params=params)

    def report_done(self, job_id: str, worker_id: str, attempt: int) -> None:
        """``done``, without reading the answer (the job object) into its model: a worker does
        nothing with it, and validating it was a twelfth of the worker's own CPU per short job
        (py-spy, ``bench/e2e.py``). Refusals and retries are ``request``'s, as for ``done``."""
        self.request("POST", f"/jobs/{job_id}/done", {}, params={"worker_id": worker_id, "attempt": attempt})

    def fail(
        self,
        job_id: str,
        worker_id: str,
        attempt: int,
        exit_code: int | None,
        error: str | None = None,
        output_tail: str | None = None,
        release: bool = False,
        reason: str | None = None,
    ) -> JobAnswer:
        """Report a failed attempt; ``release`` hands the job back without spending the attempt
        (the worker stopped it for its own reasons, e.g. a shutdown past its timeout); ``reason``
        a failure code of API.md (``no_such_account``, ``workdir_unavailable``: not retried;
        ``oom_killed``: retried like any failure)."""
        params = {"worker_id": worker_id, "attempt": attempt}
        body: dict[str, Any] = {"exit_code": exit_code, "error": error, "output_tail": output_tail}
        if release:
            body["release"] = True
        if reason is not None:
            body["reason"] = reason
        return self._answer(JobAnswer, "POST", f"/jobs/{job_id}/fail", body, params=params)

    def watchdog(
        self, job_id: str, worker_id: str, attempt: int, kind: str, detail: dict[str, Any] | str | None = None
    ) -> JobAnswer:
        """Report a watchdog trip (``budget`` / ``stall`` / ``gpu_health``) after stopping the job.
        Returns the job: re-queued at the front of the queue, or failed past the retry cap."""
        params = {"worker_id": worker_id, "attempt": attempt}
        body = {"kind": kind, "detail": detail}
        return self._answer(JobAnswer, "POST", f"/jobs/{job_id}/watchdog", body, params=params)

    def upload_checkpoint(
        self, job_id: str, worker_id: str, attempt: int, epoch: int | None, data: bytes
    ) -> CheckpointSaved:
        """Store the checkpoint a job wrote (opaque bytes), for its next attempt. With ``epoch``:
        from a stop the server asked for; without: from the attempt however it ended, before its
        final report."""
        params: dict[str, Any] = {"worker_id": worker_id, "attempt": attempt}
        if epoch is not None:
            params["epoch"] = epoch
        headers = {"content-type": "application/octet-stream"}
        return self._answer(
            CheckpointSaved,
            "POST",
            f"/jobs/{job_id}/checkpoint",
            data,
            params=params,
            headers=headers,
        )

    def append_log(
        self, job_id: str, worker_id: str, attempt: int, offset: int, data: bytes
    ) -> LogAppendedAnswer:
        """Send output of the attempt starting at byte ``offset`` of its stream; a retry of a chunk
        already stored is accepted once (``accepted`` 0)."""
        params = {"worker_id": worker_id, "attempt": attempt, "offset": offset}
        headers = {"content-type": "application/octet-stream"}
        return self._answer(
            LogAppendedAnswer, "POST", f"/jobs/{job_id}/logs", data, params=params, headers=headers
        )

    def preempted(self, job_id: str, worker_id: str, attempt: int, epoch: int) -> JobAnswer:
        params = {"worker_id": worker_id, "attempt": attempt, "epoch": epoch}
        return self._answer(JobAnswer, "POST", f"/jobs/{job_id}/preempted", params=params)

    # --- newer forms ----------------------------------------------------------------------

    def worker_beat(self, worker_id: str, body: dict[str, Any]) -> WorkerHeartbeatAnswer | None:
        """The worker heartbeat; its per-job answers, or None when the server gave none (an older
        server that ignores ``jobs``, or a body without jobs)."""
        response = self.request(
            "POST", f"/workers/{worker_id}/heartbeat", body, busy_retry_s=HEARTBEAT_BUSY_RETRY_S
        )
        data = self._decode(response)
        if not isinstance(data, dict) or data.get("jobs") is None:
            return None
        try:
            return WorkerHeartbeatAnswer.model_validate(data)
        except ValidationError as error:
            raise ApiError(
                response.status_code,
                "bad_response",
                f"answer breaks the WorkerHeartbeatAnswer schema: {error}",
                data,
            ) from error

    def final_reports(self, worker_id: str, reports: list[dict[str, Any]]) -> list[ApiError | None] | None:
        """Send several final reports (``{job_id, attempt, outcome: "done"}`` or ``{job_id,
        attempt, outcome: "fail", exit_code, error, output_tail, release, reason}``) in one
        request: for each, None when the server took it, or the ``ApiError`` its own route would
        have raised (a 409 refusal, a 503 busy store: each handled as that route's would be).
        None when the server has no such route (an older one: 404 or 405), nothing reported. A
        failure of the whole request (``ServerUnreachable``, a 5xx) is raised, for every report.
        The jobs in the answers are not read into their model (see ``report_done``)."""
        try:
            response = self.request("POST", f"/workers/{worker_id}/reports", {"reports": reports})
        except ApiError as error:
            if error.status in (404, 405) and error.code in ("not_found", "method_not_allowed"):
                return None
            raise
        data = self._decode(response)
        items = data.get("items") if isinstance(data, dict) else None
        if not isinstance(items, list) or len(items) != len(reports):
            raise ApiError(
                response.status_code, "bad_response", "answer has no item per report (items)", data
            )
        return [_report_outcome(response.status_code, item) for item in items]

    def claim_several(
        self, worker_id: str, wait_s: float, max_jobs: int, idempotency_key: str | None = None
    ) -> Claimed:
        """Claim up to ``max_jobs`` jobs (see the module doc); ``ApiError`` 400 from an older server.
        ``idempotency_key``: as for ``claim``."""
        response = self._claim_request(worker_id, wait_s, idempotency_key, max(1, min(MAX_CLAIM, max_jobs)))
        data = self._decode(response)
        if data is None:
            return Claimed([], True)
        if isinstance(data, dict) and isinstance(data.get("items"), list) and "command" not in data:
            return Claimed([_claim_item(response.status_code, item) for item in data["items"]], True)
        # One plain claim: the server did not read ``max``.
        return Claimed([_claim_item(response.status_code, data)], False)
