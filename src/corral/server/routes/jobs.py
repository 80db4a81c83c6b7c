"""Users' routes: submit (single, gang, batch), list, get, events, why, cancel, gangs."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from corral.core import fairshare, lifecycle, pool_limits, walltime
from corral.core.explain import explain, preemptors_cut
from corral.core.schedulable import Verdicts, needs_workers
from corral.domain import errors
from corral.domain import pools as pool_rules
from corral.domain.pools import Pool, PoolDefaults
from corral.domain.records import Hold, Job, JobSpec, Reason
from corral.domain.status import Status
from corral.protocol.answers import (
    ArraySubmitted,
    BatchSubmitted,
    EventsAnswer,
    GangAnswer,
    GangSubmitted,
    JobAnswer,
    JobPage,
    WhyAnswer,
)
from corral.protocol.models import BatchBody, SubmitBody
from corral.protocol.wire import WAITING, event_to_wire, gang_status, job_to_wire
from corral.server import changes
from corral.server.auth import Principal, principal_of, redact_job
from corral.server.executor import Work
from corral.server.http import (
    answer,
    decode_body,
    idempotency_key,
    json_response,
    query_int,
    read_body,
    require_json,
)
from corral.server.openapi import Operation, integer, string
from corral.server.routes.pools import fair_share_now
from corral.server.state import ServerState, kept_verdicts, state_of
from corral.store.base import JobFilter, SubmitResult, Submitted
from corral.store.ports import Store

logger = logging.getLogger("corral.server.jobs")

DEFAULT_LIMIT = 500
#: a list longer than this is streamed in pieces of this many jobs
STREAM_CHUNK = 500
MAX_LIMIT = 5000
BATCH_BODY_LIMIT = 64 * 1024 * 1024


def _submitted_to_wire(item: Submitted) -> dict[str, Any]:
    if item.job is not None:
        # The submitter's own job (a replayed key answers with what that key created: the
        # fingerprint covers the body, and the user is fixed by the token).
        return job_to_wire(item.job)
    if item.array_id is not None:
        return {"array_id": item.array_id, "tasks": [task.id for task in item.tasks]}
    return {"gang_id": item.gang_id, "tasks": [task.id for task in item.tasks]}


def _fingerprint(request: Request, body: bytes) -> str:
    return hashlib.sha256(request.url.path.encode() + b"\0" + body).hexdigest()


@dataclass(frozen=True)
class SubmitRequest:
    """A submit as the route read it: what deciding and storing it needs beside the store, the
    pools and the workers (it travels to the writer process: ``submit_batch_in_process``)."""

    body: bytes
    batch: bool
    now: float
    key: str | None
    fingerprint: str
    #: with auth on, the token's name: the jobs' user whatever the body says
    owner: str | None
    pool_defaults: PoolDefaults
    topology_levels: tuple[str, ...]


@dataclass(frozen=True)
class StoredSubmit:
    """What the server notes of a stored submit (its metrics, its wake-ups, its log line)."""

    tasks: int
    gang_waiting: bool
    dependent_waiting: bool
    replayed: bool
    items: int

    @classmethod
    def of(cls, specs: Sequence[JobSpec], result: SubmitResult) -> StoredSubmit:
        return cls(
            tasks=sum(len(spec.array.indices) if spec.array else spec.gang_size for spec in specs),
            gang_waiting=any(spec.gang_size > 1 for spec in specs),
            dependent_waiting=any(spec.after for spec in specs),
            replayed=result.replayed,
            items=len(result.items),
        )


async def _read_submit(request: Request, batch: bool) -> tuple[ServerState, SubmitRequest]:
    state = state_of(request)
    limit = BATCH_BODY_LIMIT if batch else 1024 * 1024
    body = await read_body(request, limit)
    require_json(request, body)
    key = idempotency_key(request)
    principal = principal_of(request)
    return state, SubmitRequest(
        body=body,
        batch=batch,
        now=state.clock.now(),
        key=key,
        fingerprint=_fingerprint(request, body) if key else "",
        owner=principal.name if principal is not None else None,
        pool_defaults=state.pool_defaults,
        topology_levels=state.topology_levels,
    )


def _noted(state: ServerState, stored: StoredSubmit) -> None:
    """A new submit's metrics and wake-ups (a replayed one changed nothing)."""
    if not stored.replayed:
        state.metrics.jobs_submitted.inc(stored.tasks)
        state.released(gang_waiting=stored.gang_waiting, dependent_waiting=stored.dependent_waiting)


