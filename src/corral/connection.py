"""What both HTTP clients of corral share: the user-facing SDK (``corral.client.Client``) and the
worker's protocol client (``corral.worker.calls.WorkerClient``).

A ``Connection`` holds the transport, the token and the CA file; it sends a request again while a
busy server answers 503 with ``Retry-After`` (nothing was changed), turns an error answer into
``ApiError`` with the server's stable code and an unreachable server into ``ServerUnreachable``,
and reads an answer into its model of the wire contract (``corral.protocol.answers``), imported at
the first answer that needs one: ``request_json`` answers plain data, which is all the CLI's
everyday commands need, so ``corral jobs`` starts without pydantic (issue 23).

The two clients are apart so that a user's ``dir(client)`` lists what a user does (submit, wait,
read, cancel) and not the calls only a worker may make (claim, report, heartbeat): the routes of
API.md's "The job protocol (workers)", which a ``user`` token is refused anyway.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Self, TypeVar

from corral.client_errors import DEFAULT_SERVER, ApiError, ServerUnreachable
from corral.http_response import Response, TransportError

if TYPE_CHECKING:
    from corral.oneshot import OneShotTransport
    from corral.protocol.answers import Answer
    from corral.transport import Transport

AnswerT = TypeVar("AnswerT", bound="Answer")


class Connection:
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

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.server!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections kept for reuse (``with Client(...) as corral:`` does it on the way
        out); a later call opens a new one."""
        self._http.close()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
        busy_retry_s: float | None = None,
    ) -> Response:
        """Send one request (a ``bytes`` body as is, anything else as JSON); the raw answer.
        ``ApiError`` for an error status, ``ServerUnreachable`` when no answer came. A 503 with
        ``Retry-After`` (a busy store) is sent again for ``busy_retry_s`` (by default the
        connection's), 0: never (a periodic call whose next try is its next period, a heartbeat).

        >>> corral.request("GET", "/healthz").status_code
        200
        """
        content = body if isinstance(body, bytes) else self._dumps(body) if body is not None else None
        give_up = time.monotonic() + (self.busy_retry_s if busy_retry_s is None else busy_retry_s)
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
        without pydantic; and for any route this client has no method for. Errors as for every
        call.

        >>> corral.request_json("GET", "/health")["status"]
        'ok'
        """
        return self._decode(self.request(method, path, body, params=params, headers=headers))

    def _answer(
        self, model: type[AnswerT], method: str, path: str, body: Any = None, **kwargs: Any
    ) -> AnswerT:
        """The answer parsed into its model of the wire contract; one that is not JSON or breaks
        the model is ``ApiError`` ``bad_response`` (with the decoded body, when there is one)."""
        response = self.request(method, path, body, **kwargs)
        return parse(model, response, self._decode(response))

    def _decode(self, response: Response) -> Any:
        if response.status_code == 204 or not response.content:
            return None
        try:
            return self._loads(response.content)
        except json.JSONDecodeError as error:  # orjson's error is a subclass
            raise ApiError(response.status_code, "bad_response", f"answer is not JSON: {error}") from error

    def download_checkpoint(self, job_id: str) -> bytes | None:
        """The job's stored checkpoint (``GET /jobs/{id}/checkpoint``), or None when it has none:
        a user reads it to resume elsewhere, a worker to hand it to the job's next attempt.

        >>> job = corral.submit("true", gpus=64)
        >>> corral.download_checkpoint(job.id) is None
        True
        """
        response = self.request("GET", f"/jobs/{job_id}/checkpoint")
        return None if response.status_code == 204 else response.content


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


def parse(model: type[AnswerT], response: Response, data: Any) -> AnswerT:
    """``data`` (the decoded answer of ``response``) read into ``model``; ``ApiError``
    ``bad_response`` naming where it breaks the model."""
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


def log_chunk(response: Response) -> LogChunk:
    """A ``GET /jobs/{id}/logs`` answer: its bytes and what its headers say of them."""
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


def _api_error(response: Response) -> ApiError:
    try:
        envelope = json.loads(response.content)["error"]
        return ApiError(response.status_code, envelope["code"], envelope["message"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        return ApiError(response.status_code, "http_error", response.text[:200] or response.reason_phrase)
