"""HTTP plumbing shared by every route: JSON in and out, the error envelope, request ids.

Every failure leaves as ``{"error": {"code", "message"}}`` with a stable code: bad input is a 400
naming the field (never 422), a wrong method a 405, an unknown path a 404, a busy store a 503
``store_busy`` with ``Retry-After`` (one that cannot write: ``store_unavailable``, also with it),
and an unexpected fault a 500 whose body carries no stack trace (the trace goes to the log with the
request id).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from typing import Any, TypeVar
from urllib.parse import parse_qsl

import orjson
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.domain import errors
from corral.protocol.answers import Answer
from corral.protocol.models import describe_error
from corral.server.envelope import error_response as error_response
from corral.server.envelope import json_response as json_response
from corral.server.state import ServerState, state_of

logger = logging.getLogger("corral.server")

DEFAULT_BODY_LIMIT = 1024 * 1024
ModelT = TypeVar("ModelT", bound=BaseModel)

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 400: "invalid_request", 413: "too_large"}


def answer(model: type[Answer], content: dict[str, Any], status: int = 200) -> Response:
    """Send ``content`` once it holds to its model of the wire contract (``corral.protocol.answers``).

    A server answer that breaks its own schema is a defect: it fails here, as a 500 with a request
    id and the trace in the log, instead of reaching a client that would choke on it.
    """
    model.model_validate(content)
    return json_response(content, status)


async def read_body(request: Request, limit: int = DEFAULT_BODY_LIMIT) -> bytes:
    """The request body, refused with 413 ``too_large`` past ``limit`` bytes (checked while reading)
    and with 408 ``request_timeout`` when it takes longer than the body deadline
    (``server.limits``; none outside the server)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise errors.TooLarge(f"body of {declared} bytes is over the limit of {limit}")
    chunks = []
    size = 0
    deadline_s = request.scope.get("corral.body_timeout_s")
    try:
        async with asyncio.timeout(deadline_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise errors.TooLarge(f"body is over the limit of {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise errors.RequestTimeout(f"the request body did not arrive within {deadline_s:g} s") from None
    return b"".join(chunks)


async def parse_body(
    request: Request, model: type[ModelT], limit: int = DEFAULT_BODY_LIMIT, optional: bool = False
) -> ModelT:
    """Read, decode and validate a JSON object body; an empty body is ``{}`` when ``optional``."""
    body = await read_body(request, limit)
    require_json(request, body)
    return decode_body(body, model, optional)


def require_json(request: Request, body: bytes) -> None:
    """A JSON body must say so: ``application/json`` (or a ``+json`` type). A body sent as
    ``text/plain`` or a form is refused, not parsed anyway (a browser may send those cross-site
    without asking first). An empty body needs no type."""
    if not body.strip():
        return
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json" and not media_type.endswith("+json"):
        raise errors.InvalidRequest(
            f"a JSON body needs Content-Type: application/json, not {media_type or 'none'!r}",
            field="Content-Type",
        )


def decode_body(body: bytes, model: type[ModelT], optional: bool = False) -> ModelT:
    """Decode and validate a JSON object body already read."""
    if not body.strip():
        if optional:
            return model()
        raise errors.InvalidRequest("request body is empty: a JSON object is required", field="body")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise errors.InvalidRequest(f"malformed JSON: {error}", field="body") from None
    if not isinstance(data, dict):
        raise errors.InvalidRequest("the body must be a JSON object", field="body")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        field, message = describe_error(error)
        raise errors.InvalidRequest(message, field=field) from None


def query_int(request: Request, name: str, required: bool = True, default: int | None = None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        if required:
            raise errors.InvalidRequest(f"query parameter {name} is required", field=name)
        return default
    try:
        value = int(raw)
    except ValueError:
        raise errors.InvalidRequest(
            f"query parameter {name} must be an integer, got {raw!r}", field=name
        ) from None
    if not -(2**63) <= value < 2**63:
        raise errors.InvalidRequest(f"query parameter {name} is out of range", field=name)
    return value


def query_float(request: Request, name: str, default: float) -> float:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise errors.InvalidRequest(
            f"query parameter {name} must be a number, got {raw!r}", field=name
        ) from None
    if value != value or value < 0:
        raise errors.InvalidRequest(f"query parameter {name} must be a non-negative number", field=name)
    return value


def idempotency_key(request: Request) -> str | None:
    """The ``Idempotency-Key`` header (a retried submit, a retried claim), 1 to 256 characters."""
    key = request.headers.get("idempotency-key")
    if key is not None and not 0 < len(key) <= 256:
        raise errors.InvalidRequest("Idempotency-Key must be 1 to 256 characters", field="Idempotency-Key")
    return key


def fence(request: Request) -> tuple[str, int]:
    """``worker_id`` and ``attempt`` of a worker's report (400 when missing or malformed)."""
    worker_id = request.query_params.get("worker_id")
    if not worker_id:
        raise errors.InvalidRequest("query parameter worker_id is required", field="worker_id")
    attempt = query_int(request, "attempt")
    assert attempt is not None
    return worker_id, attempt


def note_store_failure(state: ServerState, error: errors.StoreUnavailable) -> None:
    """A store that failed a request is noted in the server's ``StoreHealth`` (the reaper does not
    count a silence the store caused), unless it was refused as the store was known to fail, or
    the child process applying it ended (``OutcomeUnknown``: the store did not fail, and noting it
    would refuse every write of this replica, heartbeats included, until a check commits)."""
    if not isinstance(error, errors.StoreRefused | errors.OutcomeUnknown):
        state.store_health.failed(error)


async def corral_error_handler(request: Request, error: Exception) -> Response:
    """A fault as its envelope; a busy store's 503, or one that could not write, carries
    ``Retry-After`` (nothing was changed, so the worker and the SDK send the same request again
    after it). A store that failed is noted in the server's ``StoreHealth`` (the reaper does not
    count a silence the store caused)."""
    assert isinstance(error, errors.CorralError)
    # A client too slow to send its body loses its connection too (it may be holding many).
    headers: dict[str, str] | None = (
        {"Connection": "close"} if isinstance(error, errors.RequestTimeout) else None
    )
    if isinstance(error, errors.StoreUnavailable):
        note_store_failure(state_of(request), error)
        if error.retry_after_s is not None:
            headers = {"Retry-After": str(error.retry_after_s)}
    return error_response(error.http_status, error.code, error.message, headers)


async def http_error_handler(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    code = _HTTP_CODES.get(error.status_code, "http_error")
    message = error.detail if isinstance(error.detail, str) else str(error.detail)
    if error.status_code == 404:
        message = f"no route {request.method} {request.url.path}"
    elif error.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    return error_response(error.status_code, code, message, headers=getattr(error, "headers", None))


#: query parameters that may be given several times (``?status=pending&status=running``)
MULTI_VALUED = frozenset({"status"})


def repeated_parameter(query_string: bytes) -> str | None:
    """The first single-valued query parameter given more than once (which value would win is a
    guess no caller should have to make), or None."""
    if b"&" not in query_string:
        return None
    seen = set()
    for name, _ in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        if name in seen and name not in MULTI_VALUED:
            return name
        seen.add(name)
    return None


#: request ids: random, from a generator seeded once from the system's randomness. An id only ties
#: a response to its log lines (nothing trusts it), so it needs no system call per request as
#: ``secrets.token_hex`` makes (``getrandom``: one of the five system calls of a no-op request)
_request_ids = random.Random(os.urandom(32))  # noqa: S311 (an id, not a secret)


def new_request_id() -> str:
    """A new request id: 32 hex digits, as ``secrets.token_hex(16)`` writes them."""
    return f"{_request_ids.getrandbits(128):032x}"


class RequestIdMiddleware:
    """The edge of every request (pure ASGI: no body copy).

    - Every response carries ``X-Request-ID``: the caller's, or a new one; 500s included, so the id
      in an error report finds its trace in the log.
    - A NUL character in the path or query is refused with 400 before any route sees it (no id,
      status or filter has one, and PostgreSQL cannot store one).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                request_id = value.decode("latin-1")[:128]
                break
        request_id = request_id or new_request_id()
        scope["request_id"] = request_id
        header = (b"x-request-id", request_id.encode("latin-1"))
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        if "\0" in scope["path"] or b"%00" in scope.get("query_string", b"").lower():
            response = error_response(400, "invalid_request", "the path or query holds a NUL character")
            await response(scope, receive, send_with_id)
            return
        repeated = repeated_parameter(scope.get("query_string", b""))
        if repeated is not None:
            response = error_response(
                400, "invalid_request", f"query parameter {repeated} is given more than once"
            )
            await response(scope, receive, send_with_id)
            return
        try:
            await self.app(scope, receive, send_with_id)
        except Exception as error:
            logger.error(
                "unhandled error", exc_info=error, extra={"request_id": request_id, "path": scope["path"]}
            )
            if started:
                raise
            response = error_response(
                500, "internal", f"internal error; the server log has request id {request_id}"
            )
            await response(scope, receive, send_with_id)


#: what every HTML page says to the browser: never inside another site's frame (clickjacking a
#: cancel button), and no script but the server's own files (an injected ``<script>`` or ``onclick``
#: does not run). Inline ``style`` attributes stay allowed: the job timeline sizes its bars with
#: them, and a style cannot run code.
PAGE_HEADERS = (
    (b"x-frame-options", b"DENY"),
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:;"
        b" object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
)


class PageHeadersMiddleware:
    """``PAGE_HEADERS`` on every ``text/html`` response, whoever made it (a dashboard page, its
    404 page, the token form of ``server.auth``), so no page can be served without them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if any(name == b"content-type" and value.startswith(b"text/html") for name, value in headers):
                    message["headers"] = [*headers, *PAGE_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)