def store_submission(
    store: Store, pools: Mapping[str, Pool], verdicts: Verdicts, request: SubmitRequest
) -> tuple[list[JobSpec], SubmitResult]:
    """Decode, check and store a submit (a store thread, or the writer process for a batch: a batch
    of 10,000 jobs takes a while). ``pools``: as resolved; ``verdicts``: the workers' (work none
    could ever hold says so from its submit on)."""
    if request.batch:
        specs = [item.to_domain() for item in decode_body(request.body, BatchBody).jobs]
    else:
        specs = [decode_body(request.body, SubmitBody).to_domain()]
    if request.owner is not None:
        specs = [dataclasses.replace(spec, user=request.owner) for spec in specs]
    specs = walltime.limited_all(specs, pools, request.pool_defaults, request.batch)
    _check_topology(request.topology_levels, specs)
    _check_dependencies(store, specs)
    # An Idempotency-Key is its submitter's own (the token's name; everyone's alike without auth)
    key_owner = request.owner or ""
    return specs, store.jobs.submit(
        lifecycle.submitted(specs, request.now, verdicts),
        request.now,
        request.key,
        request.fingerprint,
        key_owner,
    )


def submit_batch_in_process(
    store: Store, memory: dict[str, Any], request: SubmitRequest, workers_generation: int
) -> tuple[bytes, StoredSubmit]:
    """A batch submit stored and its answer encoded, by the writer process (``executor.Work.WRITE``;
    a store thread without one): the decoding, the checks, the rows and the answer's JSON are the
    batch's Python, ~10 ms of CPU per 100 jobs, kept off the server's event loop.

    The pools are read as they stand (a handful of rows); the workers' verdicts are kept in
    ``memory`` as the server keeps its own (``state.kept_verdicts``, at the server's
    ``workers_generation``)."""
    resolved = pool_rules.resolve(store.pools.pools(), request.pool_defaults)
    specs, result = store_submission(
        store, resolved, kept_verdicts(store, memory, workers_generation), request
    )
    body = orjson.dumps({"items": [_submitted_to_wire(item) for item in result.items]})
    return body, StoredSubmit.of(specs, result)


def warm_writer(store: Store, memory: dict[str, Any]) -> None:
    """What the writer process's first batch would pay on its own, paid when the server starts it
    (``executor.StoreExecutor.start_writer``): this module's imports, a body's first decoding, the
    pools' and workers' first reads (~0.4 s: a first batch of 1,000 jobs took 0.57 s, the next
    0.11-0.14 s). Nothing is written."""
    decode_body(b'{"jobs": [{"command": "true"}]}', BatchBody).jobs[0].to_domain()
    store.pools.pools()
    kept_verdicts(store, memory, -1)  # a real batch's generation is never -1: it reads them again


def _check_topology(levels: tuple[str, ...], specs: list[JobSpec]) -> None:
    """400 when a ``topology`` names a level ``CORRAL_TOPOLOGY_LEVELS`` does not list."""
    for spec in specs:
        if spec.topology is not None and spec.topology.level not in levels:
            known = ", ".join(levels) or "none"
            raise errors.InvalidRequest(
                f"topology names unknown level {spec.topology.level!r} (this server's levels: {known})",
                field="topology",
            )


def _check_dependencies(store: Store, specs: list[JobSpec]) -> None:
    """400 when an ``after`` condition names no job, gang or array the store knows."""
    named = {item.id for spec in specs for item in spec.after}
    if not named:
        return
    unknown = sorted(named - set(store.jobs.task_statuses(sorted(named))))
    if unknown:
        names = ", ".join(unknown)
        raise errors.InvalidRequest(f"after names no known job, gang or array: {names}", field="after")


