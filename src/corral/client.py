"""The Python SDK: a typed HTTP client for every route of ``shared/API.md``.

Every answer comes back as its model of the wire contract (``corral.protocol.answers``): a
``JobAnswer``, a ``WorkerAnswer``, a ``ClaimAnswer``... The CLI and the worker use it too, so the
SDK is exercised by every end-to-end test. The models (pydantic) are imported at the first answer
that needs one, not with this module: ``request_json`` answers plain data, which is all the CLI's
everyday commands need, so ``corral jobs`` starts without pydantic (issue 23).

Errors come back as ``ApiError`` with the server's stable ``code`` (``bad_response`` for an answer
that is not JSON or breaks its model); a server that cannot be reached is ``ServerUnreachable``. A
503 with ``Retry-After`` (a busy store: nothing was changed) is sent again after the time it says,
for up to ``busy_retry_s`` in all, before it is an error.

    from corral.client import Client
    with Client("http://127.0.0.1:8765") as corral:
        job = corral.submit({"command": "python train.py", "resources": {"gpus": 1}})
        print(corral.why(job.id).reasons[0].message)
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from corral.client_errors import DEFAULT_SERVER, ApiError, ClientError, ServerUnreachable
from corral.http_response import Response, TransportError

__all__ = ["DEFAULT_SERVER", "ApiError", "Client", "ClientError", "LogChunk", "ServerUnreachable"]

if TYPE_CHECKING:
    from corral.oneshot import OneShotTransport
    from corral.protocol.answers import (
        Answer,
        ArrayAnswer,
        ArraySubmitted,
        CheckpointSaved,
        ClaimAnswer,
        EventAnswer,
        GangAnswer,
        GangSubmitted,
        HealthAnswer,
        HeartbeatAnswer,
        JobAnswer,
        JobPage,
        LogAppendedAnswer,
        PoolAnswer,
        UsagePage,
        WhyAnswer,
        WorkerAnswer,
        WorkerPage,
    )
    from corral.transport import Transport

AnswerT = TypeVar("AnswerT", bound="Answer")


class Client:
    """``token``: sent as ``Authorization: Bearer`` on every request; None reads ``CORRAL_TOKEN``
    (unset or empty: no token, for a server without authentication). ``ca_file``: the CA
    certificate an ``https://`` server's certificate must chain to; None reads ``CORRAL_CA_FILE``
    (unset or empty: the system's trust store). ``busy_retry_s``: how long a 503 with
    ``Retry-After`` (a busy store) is sent again. ``light``: for a short-lived process that makes a
    call or two (the CLI): the standard library's ``json`` instead of orjson (slower per answer,
    but orjson imports ``dataclasses``, ``uuid`` and more), and for ``http://`` a connection per
    request on a plain socket (``corral.oneshot``) instead of ``http.client``'s pool, whose import
    is a third of a short command's start-up (issue 23). A worker, with thousands of calls, keeps
    the defaults."""

    def __init__(
        self,
        server: str = DEFAULT_SERVER,
        timeout_s: float = 30.0,
        token: str | None = None,
        busy_retry_s: float = 20.0,
        ca_file: str | None = None,
        light: bool = False,
    ) -> None:
        self.server = server.rstrip("/")
        self._dumps: Callable[[Any], bytes]
        self._loads: Callable[[bytes], Any]
        if light:
            self._dumps, self._loads = _plain_dumps, json.loads
        else:
            import orjson

            self._dumps, self._loads = orjson.dumps, orjson.loads
        if token is None:
            token = os.environ.get("CORRAL_TOKEN", "").strip()
        headers = {"authorization": f"Bearer {token}"} if token else None
        if ca_file is None:
            ca_file = os.environ.get("CORRAL_CA_FILE", "").strip() or None
        self._http: Transport | OneShotTransport
        if light and self.server.startswith("http://"):
            from corral.oneshot import OneShotTransport

            self._http = OneShotTransport(self.server, timeout_s, headers)
        else:
            from corral.transport import Transport

            self._http = Transport(self.server, timeout_s, headers, ca_file)
        self.busy_retry_s = busy_retry_s
        #: when the last try of the last request went out (monotonic; a 503 with ``Retry-After``
        #: is sent again): for a caller that owns this client on one thread (the worker's claim
        #: loop counts a claimed run's lease from the try the server answered)
        self.last_sent_at: float | None = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # --- plumbing --------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Response:
        content = body if isinstance(body, bytes) else self._dumps(body) if body is not None else None
        give_up = time.monotonic() + self.busy_retry_s
        while True:
            self.last_sent_at = time.monotonic()
            try:
                response = self._http.request(method, path, content, params, headers, timeout_s)
            except TransportError as error:
                raise ServerUnreachable(self.server, error) from error
            wait = _retry_after(response)
            if wait is None or time.monotonic() + wait > give_up:
                break
            time.sleep(wait)
        if response.status_code >= 400:
            raise _api_error(response)
        return response

    def request_json(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """The decoded answer as plain JSON data, read into no model (None for an empty answer):
        for callers that only print it, like the CLI's everyday commands, which then start
        without pydantic. Errors as for every call."""
        return self._decode(self.request(method, path, body, params=params, headers=headers))

    def _answer(
        self, model: type[AnswerT], method: str, path: str, body: Any = None, **kwargs: Any
    ) -> AnswerT:
        """The answer parsed into its model of the wire contract; one that is not JSON or breaks
        the model is ``ApiError`` ``bad_response`` (with the decoded body, when there is one)."""
        response = self.request(method, path, body, **kwargs)
        return _parse(model, response, self._decode(response))

    def _decode(self, response: Response) -> Any:
        if response.status_code == 204 or not response.content:
            return None
        try:
            return self._loads(response.content)
        except json.JSONDecodeError as error:  # orjson's error is a subclass
            raise ApiError(response.status_code, "bad_response", f"answer is not JSON: {error}") from error

    # --- jobs and gangs --------------------------------------------------------------------

    def submit(
        self,
        job: dict[str, Any],
        idempotency_key: str | None = None,
        array: str | None = None,
        after: Sequence[str | dict[str, str]] | None = None,
    ) -> JobAnswer | GangSubmitted | ArraySubmitted:
        """Submit one job (or a gang when ``gang_size`` > 1): the job, or the gang's id and task ids.
        ``array`` (``"0-99%8"``): an array of such jobs, answered with its id and task ids.
        ``after``: conditions, each ``{"id": ..., "when": "ok"}`` or a ``"when:id"`` string."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        if array is not None:
            job = {**job, "array": array}
        if after:
            job = {**job, "after": [parse_after(item) if isinstance(item, str) else item for item in after]}
        response = self.request("POST", "/jobs", job, headers=headers)
        return _submitted(response, self._decode(response))

    def submit_batch(
        self, jobs: list[dict[str, Any]], idempotency_key: str | None = None
    ) -> list[JobAnswer | GangSubmitted | ArraySubmitted]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        response = self.request("POST", "/jobs/batch", {"jobs": jobs}, headers=headers, timeout_s=120.0)
        data = self._decode(response)
        items = data.get("items") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise ApiError(response.status_code, "bad_response", "answer has no items list", data)
        return [_submitted(response, item) for item in items]

    def list_jobs_page(self, limit: int = 500, after: str | None = None, **filters: Any) -> JobPage:
        from corral.protocol.answers import JobPage

        params = {key: value for key, value in filters.items() if value is not None}
        params["limit"] = limit
        if after:
            params["after"] = after
        return self._answer(JobPage, "GET", "/jobs", params=params)

    def iter_jobs(self, page_size: int = 500, **filters: Any) -> Iterator[JobAnswer]:
        """Every job matching ``filters``, following the cursor page by page."""
        after = None
        while True:
            page = self.list_jobs_page(limit=page_size, after=after, **filters)
            yield from page.items
            after = page.next
            if not after:
                return

    def get_job(self, job_id: str) -> JobAnswer:
        from corral.protocol.answers import JobAnswer

        return self._answer(JobAnswer, "GET", f"/jobs/{job_id}")

    def events(self, job_id: str) -> list[EventAnswer]:
        from corral.protocol.answers import EventsAnswer

        return self._answer(EventsAnswer, "GET", f"/jobs/{job_id}/events").items

    def why(self, job_id: str) -> WhyAnswer:
        from corral.protocol.answers import WhyAnswer

        return self._answer(WhyAnswer, "GET", f"/jobs/{job_id}/why")

    def cancel(self, job_id: str) -> JobAnswer:
        from corral.protocol.answers import JobAnswer

        return self._answer(JobAnswer, "POST", f"/jobs/{job_id}/cancel")

    def logs(self, job_id: str, attempt: int | None = None, offset: int = 0) -> LogChunk:
        """The stored output of an attempt (the latest by default) from byte ``offset``."""
        params: dict[str, Any] = {"offset": offset}
        if attempt is not None:
            params["attempt"] = attempt
        return _log_chunk(self.request("GET", f"/jobs/{job_id}/logs", params=params, timeout_s=120.0))

    def follow_logs(
        self, job_id: str, attempt: int | None = None, offset: int = 0, poll_s: float = 1.0
    ) -> Iterator[LogChunk]:
        """The attempt's output as it is written, until the attempt ends: each chunk as it is
        stored. Polls ``GET /jobs/{id}/logs`` from where the last read ended (so it resumes cleanly
        through a lost connection or another replica) and ends once the job is past the attempt."""
        while True:
            chunk = self.logs(job_id, attempt, offset)
            attempt = chunk.attempt
            if chunk.data:
                yield chunk
                offset = chunk.start + len(chunk.data)
                if offset < chunk.size:
                    continue
            job = self.get_job(job_id)
            if job.attempts == 0 and job.status not in ("done", "failed", "cancelled"):
                attempt = None  # not started yet: wait for its first attempt
            elif job.attempts != attempt or job.status not in ("running", "preempting"):
                last = self.logs(job_id, attempt, offset)  # bytes stored before it ended
                if last.data:
                    yield last
                return
            time.sleep(poll_s)

    def gang(self, gang_id: str) -> GangAnswer:
        from corral.protocol.answers import GangAnswer

        return self._answer(GangAnswer, "GET", f"/gangs/{gang_id}")

    def cancel_gang(self, gang_id: str) -> GangAnswer:
        from corral.protocol.answers import GangAnswer

        return self._answer(GangAnswer, "POST", f"/gangs/{gang_id}/cancel")

    def gang_events(self, gang_id: str) -> list[EventAnswer]:
        """Every task's events in time order, each naming its task (``job_id``, ``gang_index``)."""
        from corral.protocol.answers import EventsAnswer

        return self._answer(EventsAnswer, "GET", f"/gangs/{gang_id}/events").items

    def gang_why(self, gang_id: str) -> WhyAnswer:
        """The gang's status and the reasons of its most telling task (named by ``job_id``)."""
        from corral.protocol.answers import WhyAnswer

        return self._answer(WhyAnswer, "GET", f"/gangs/{gang_id}/why")

    def array(self, array_id: str, limit: int = 100) -> ArrayAnswer:
        """The array: its tasks' counts by status and its first ``limit`` tasks by index."""
        from corral.protocol.answers import ArrayAnswer

        return self._answer(ArrayAnswer, "GET", f"/arrays/{array_id}", params={"limit": limit})

    def cancel_array(self, array_id: str) -> ArrayAnswer:
        """Cancel every task of the array that has not ended (owner or admin)."""
        from corral.protocol.answers import ArrayAnswer

        return self._answer(ArrayAnswer, "POST", f"/arrays/{array_id}/cancel")

    # --- workers ---------------------------------------------------------------------------

    def register_worker(self, registration: dict[str, Any]) -> WorkerAnswer:
        from corral.protocol.answers import WorkerAnswer

        return self._answer(WorkerAnswer, "POST", "/workers/register", registration)

    def worker_heartbeat(self, worker_id: str, body: dict[str, Any] | None = None) -> None:
        self.request("POST", f"/workers/{worker_id}/heartbeat", body or {})

    def workers(self) -> list[WorkerAnswer]:
        return self.worker_page().items

    def worker_page(self) -> WorkerPage:
        """Every worker, and the server's topology levels (widest first)."""
        from corral.protocol.answers import WorkerPage

        return self._answer(WorkerPage, "GET", "/workers")

    def worker(self, worker_id: str) -> WorkerAnswer:
        from corral.protocol.answers import WorkerAnswer

        return self._answer(WorkerAnswer, "GET", f"/workers/{worker_id}")

    def drain_worker(self, worker_id: str) -> WorkerAnswer:
        from corral.protocol.answers import WorkerAnswer

        return self._answer(WorkerAnswer, "POST", f"/workers/{worker_id}/drain")

    def undrain_worker(self, worker_id: str) -> WorkerAnswer:
        from corral.protocol.answers import WorkerAnswer

        return self._answer(WorkerAnswer, "POST", f"/workers/{worker_id}/undrain")

    def remove_worker(self, worker_id: str) -> None:
        """Forget an offline worker that holds no job (admin); ``ApiError`` 409 otherwise."""
        self.request("DELETE", f"/workers/{worker_id}")

    def leave_worker(self, worker_id: str) -> WorkerAnswer:
        """Say the worker is stopping: the server shows it offline at once."""
        from corral.protocol.answers import WorkerAnswer

        return self._answer(WorkerAnswer, "POST", f"/workers/{worker_id}/leave")

    # --- usage -----------------------------------------------------------------------------

    def usage(self, since: str | None = None, until: str | None = None, by: str = "user,pool") -> UsagePage:
        """GPU- and CPU-seconds of a window (RFC 3339 times; the server's default: the last 7 days)
        per user, pool or both (API.md "Usage"); a user's token sees its own rows only."""
        params = {"by": by, **{name: value for name, value in (("since", since), ("until", until)) if value}}
        from corral.protocol.answers import UsagePage

        return self._answer(UsagePage, "GET", "/usage", params=params)

    # --- pools -----------------------------------------------------------------------------

    def pools(self) -> list[PoolAnswer]:
        """Every pool (stored, implied by a descendant, or named by a job), in path order."""
        from corral.protocol.answers import PoolPage

        return self._answer(PoolPage, "GET", "/pools").items

    def pool(self, path: str) -> PoolAnswer:
        from corral.protocol.answers import PoolAnswer

        return self._answer(PoolAnswer, "GET", f"/pools/{path}")

    def put_pool(self, path: str, body: dict[str, Any] | None = None) -> PoolAnswer:
        """Create or replace the pool's settings (a setting left out is inherited; see API.md)."""
        from corral.protocol.answers import PoolAnswer

        return self._answer(PoolAnswer, "PUT", f"/pools/{path}", body or {})

    def delete_pool(self, path: str) -> None:
        self.request("DELETE", f"/pools/{path}")

    # --- the job protocol (workers) -------------------------------------------------------

    def claim(
        self, worker_id: str, wait_s: float = 0.0, idempotency_key: str | None = None
    ) -> ClaimAnswer | None:
        """Claim work: the job with ``attempt``, ``gpu_indices`` and ``env``, or ``None``.

        Retry a claim that got no answer (``ServerUnreachable``, a 5xx) with the same
        ``idempotency_key``: if the first one started a run, the retry answers that run again
        instead of leaving it to be lost with its lease."""
        from corral.protocol.answers import ClaimAnswer

        response = self._claim_request(worker_id, wait_s, idempotency_key, None)
        data = self._decode(response)
        return None if data is None else _parse(ClaimAnswer, response, data)

    def claim_many(
        self, worker_id: str, limit: int, wait_s: float = 0.0, idempotency_key: str | None = None
    ) -> list[ClaimAnswer]:
        """Claim up to ``limit`` (1 to 64) jobs that fit the worker together, started in one
        server transaction (``GET /jobs/next?max=``): each as ``claim`` answers it; empty when none.
        ``idempotency_key`` as for ``claim``."""
        from corral.protocol.answers import ClaimsAnswer

        response = self._claim_request(worker_id, wait_s, idempotency_key, limit)
        data = self._decode(response)
        return [] if data is None else list(_parse(ClaimsAnswer, response, data).items)

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
        self, job_id: str, worker_id: str, attempt: int, body: dict[str, Any] | None = None
    ) -> HeartbeatAnswer:
        from corral.protocol.answers import HeartbeatAnswer

        params = {"worker_id": worker_id, "attempt": attempt}
        return self._answer(HeartbeatAnswer, "POST", f"/jobs/{job_id}/heartbeat", body or {}, params=params)

    def done(self, job_id: str, worker_id: str, attempt: int) -> JobAnswer:
        from corral.protocol.answers import JobAnswer

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
        from corral.protocol.answers import JobAnswer

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
        from corral.protocol.answers import JobAnswer

        params = {"worker_id": worker_id, "attempt": attempt}
        body = {"kind": kind, "detail": detail}
        return self._answer(JobAnswer, "POST", f"/jobs/{job_id}/watchdog", body, params=params)

    def upload_checkpoint(
        self, job_id: str, worker_id: str, attempt: int, epoch: int | None, data: bytes
    ) -> CheckpointSaved:
        """Store the checkpoint a job wrote (opaque bytes), for its next attempt. With ``epoch``:
        from a stop the server asked for; without: from the attempt however it ended, before its
        final report."""
        from corral.protocol.answers import CheckpointSaved

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

    def download_checkpoint(self, job_id: str) -> bytes | None:
        """The job's stored checkpoint, or None when it has none."""
        response = self.request("GET", f"/jobs/{job_id}/checkpoint")
        return None if response.status_code == 204 else response.content

    def append_log(
        self, job_id: str, worker_id: str, attempt: int, offset: int, data: bytes
    ) -> LogAppendedAnswer:
        """Send output of the attempt starting at byte ``offset`` of its stream; a retry of a chunk
        already stored is accepted once (``accepted`` 0)."""
        from corral.protocol.answers import LogAppendedAnswer

        params = {"worker_id": worker_id, "attempt": attempt, "offset": offset}
        headers = {"content-type": "application/octet-stream"}
        return self._answer(
            LogAppendedAnswer, "POST", f"/jobs/{job_id}/logs", data, params=params, headers=headers
        )

    def preempted(self, job_id: str, worker_id: str, attempt: int, epoch: int) -> JobAnswer:
        from corral.protocol.answers import JobAnswer

        params = {"worker_id": worker_id, "attempt": attempt, "epoch": epoch}
        return self._answer(JobAnswer, "POST", f"/jobs/{job_id}/preempted", params=params)

    # --- operations ------------------------------------------------------------------------

    def health(self) -> HealthAnswer:
        from corral.protocol.answers import HealthAnswer

        return self._answer(HealthAnswer, "GET", "/health")


