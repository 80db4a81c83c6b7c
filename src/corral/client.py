"""The Python SDK: a typed HTTP client for every route of ``shared/API.md``.

The CLI and the worker use it too, so the SDK is exercised by every end-to-end test. Errors come
back as ``ApiError`` with the server's stable ``code``; a server that cannot be reached is
``ServerUnreachable``.

    from corral.client import Client
    with Client("http://127.0.0.1:8765") as corral:
        job = corral.submit({"command": "python train.py", "resources": {"gpus": 1}})
        print(corral.why(job["id"]))
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from corral.transport import Response, Transport, TransportError

DEFAULT_SERVER = "http://127.0.0.1:8765"


class ClientError(Exception):
    """Base of the SDK's errors."""


class ServerUnreachable(ClientError):
    def __init__(self, url: str, error: Exception) -> None:
        super().__init__(f"cannot reach corral server at {url}: {error}")
        self.url = url


class ApiError(ClientError):
    """The server answered with an error status and envelope."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class Client:
    def __init__(self, server: str = DEFAULT_SERVER, timeout_s: float = 30.0) -> None:
        self.server = server.rstrip("/")
        self._http = Transport(self.server, timeout_s)

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
        content = body if isinstance(body, bytes) else orjson.dumps(body) if body is not None else None
        try:
            response = self._http.request(method, path, content, params, headers, timeout_s)
        except TransportError as error:
            raise ServerUnreachable(self.server, error) from error
        if response.status_code >= 400:
            raise _api_error(response)
        return response

    def _json(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        """The decoded JSON answer; a body that is not JSON is ``ApiError`` ``bad_response`` (a proxy's
        error page, a truncated answer), never an exception from the decoder."""
        response = self.request(method, path, body, **kwargs)
        if response.status_code == 204 or not response.content:
            return None
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError as error:
            raise ApiError(response.status_code, "bad_response", f"answer is not JSON: {error}") from error

    # --- jobs and gangs --------------------------------------------------------------------

    def submit(self, job: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        """Submit one job (or a gang when ``gang_size`` > 1). Returns the job, or ``{gang_id, tasks}``."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        result: dict[str, Any] = self._json("POST", "/jobs", job, headers=headers)
        return result

    def submit_batch(
        self, jobs: list[dict[str, Any]], idempotency_key: str | None = None
    ) -> list[dict[str, Any]]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        result = self._json("POST", "/jobs/batch", {"jobs": jobs}, headers=headers, timeout_s=120.0)
        items: list[dict[str, Any]] = result["items"]
        return items

    def list_jobs_page(self, limit: int = 500, after: str | None = None, **filters: Any) -> dict[str, Any]:
        params = {key: value for key, value in filters.items() if value is not None}
        params["limit"] = limit
        if after:
            params["after"] = after
        result: dict[str, Any] = self._json("GET", "/jobs", params=params)
        return result

    def iter_jobs(self, page_size: int = 500, **filters: Any) -> Iterator[dict[str, Any]]:
        """Every job matching ``filters``, following the cursor page by page."""
        after = None
        while True:
            page = self.list_jobs_page(limit=page_size, after=after, **filters)
            yield from page["items"]
            after = page["next"]
            if not after:
                return

    def get_job(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", f"/jobs/{job_id}")
        return result

    def events(self, job_id: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self._json("GET", f"/jobs/{job_id}/events")["items"]
        return items

    def why(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", f"/jobs/{job_id}/why")
        return result

    def cancel(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._json("POST", f"/jobs/{job_id}/cancel")
        return result

    def gang(self, gang_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", f"/gangs/{gang_id}")
        return result

    def cancel_gang(self, gang_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._json("POST", f"/gangs/{gang_id}/cancel")
        return result

    # --- workers ---------------------------------------------------------------------------

    def register_worker(self, registration: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._json("POST", "/workers/register", registration)
        return result

    def worker_heartbeat(self, worker_id: str, body: dict[str, Any] | None = None) -> None:
        self.request("POST", f"/workers/{worker_id}/heartbeat", body or {})

    def workers(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self._json("GET", "/workers")["items"]
        return items

    def worker(self, worker_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", f"/workers/{worker_id}")
        return result

    def drain_worker(self, worker_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._json("POST", f"/workers/{worker_id}/drain")
        return result

    # --- the job protocol (workers) -------------------------------------------------------

    def claim(self, worker_id: str, wait_s: float = 0.0) -> dict[str, Any] | None:
        """Claim work: the job with ``attempt``, ``gpu_indices`` and ``env``, or ``None``."""
        params: dict[str, Any] = {"worker_id": worker_id}
        if wait_s > 0:
            params["wait"] = wait_s
        result: dict[str, Any] | None = self._json(
            "GET", "/jobs/next", params=params, timeout_s=wait_s + 30.0
        )
        return result

    def job_heartbeat(
        self, job_id: str, worker_id: str, attempt: int, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        params = {"worker_id": worker_id, "attempt": attempt}
        result: dict[str, Any] = self._json("POST", f"/jobs/{job_id}/heartbeat", body or {}, params=params)
        return result

    def done(self, job_id: str, worker_id: str, attempt: int) -> dict[str, Any]:
        params = {"worker_id": worker_id, "attempt": attempt}
        result: dict[str, Any] = self._json("POST", f"/jobs/{job_id}/done", {}, params=params)
        return result

    def fail(
        self,
        job_id: str,
        worker_id: str,
        attempt: int,
        exit_code: int | None,
        error: str | None = None,
        output_tail: str | None = None,
        release: bool = False,
    ) -> dict[str, Any]:
        """Report a failed attempt; ``release`` hands the job back without spending the attempt
        (the worker stopped it for its own reasons, e.g. a shutdown past its timeout)."""
        params = {"worker_id": worker_id, "attempt": attempt}
        body: dict[str, Any] = {"exit_code": exit_code, "error": error, "output_tail": output_tail}
        if release:
            body["release"] = True
        result: dict[str, Any] = self._json("POST", f"/jobs/{job_id}/fail", body, params=params)
        return result

    def watchdog(
        self, job_id: str, worker_id: str, attempt: int, kind: str, detail: dict[str, Any] | str | None = None
    ) -> dict[str, Any]:
        """Report a watchdog trip (``budget`` / ``stall`` / ``gpu_health``) after stopping the job.
        Returns the job: re-queued at the front of the queue, or failed past the retry cap."""
        params = {"worker_id": worker_id, "attempt": attempt}
        body = {"kind": kind, "detail": detail}
        result: dict[str, Any] = self._json("POST", f"/jobs/{job_id}/watchdog", body, params=params)
        return result

    def upload_checkpoint(
        self, job_id: str, worker_id: str, attempt: int, epoch: int | None, data: bytes
    ) -> None:
        """Store the checkpoint a job wrote (opaque bytes), for its next attempt. With ``epoch``:
        from a stop the server asked for; without: from the attempt however it ended, before its
        final report."""
        params: dict[str, Any] = {"worker_id": worker_id, "attempt": attempt}
        if epoch is not None:
            params["epoch"] = epoch
        self.request(
            "POST",
            f"/jobs/{job_id}/checkpoint",
            data,
            params=params,
            headers={"content-type": "application/octet-stream"},
        )

    def download_checkpoint(self, job_id: str) -> bytes | None:
        """The job's stored checkpoint, or None when it has none."""
        response = self.request("GET", f"/jobs/{job_id}/checkpoint")
        return None if response.status_code == 204 else response.content

    def preempted(self, job_id: str, worker_id: str, attempt: int, epoch: int) -> dict[str, Any]:
        params = {"worker_id": worker_id, "attempt": attempt, "epoch": epoch}
        result: dict[str, Any] = self._json("POST", f"/jobs/{job_id}/preempted", params=params)
        return result

    # --- operations ------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", "/health")
        return result


def _api_error(response: Response) -> ApiError:
    try:
        envelope = orjson.loads(response.content)["error"]
        return ApiError(response.status_code, envelope["code"], envelope["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return ApiError(response.status_code, "http_error", response.text[:200] or response.reason_phrase)