async def submit(request: Request) -> Response:
    state, submit_request = await _read_submit(request, batch=False)
    specs, result = await state.executor.run(
        Work.STORE,
        lambda: store_submission(
            state.store, state.resolved_pools(), state.standing_verdicts(), submit_request
        ),
    )
    _noted(state, StoredSubmit.of(specs, result))
    item = result.items[0]
    if not result.replayed:
        if item.job is not None:
            logger.info("job submitted", extra={"job_id": item.job.id})
        elif item.array_id is not None:
            logger.info("array submitted", extra={"array_id": item.array_id, "array_size": len(item.tasks)})
        else:
            logger.info("gang submitted", extra={"gang_id": item.gang_id, "gang_size": len(item.tasks)})
    model = JobAnswer if item.job is not None else ArraySubmitted if item.array_id else GangSubmitted
    return answer(model, _submitted_to_wire(item), 201)


async def submit_batch(request: Request) -> Response:
    """``POST /jobs/batch``: stored and encoded by the writer process where the server runs one
    (``submit_batch_in_process``), so that a batch of 10,000 jobs does not keep the interpreter
    from the heartbeats this replica answers meanwhile."""
    state, submit_request = await _read_submit(request, batch=True)
    body, stored = await state.executor.run(
        Work.WRITE, submit_batch_in_process, submit_request, state.workers_generation
    )
    _noted(state, stored)
    if not stored.replayed:
        # One line per request: a 10,000-job batch must not write 10,000 log lines.
        logger.info("batch submitted", extra={"items": stored.items, "tasks": stored.tasks})
    return Response(body, status_code=201, media_type="application/json")


def _encode_cursor(job: Job) -> str:
    return _encode_position(job.submitted_at, job.id)


def _encode_position(submitted_at: float, job_id: str) -> str:
    return base64.urlsafe_b64encode(f"{submitted_at!r}|{job_id}".encode()).decode()


def _decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        submitted, job_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|", 1)
        return float(submitted), job_id
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise errors.InvalidRequest(f"invalid cursor {cursor!r}", field="after") from None


async def list_jobs(request: Request) -> Response:
    state = state_of(request)
    params = request.query_params
    limit = query_int(request, "limit", required=False, default=DEFAULT_LIMIT)
    assert limit is not None
    if not 1 <= limit <= MAX_LIMIT:
        raise errors.InvalidRequest(f"limit must be between 1 and {MAX_LIMIT}", field="limit")
    statuses = tuple(part for value in params.getlist("status") for part in value.split(",") if part)
    for status in statuses:
        if status not in Status.__members__.values():
            raise errors.InvalidRequest(f"unknown status {status!r}", field="status")
    order = params.get("order") or "oldest"
    if order not in ("oldest", "newest"):
        raise errors.InvalidRequest(f"order must be oldest or newest, not {order!r}", field="order")
    filters = JobFilter(
        status=statuses,
        gang_id=params.get("gang_id") or None,
        pool=params.get("pool") or None,
        worker_id=params.get("worker_id") or None,
        user=params.get("user") or None,
        newest=order == "newest",
        array_id=params.get("array_id") or None,
    )
    after = _decode_cursor(params["after"]) if params.get("after") else None
    principal = principal_of(request)
    if limit <= STREAM_CHUNK:
        return await state.executor.run(Work.LONG, _job_page, state, filters, limit, after, principal)
    return StreamingResponse(
        _streamed_page(state, filters, limit, after, principal), media_type="application/json"
    )