def _plain_dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _retry_after(response: Response) -> float | None:
    """Seconds to wait before sending again, for a 503 that says when (``Retry-After`` in seconds:
    the server's busy store); None for any other answer."""
    if response.status_code != 503:
        return None
    value = response.headers.get("retry-after", "")
    try:
        seconds = float(value)
    except ValueError:
        return None
    return min(max(seconds, 0.05), 30.0)


def _parse(model: type[AnswerT], response: Response, data: Any) -> AnswerT:
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "answer"
        raise ApiError(
            response.status_code, "bad_response", f"answer breaks the {model.__name__} schema at {where}: "
            f"{first['msg']}", data,
        ) from error  # fmt: skip


class LogChunk(NamedTuple):
    """Bytes of one attempt's output: ``data`` starts at byte ``start`` of its stream; ``size`` is
    where the stored stream ended when read, ``dropped`` how many of its first bytes are gone."""

    attempt: int
    start: int
    size: int
    dropped: int
    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def _log_chunk(response: Response) -> LogChunk:
    headers = {name.lower(): value for name, value in response.headers.items()}
    try:
        return LogChunk(
            attempt=int(headers["x-corral-attempt"]),
            start=int(headers["x-corral-log-start"]),
            size=int(headers["x-corral-log-size"]),
            dropped=int(headers["x-corral-log-dropped"]),
            data=response.content,
        )
    except (KeyError, ValueError) as error:
        raise ApiError(
            response.status_code, "bad_response", f"log answer lacks its headers: {error}"
        ) from error


def parse_after(text: str) -> dict[str, str]:
    """``"ok:ID"`` (or ``notok:``, ``any:``; a bare ``ID`` means ``ok``) as an ``after`` condition."""
    when, _, job_id = text.strip().rpartition(":")
    return {"id": job_id, "when": when or "ok"}


def _submitted(response: Response, data: Any) -> JobAnswer | GangSubmitted | ArraySubmitted:
    """A submit's item: a gang's ``{gang_id, tasks}``, an array's ``{array_id, tasks}``, else the job."""
    from corral.protocol.answers import ArraySubmitted, GangSubmitted, JobAnswer

    if isinstance(data, dict) and "command" not in data and "array_id" in data:
        return _parse(ArraySubmitted, response, data)
    if isinstance(data, dict) and "command" not in data and "gang_id" in data:
        return _parse(GangSubmitted, response, data)
    return _parse(JobAnswer, response, data)


def _api_error(response: Response) -> ApiError:
    try:
        envelope = json.loads(response.content)["error"]
        return ApiError(response.status_code, envelope["code"], envelope["message"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        return ApiError(response.status_code, "http_error", response.text[:200] or response.reason_phrase)
