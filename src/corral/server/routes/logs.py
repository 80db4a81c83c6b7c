"""Job logs: the worker appends each attempt's output, anyone reads or follows it.

``POST /jobs/{id}/logs?worker_id=&attempt=&offset=B`` is a worker report, fenced like the others
(409 ``stale_attempt``); a chunk at an offset already stored is accepted once (``store.logs``).
``GET /jobs/{id}/logs`` answers ``text/plain`` bytes of one attempt (the latest by default) from
``offset``; with ``follow=1`` it streams new bytes as they are stored, from the store (so through any
replica), until the attempt ends, the job is removed, or the caller's token is revoked; the follows
of one job share one poll of the store (``server.log_watch``), which a chunk stored through this
server nudges to poll at once. Headers say which attempt
(``X-Corral-Attempt``), the offset of the first byte sent (``X-Corral-Log-Start``), where the stored
stream ended when the answer was made (``X-Corral-Log-Size``) and how many of its first bytes were
dropped (``X-Corral-Log-Dropped``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from corral.domain import errors
from corral.domain.records import Job
from corral.domain.status import LEASED, TERMINAL
from corral.protocol.answers import LogAppendedAnswer
from corral.server import changes
from corral.server.auth import still_authorized
from corral.server.executor import Work
from corral.server.http import fence, json_response, query_int, read_body
from corral.server.openapi import BYTES, FENCE, TEXT, Operation, integer, string
from corral.server.state import ServerState, state_of
from corral.store.base import LogSlice

logger = logging.getLogger("corral.server.logs")

#: the largest chunk a worker may send in one request
CHUNK_MAX_BYTES = 4 * 1024 * 1024
#: how often a follow looks for new bytes in the store
FOLLOW_POLL_S = 0.25
#: bytes read from the store at once while following
FOLLOW_READ_BYTES = 1024 * 1024
#: a plain read answers at most this much (the cap per attempt is normally well under it)
READ_MAX_BYTES = 256 * 1024 * 1024
MEDIA_TYPE = "text/plain; charset=utf-8"


async def append(request: Request) -> Response:
    state = state_of(request)
    worker_id, attempt = fence(request)
    offset = _non_negative(request, "offset", required=True)
    data = await read_body(request, CHUNK_MAX_BYTES)
    appended = await state.executor.run(
        Work.SHORT,
        changes.append_log,
        state.store.logs,
        request.path_params["job_id"],
        worker_id,
        attempt,
        offset,
        data,
        state.clock.now(),
        state.settings.log_max_bytes,
    )
    if appended.trimmed:
        state.metrics.log_bytes_dropped.inc(appended.trimmed)
    state.metrics.log_bytes_stored.inc(appended.accepted)
    if appended.accepted:
        state.log_watches.nudge(appended.job_id)
    return json_response(
        {
            "job_id": appended.job_id,
            "attempt": appended.attempt,
            "size": appended.size,
            "accepted": appended.accepted,
            "dropped": appended.dropped,
        }
    )


def _non_negative(request: Request, name: str, required: bool = False) -> int:
    value = query_int(request, name, required=required, default=0)
    assert value is not None
    if value < 0:
        raise errors.InvalidRequest(f"query parameter {name} must be >= 0", field=name)
    return value


def _headers(piece: LogSlice) -> dict[str, str]:
    return {
        "X-Corral-Attempt": str(piece.attempt),
        "X-Corral-Log-Start": str(piece.start),
        "X-Corral-Log-Size": str(piece.size),
        "X-Corral-Log-Dropped": str(piece.dropped),
        "Cache-Control": "no-store",
    }


async def read(request: Request) -> Response:
    state = state_of(request)
    job_id = request.path_params["job_id"]
    attempt = query_int(request, "attempt", required=False)
    if attempt is not None and attempt < 0:
        raise errors.InvalidRequest("query parameter attempt must be >= 0", field="attempt")
    offset = _non_negative(request, "offset")
    follow = request.query_params.get("follow", "0").lower() in ("1", "true")
    if not follow:
        piece = await state.executor.run(
            Work.STORE, state.store.logs.read_log, job_id, attempt, offset, READ_MAX_BYTES
        )
        return Response(piece.data, media_type=MEDIA_TYPE, headers=_headers(piece))
    piece = await read_log(state, job_id, attempt, offset, FOLLOW_READ_BYTES)  # 404 first
    return StreamingResponse(
        _follow(state, job_id, attempt, piece, still_authorized(request)),
        media_type=MEDIA_TYPE,
        headers=_headers(piece),
    )


async def read_log(state: ServerState, job_id: str, attempt: int | None, offset: int, limit: int) -> LogSlice:
    return await state.executor.run(Work.STORE, state.store.logs.read_log, job_id, attempt, offset, limit)


def attempt_ended(job: Job, attempt: int) -> bool:
    """The attempt will write nothing more: the job moved on to another attempt, or is no longer
    running (its last chunk is stored before its final report)."""
    return job.attempts != attempt or job.status not in LEASED


def _not_started(job: Job) -> bool:
    return job.attempts == 0 and job.status not in TERMINAL


async def _follow(
    state: ServerState, job_id: str, attempt: int | None, piece: LogSlice, authorized: Callable[[], bool]
) -> AsyncIterator[bytes]:
    """Stream the attempt's bytes as they are stored; end when the attempt has ended and every byte
    stored before its end was sent, when the job is gone (retention), or when the caller's token no
    longer stands for it. A follow of the latest attempt of a job that has not started yet waits
    for its first attempt. Between its reads it waits on the job's shared watch
    (``log_watch``), which wakes it only when there is something for it."""
    watch = state.log_watches.subscribe(job_id)
    waiting = attempt is None and _not_started(piece.job)
    which = piece.attempt
    try:
        while True:
            if piece.data:
                yield piece.data
            offset = piece.start + len(piece.data)
            if offset < piece.size:  # more is stored already
                piece = await read_log(state, job_id, which, offset, FOLLOW_READ_BYTES)
                continue
            if not waiting and attempt_ended(piece.job, which):
                # The job was read before the bytes: what the attempt stored before it ended is in.
                return
            while not _news(watch.latest, waiting, which, offset):
                if watch.gone:
                    return
                await watch.changed_after(watch.version)
                if not authorized():
                    return
            chunk = watch.chunk
            if waiting:
                piece = await read_log(state, job_id, None, 0, FOLLOW_READ_BYTES)
                waiting = _not_started(piece.job)
                which = piece.attempt
            elif chunk is not None and (chunk.attempt, chunk.start) == (which, offset):
                piece = chunk
            else:
                piece = await read_log(state, job_id, which, offset, FOLLOW_READ_BYTES)
    except errors.NotFound:
        return  # removed meanwhile (retention): nothing more will come
    finally:
        state.log_watches.unsubscribe(watch)


def _news(latest: LogSlice | None, waiting: bool, which: int, offset: int) -> bool:
    """Whether the watch's last poll has something for a follow of attempt ``which`` that sent
    up to ``offset`` (or that waits for the job's first attempt)."""
    if latest is None:
        return False
    if waiting:
        return not _not_started(latest.job)
    return attempt_ended(latest.job, which) or (latest.attempt == which and latest.size > offset)


described = [
    Operation(
        "POST",
        "/jobs/{job_id}/logs",
        "append output of the current attempt at a byte offset (a retried chunk is stored once)",
        "job protocol",
        {200: LogAppendedAnswer},
        body=BYTES,
        body_required=False,
        query=(*FENCE, integer("offset", "the byte of the attempt's stream the chunk starts at", True, 0)),
        errors=(400, 404, 409, 413),
    ),
    Operation(
        "GET",
        "/jobs/{job_id}/logs",
        "the output of an attempt (stdout and stderr as written); follow streams until it ends",
        "jobs",
        {200: TEXT},
        query=(
            integer("attempt", "which attempt (default: the latest)", minimum=0),
            integer("offset", "the first byte to send", minimum=0),
            string(
                "follow",
                "1: keep sending new output until the attempt ends",
                enum=["0", "1", "true", "false"],
            ),
        ),
        errors=(400, 404),
    ),
]

routes = [
    Route("/jobs/{job_id}/logs", append, methods=["POST"]),
    Route("/jobs/{job_id}/logs", read, methods=["GET"]),
]