def _job_page(
    state: ServerState,
    filters: JobFilter,
    limit: int,
    after: tuple[float, str] | None,
    principal: Principal | None,
) -> Response:
    """Read and encode a page (on a store thread)."""
    jobs = standing(state.store.jobs.list_jobs(filters, limit, after), state.standing_verdicts)
    next_cursor = _encode_cursor(jobs[-1]) if len(jobs) == limit else None
    # Not checked against JobPage item by item: 5,000 jobs would cost ~50 ms of validation; the
    # items are the same job_to_wire as every single-job answer, which is checked.
    holds = holds_for(state.store, jobs)
    items = [redact_job(job_to_wire(job, holds), principal) for job in jobs]
    return json_response({"items": items, "next": next_cursor})


def job_chunk(
    store: Store,
    memory: dict[str, Any],
    filters: JobFilter,
    limit: int,
    after: tuple[float, str] | None,
    principal: Principal | None,
) -> tuple[bytes, int, tuple[float, str] | None]:
    """Up to ``limit`` jobs after ``after``, encoded as JSON array items (no brackets), as the
    caller may see them; how many, and the last one's place in the order (by the reader process,
    or a store thread)."""
    jobs = standing(store.jobs.list_jobs(filters, limit, after), lambda: Verdicts(store.workers.workers()))
    holds = holds_for(store, jobs)
    encoded = b",".join(orjson.dumps(redact_job(job_to_wire(job, holds), principal)) for job in jobs)
    return encoded, len(jobs), (jobs[-1].submitted_at, jobs[-1].id) if jobs else None


async def _streamed_page(
    state: ServerState,
    filters: JobFilter,
    limit: int,
    after: tuple[float, str] | None,
    principal: Principal | None,
) -> AsyncIterator[bytes]:
    """A large page (up to 5,000 jobs, ~4 MB) as ``STREAM_CHUNK``-job pieces, each read and encoded
    by the reader process (``executor.Work.READ``; on a store thread without one): the same answer as
    ``_job_page``, but no single stretch of it keeps the store thread (and the interpreter's lock)
    for the ~150 ms the whole page takes, so heartbeats are served between the pieces. The pieces
    are read one after another by the cursor, as a client paging through would (a job submitted
    meanwhile may or may not appear)."""
    yield b'{"items":['
    sent = 0
    while sent < limit:
        want = min(STREAM_CHUNK, limit - sent)
        data, count, last = await state.executor.run(Work.READ, job_chunk, filters, want, after, principal)
        if count:
            yield (b"," if sent else b"") + data
            sent, after = sent + count, last
        if count < want:
            break
    next_cursor = _encode_position(*after) if sent == limit and after is not None else None
    yield b'],"next":' + orjson.dumps(next_cursor) + b"}"


def _job_or_404(state: ServerState, job_id: str) -> Job:
    job = state.store.jobs.get_job(job_id)
    if job is None:
        raise errors.NotFound(f"job {job_id} not found")
    return job


def standing(jobs: Sequence[Job], verdicts: Callable[[], Verdicts]) -> list[Job]:
    """``jobs`` with the reason each shows now (``schedulable.Verdicts``): a pending job's
    ``queued`` / ``unschedulable`` follows the workers registered since its submit. ``verdicts``
    (``ServerState.standing_verdicts``, or the store's own read in the reader process) is called
    only when one of ``jobs`` needs them."""
    if not any(needs_workers(job) for job in jobs):
        return list(jobs)
    known = verdicts()
    return [known.with_standing_reason(job) for job in jobs]


def holds_for(store: Store, jobs: Sequence[Job]) -> list[Hold]:
    """The holds table when any of ``jobs`` waits (its reservation is shown), else nothing."""
    return store.gangs.list_holds() if any(job.status in WAITING for job in jobs) else []


def _job_wire(request: Request, job: Job, holds: Sequence[Hold] = ()) -> dict[str, Any]:
    """A job as the caller may see it (env values only for its owner and admins when auth is on)."""
    return redact_job(job_to_wire(job, holds), principal_of(request))


def _job_with_holds(state: ServerState, job_id: str) -> tuple[Job, list[Hold]]:
    (job,) = standing([_job_or_404(state, job_id)], state.standing_verdicts)
    return job, holds_for(state.store, [job])


async def get_job(request: Request) -> Response:
    state = state_of(request)
    job, holds = await state.executor.run(Work.SHORT, _job_with_holds, state, request.path_params["job_id"])
    return answer(JobAnswer, _job_wire(request, job, holds))


async def job_events(request: Request) -> Response:
    state = state_of(request)
    return await state.executor.run(Work.LONG, _events, state, request.path_params["job_id"])


def _events(state: ServerState, job_id: str) -> Response:
    _job_or_404(state, job_id)
    return answer(
        EventsAnswer, {"items": [event_to_wire(event) for event in state.store.jobs.job_events(job_id)]}
    )


async def why(request: Request) -> Response:
    state = state_of(request)
    return await state.executor.run(Work.LONG, _why, state, request.path_params["job_id"])


def _why(state: ServerState, job_id: str) -> Response:
    """Explained on a store thread: a pending job reads every worker and allocation."""
    job = _job_or_404(state, job_id)
    reasons = _reasons(state, job)
    return answer(
        WhyAnswer, {"status": job.status.value, "reasons": [reason.to_dict() for reason in reasons]}
    )


def _reasons(state: ServerState, job: Job) -> list[Reason]:
    workers, allocations, holds = [], [], []
    if job.status == Status.PENDING:
        workers = state.store.workers.workers()
        allocations = state.store.workers.allocations()
        holds = state.store.gangs.list_holds()
    fair_share = None
    if job.status in (Status.PENDING, Status.BLOCKED):
        fair_share = fairshare.explain(job.spec.pool, fair_share_now(state), state.clock.now())
    cut = None
    if job.status == Status.PENDING and job.gang_id is None and not job.awaiting_dependencies:
        cut = preemptors_cut(state.store.gangs.preemptors_ahead(job))
    now = state.clock.now()
    return explain(job, workers, allocations, holds, now, fair_share, _pool_limit(state, job), cut)


def _pool_limit(state: ServerState, job: Job) -> Reason | None:
    """``pool_limit`` when the limits of the job's pool, or of an ancestor, keep it waiting."""
    if job.status not in (Status.PENDING, Status.BLOCKED):
        return None
    pools = state.resolved_pools()
    if not pool_limits.limits_of(pools):
        return None
    own = {path: usage.held for path, usage in state.store.pools.pool_usage().items()}
    return pool_limits.explain(job, job.spec.gang_size, pools, own)


def _record_cancel(state: ServerState, changed: tuple[Job, ...]) -> None:
    for job in changed:
        if job.status == Status.CANCELLED:
            state.metrics.jobs_cancelled.inc()
            logger.info("job cancelled", extra={"job_id": job.id, "gang_id": job.gang_id})
        elif job.status == Status.PREEMPTING:
            state.metrics.preemptions.labels(reason="cancel", pool=job.spec.pool).inc()
            logger.info(
                "job stopping for cancel",
                extra={
                    "job_id": job.id,
                    "worker_id": job.worker_id,
                    "preemption_epoch": job.preemption_epoch,
                },
            )
    state.released()


async def cancel_job(request: Request) -> Response:
    state = state_of(request)
    job_id = request.path_params["job_id"]
    changed, current = await state.executor.run(Work.STORE, _cancel, state, job_id, state.clock.now())
    _record_cancel(state, changed)
    return answer(JobAnswer, _job_wire(request, current))


def _cancel(state: ServerState, job_id: str, now: float) -> tuple[tuple[Job, ...], Job]:
    changed = changes.cancel(state.store.jobs, job_id, now)
    current = state.store.jobs.get_job(job_id)
    assert current is not None
    return changed, current


def _gang_or_404(state: ServerState, gang_id: str) -> list[Job]:
    tasks = state.store.jobs.gang_tasks(gang_id)
    if not tasks:
        raise errors.NotFound(f"gang {gang_id} not found")
    return tasks


def _gang_to_wire(
    request: Request, gang_id: str, tasks: list[Job], holds: Sequence[Hold] = ()
) -> dict[str, Any]:
    return {
        "gang_id": gang_id,
        "size": len(tasks),
        "status": gang_status(tasks),
        "tasks": [_job_wire(request, task, holds) for task in tasks],
    }


async def get_gang(request: Request) -> Response:
    state = state_of(request)
    gang_id = request.path_params["gang_id"]
    tasks, holds = await state.executor.run(Work.STORE, _gang_with_holds, state, gang_id)
    return answer(GangAnswer, _gang_to_wire(request, gang_id, tasks, holds))


def _gang_with_holds(state: ServerState, gang_id: str) -> tuple[list[Job], list[Hold]]:
    tasks = _gang_or_404(state, gang_id)
    return tasks, holds_for(state.store, tasks)


async def cancel_gang(request: Request) -> Response:
    state = state_of(request)
    gang_id = request.path_params["gang_id"]
    changed, tasks = await state.executor.run(Work.STORE, _cancel_gang, state, gang_id, state.clock.now())
    _record_cancel(state, changed)
    return answer(GangAnswer, _gang_to_wire(request, gang_id, tasks))


def _cancel_gang(state: ServerState, gang_id: str, now: float) -> tuple[tuple[Job, ...], list[Job]]:
    tasks = _gang_or_404(state, gang_id)
    changed = changes.cancel(state.store.jobs, tasks[0].id, now)
    return changed, state.store.jobs.gang_tasks(gang_id)


async def gang_events(request: Request) -> Response:
    state = state_of(request)
    return await state.executor.run(Work.LONG, _gang_events, state, request.path_params["gang_id"])


def _gang_events(state: ServerState, gang_id: str) -> Response:
    """Every task's events in one story, in time order, each naming its task (``job_id``,
    ``gang_index``): what ``corral events G`` prints. Events at the same time (a gang's tasks move
    together) go by their place in each task's story, then by rank: every task's ``blocked``
    before any task's ``cancelled``."""
    tasks = _gang_or_404(state, gang_id)
    return answer(EventsAnswer, {"items": tasks_story(state, tasks, "gang_index")})


def tasks_story(state: ServerState, tasks: Sequence[Job], place: str) -> list[dict[str, Any]]:
    """The events of ``tasks`` (a gang's or an array's) as one story in time order, each naming its
    task (``job_id`` and ``place``: ``gang_index`` or ``array_index``); events at the same time go
    by their place in each task's story, then by the task's index."""
    told: list[tuple[float, int, int, dict[str, Any]]] = []
    for task in tasks:
        index = getattr(task, place)
        for seq, event in enumerate(state.store.jobs.job_events(task.id)):
            wire = {**event_to_wire(event), "job_id": task.id, place: index}
            told.append((event.at, seq, index or 0, wire))
    told.sort(key=lambda item: item[:3])
    return [wire for *_, wire in told]


async def gang_why(request: Request) -> Response:
    state = state_of(request)
    return await state.executor.run(Work.LONG, _gang_why, state, request.path_params["gang_id"])


def _gang_why(state: ServerState, gang_id: str) -> Response:
    """The gang's status and the reasons of the task that tells its story best: the first failed
    one (its failure ended the gang), else the first that has not ended, else the first. Every
    waiting task of a gang waits for the same thing (the gang's admission), so one is enough."""
    tasks = _gang_or_404(state, gang_id)
    failed = [task for task in tasks if task.status == Status.FAILED]
    waiting = [task for task in tasks if not task.status.is_terminal]
    told = (failed or waiting or tasks)[0]
    reasons = _reasons(state, told)
    return answer(
        WhyAnswer,
        {
            "status": gang_status(tasks),
            "reasons": [reason.to_dict() for reason in reasons],
            "gang_id": gang_id,
            "job_id": told.id,
        },
    )


async def batch_is_post_only(request: Request) -> Response:
    raise HTTPException(405, headers={"Allow": "POST"})


_JOB = "the job"
described = [
    Operation(
        "POST",
        "/jobs",
        "submit a job, a gang when gang_size > 1, or an array with array",
        "jobs",
        {201: (JobAnswer, GangSubmitted, ArraySubmitted)},
        body=SubmitBody,
        headers=(
            string(
                "Idempotency-Key",
                "a retried submit returns the first answer (each user has keys of their own)",
            ),
        ),
        errors=(400, 409, 413),
        description="A job answers the job; a gang or an array answers its id and task ids.",
    ),
    Operation(
        "POST",
        "/jobs/batch",
        "submit many jobs and gangs in one transaction, or none",
        "jobs",
        {201: BatchSubmitted},
        body=BatchBody,
        headers=(
            string(
                "Idempotency-Key",
                "a retried submit returns the first answer (each user has keys of their own)",
            ),
        ),
        errors=(400, 409, 413),
    ),
    Operation("GET", "/jobs/batch", "not allowed: submit with POST", "jobs", {}, errors=(405,)),
    Operation(
        "GET",
        "/jobs",
        "list jobs by submission time (oldest first, or newest with order=newest), with filters and a cursor",
        "jobs",
        {200: JobPage},
        query=(
            integer("limit", f"page size, 1..{MAX_LIMIT} (default {DEFAULT_LIMIT})", minimum=1),
            string("after", "the cursor of the previous page's next"),
            string("status", "comma-separated statuses"),
            string("gang_id"),
            string("pool"),
            string("worker_id"),
            string("user", "jobs of this submitter"),
            string(
                "order", "oldest (default) or newest: by submission time, then id", enum=["oldest", "newest"]
            ),
            string("array_id"),
        ),
    ),
    Operation("GET", "/jobs/{job_id}", _JOB, "jobs", {200: JobAnswer}, errors=(404,)),
    Operation(
        "GET",
        "/jobs/{job_id}/events",
        "the job's status history, oldest first",
        "jobs",
        {200: EventsAnswer},
        errors=(404,),
    ),
    Operation(
        "GET", "/jobs/{job_id}/why", "why the job is where it is", "jobs", {200: WhyAnswer}, errors=(404,)
    ),
    Operation(
        "POST",
        "/jobs/{job_id}/cancel",
        "cancel the job (its whole gang for a gang task)",
        "jobs",
        {200: JobAnswer},
        errors=(404, 409),
    ),
    Operation("GET", "/gangs/{gang_id}", "the gang and its tasks", "gangs", {200: GangAnswer}, errors=(404,)),
    Operation(
        "GET",
        "/gangs/{gang_id}/events",
        "every task's status history in one story, oldest first (each item names its job_id)",
        "gangs",
        {200: EventsAnswer},
        errors=(404,),
    ),
    Operation(
        "GET",
        "/gangs/{gang_id}/why",
        "why the gang is where it is (the reasons of its most telling task, named by job_id)",
        "gangs",
        {200: WhyAnswer},
        errors=(404,),
    ),
    Operation(
        "POST",
        "/gangs/{gang_id}/cancel",
        "cancel every task of the gang",
        "gangs",
        {200: GangAnswer},
        errors=(404, 409),
    ),
]

routes = [
    Route("/jobs", submit, methods=["POST"]),
    Route("/jobs/batch", batch_is_post_only, methods=["GET"]),
    Route("/jobs", list_jobs, methods=["GET"]),
    Route("/jobs/batch", submit_batch, methods=["POST"]),
    Route("/jobs/{job_id}", get_job, methods=["GET"]),
    Route("/jobs/{job_id}/events", job_events, methods=["GET"]),
    Route("/jobs/{job_id}/why", why, methods=["GET"]),
    Route("/jobs/{job_id}/cancel", cancel_job, methods=["POST"]),
    Route("/gangs/{gang_id}", get_gang, methods=["GET"]),
    Route("/gangs/{gang_id}/events", gang_events, methods=["GET"]),
    Route("/gangs/{gang_id}/why", gang_why, methods=["GET"]),
    Route("/gangs/{gang_id}/cancel", cancel_gang, methods=["POST"]),
]
