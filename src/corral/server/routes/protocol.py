"""The job protocol spoken by workers: claim (long-poll), heartbeat, done, fail, preempted.

Its answers (``ClaimAnswer``, ``HeartbeatAnswer``, ``JobAnswer``, ``CheckpointSaved`` of
``corral.protocol.answers``) are not checked against their models here: their one consumer,
corral's worker, parses each with those models (``corral.client``: a broken answer is refused as
``bad_response``), and checking them twice cost ~5% of a job's server CPU on the hot path
(``bench/protocol.py``). Every other route's answer is checked by the server (``http.answer``).

Every report but the claim is fenced by ``worker_id`` and ``attempt``: the store's compare-and-set
refuses a report from a worker or attempt that is no longer the job's (409 ``stale_attempt``), and
the worker stops that job.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from corral.core.lifecycle import HeartbeatAction
from corral.domain import errors
from corral.domain.records import Hold, Job
from corral.domain.status import Status
from corral.protocol.answers import (
    CheckpointSaved,
    ClaimAnswer,
    ClaimsAnswer,
    FinalReportsAnswer,
    HeartbeatAnswer,
    JobAnswer,
)
from corral.protocol.models import (
    MAX_FINAL_REPORTS,
    DoneReport,
    FailBody,
    FailReport,
    FinalReport,
    FinalReportsBody,
    JobHeartbeatBody,
    WatchdogBody,
    describe_error,
)
from corral.protocol.wire import job_to_wire
from corral.server import changes
from corral.server.executor import Work
from corral.server.grouped import Batch
from corral.server.http import (
    fence,
    idempotency_key,
    json_response,
    note_store_failure,
    parse_body,
    query_float,
    query_int,
    read_body,
)
from corral.server.loops.drain import record_reported
from corral.server.openapi import BYTES, FENCE, Operation, Param, integer, number, string
from corral.server.state import ServerState, state_of
from corral.store.base import ClaimAsk, JobDecision, JobReport

logger = logging.getLogger("corral.server.protocol")

MAX_WAIT_S = 30.0
#: the most jobs one claim (``max``) may start
MAX_CLAIMS = 64
#: the most claims one transaction starts together (``CLAIMS``): each may start ``max`` jobs
MAX_CLAIM_GROUP = 16
# A long-poll re-checks the store this often even without a local wake-up (work that arrived
# through another replica, or capacity freed by the reaper).
RECHECK_S = 1.0


CHECKPOINT_ENV_MAX_BYTES = 64 * 1024


def claim_env(state: ServerState, job: Job, server_url: str, tasks: list[Job] | None) -> dict[str, str]:
    """The environment a claimed job runs with: its own ``env`` plus corral's variables, the
    rendezvous of its gang (``tasks``: every task of it), and the resume flag when a checkpoint is
    stored: its own, or for a gang rank any rank's (the "rank 0 saves, every rank loads" pattern)."""
    env = {
        **job.spec.env,
        "CORRAL_JOB_ID": job.id,
        "CORRAL_ATTEMPT": str(job.attempts),
        "CORRAL_SERVER": server_url,
    }
    if job.array_id is not None:
        env["CORRAL_ARRAY_ID"] = job.array_id
        env["CORRAL_ARRAY_INDEX"] = str(job.array_index)
        env["CORRAL_ARRAY_SIZE"] = str(job.array_size)
    if tasks is not None:
        env.update(rendezvous_env(state, job, tasks))
    if job.has_checkpoint or any(task.has_checkpoint for task in tasks or ()):
        env["CORRAL_RESUME"] = "1"
    if job.has_checkpoint:
        data = state.store.jobs.get_checkpoint(job.id)
        if data is not None and len(data) <= CHECKPOINT_ENV_MAX_BYTES:
            env["CHECKPOINT_DATA"] = base64.b64encode(data).decode()
    return env


def gang_checkpoints(tasks: list[Job] | None) -> list[dict[str, Any]]:
    """The ranks of the gang that have a stored checkpoint, for the worker to fetch into
    ``CORRAL_GANG_CHECKPOINT_DIR`` as ``rank-<gang_index>``."""
    return [{"gang_index": task.gang_index, "job_id": task.id} for task in tasks or () if task.has_checkpoint]


def rendezvous_env(state: ServerState, job: Job, tasks: list[Job]) -> dict[str, str]:
    """What a torchrun-style program needs to find its peers: ranks, world size, and rank 0's
    address and port (the port chosen at reservation, stable for the attempt)."""
    workers = state.store.workers.workers_by_id([task.worker_id for task in tasks if task.worker_id])
    peers = [workers[task.worker_id].address if task.worker_id in workers else "" for task in tasks]
    same_worker = [task.id for task in tasks if task.worker_id == job.worker_id]
    return {
        "CORRAL_GANG_ID": job.gang_id or "",
        "GANG_ID": job.gang_id or "",
        "GANG_SIZE": str(len(tasks)),
        "GANG_INDEX": str(job.gang_index),
        "GANG_PEERS": ",".join(peers),
        "RANK": str(job.gang_index),
        "WORLD_SIZE": str(len(tasks)),
        "LOCAL_RANK": str(same_worker.index(job.id)),
        "MASTER_ADDR": peers[0] if peers else "",
        "MASTER_PORT": str(tasks[0].master_port or job.master_port or ""),
    }


def claim_limit(request: Request) -> int | None:
    """``max``: how many jobs one claim may start (None without it: the single claim)."""
    if request.query_params.get("max") is None:
        return None
    limit = query_int(request, "max")
    assert limit is not None
    if not 1 <= limit <= MAX_CLAIMS:
        raise errors.InvalidRequest(f"max must be an integer from 1 to {MAX_CLAIMS}", field="max")
    return limit


async def claim(request: Request) -> Response:
    """One job (``ClaimAnswer``), or with ``max=N`` up to N jobs started together in one store
    transaction (``ClaimsAnswer``: ``{"items": [...]}``, each item the single claim's answer)."""
    state = state_of(request)
    worker_id = request.query_params.get("worker_id")
    if not worker_id:
        raise errors.InvalidRequest("query parameter worker_id is required", field="worker_id")
    limit = claim_limit(request)
    key = idempotency_key(request)
    wait = query_float(request, "wait", 0.0)
    if wait > MAX_WAIT_S:
        raise errors.InvalidRequest(f"wait must be at most {MAX_WAIT_S:.0f} seconds", field="wait")
    deadline = time.monotonic() + wait
    server_url = str(request.base_url).rstrip("/")
    ask = ClaimRequest(worker_id, limit, key, server_url)
    while True:
        woken = state.signal.current()
        made = await state.executor.grouped(CLAIMS, ask)
        if made:
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return Response(status_code=204)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), min(remaining, RECHECK_S))
        if await request.is_disconnected():
            return Response(status_code=204)
    for job, _ in made:
        state.metrics.jobs_claimed.inc()
        if backfilled(job, state.reservations.get(worker_id, ())):
            state.metrics.backfill_started.inc()
        if job.started_at is not None and job.attempts == 1:
            # A retry's wait would count its earlier runs too: only first starts measure the queue.
            state.metrics.queue_wait.observe(max(0.0, job.started_at - job.submitted_at))
        logger.info("job claimed", extra={"job_id": job.id, "worker_id": worker_id, "attempt": job.attempts})
    if limit is None:
        return json_response(made[0][1])
    return json_response({"items": [body for _, body in made]})


def backfilled(job: Job, reservations: Sequence[Hold]) -> bool:
    """Whether ``job`` started beside a reservation of another gang or job on its worker, ending
    before that reservation starts (``backfill_started_total``)."""
    walltime = job.spec.walltime_s
    if walltime is None or job.started_at is None:
        return False
    own = (job.id, job.gang_id)
    deadline = job.started_at + walltime
    return any(
        hold.gang_id not in own and hold.expected_at is not None and deadline <= hold.expected_at
        for hold in reservations
    )


def claimed(
    state: ServerState, worker_id: str, server_url: str, key: str | None = None
) -> tuple[Job, dict[str, Any]] | None:
    """Claim, and build the answer: the job, its attempt, its environment and its gang's
    checkpoints (where the executor runs short work, in one crossing: the claim is a job's hottest
    path). The claim reads the clock inside its transaction (see ``store.base.Stamp``), not when
    the request came. ``key``: the claim's Idempotency-Key (a retry is answered the runs the first
    one started)."""
    job = changes.claim(state.store.claims, worker_id, state.clock.now, key, state.claim_policy())
    return None if job is None else (job, claim_body(state, job, server_url))


def claimed_many(
    state: ServerState, worker_id: str, server_url: str, limit: int, key: str | None = None
) -> list[tuple[Job, dict[str, Any]]]:
    """``claimed`` for up to ``limit`` jobs, started in one store transaction."""
    jobs = changes.claim_many(
        state.store.claims, worker_id, state.clock.now, limit, key, state.claim_policy()
    )
    return [(job, claim_body(state, job, server_url)) for job in jobs]


@dataclass(frozen=True)
class ClaimRequest:
    """A claim request, as the group commit of claims applies it."""

    worker_id: str
    #: ``max``; None: the single claim
    limit: int | None
    key: str | None
    server_url: str


#: a claim's answer: each job started, with its body
Claimed = list[tuple[Job, dict[str, Any]]]


def claimed_alone(state: ServerState, ask: ClaimRequest) -> Claimed:
    """One claim in its own transaction (a turn with one claim, or each claim of a failed group)."""
    if ask.limit is None:
        one = claimed(state, ask.worker_id, ask.server_url, ask.key)
        return [one] if one is not None else []
    return claimed_many(state, ask.worker_id, ask.server_url, ask.limit, ask.key)


def claimed_together(state: ServerState, asks: list[ClaimRequest]) -> list[Claimed | BaseException]:
    """The claims of one turn, started in one store transaction, then each one's bodies. A body
    that cannot be built (a store read failing after the commit) is that claim's error alone: the
    worker asks again with the same Idempotency-Key and is answered the runs it started."""
    started = changes.claim_group(
        state.store.claims,
        [ClaimAsk(ask.worker_id, ask.limit or 1, ask.key) for ask in asks],
        state.clock.now,
        state.claim_policy(),
    )
    answers: list[Claimed | BaseException] = []
    for ask, jobs in zip(asks, started, strict=True):
        try:
            answers.append([(job, claim_body(state, job, ask.server_url)) for job in jobs])
        except Exception as error:
            answers.append(error)
    return answers


#: the group commit of claims (``grouped``): the claims of one event-loop turn start their jobs in
#: one transaction (``Claims.claim_group``)
CLAIMS: Batch[ServerState, ClaimRequest, Claimed] = Batch(
    "claims", claimed_together, claimed_alone, MAX_CLAIM_GROUP
)

#: the most job reports one transaction applies: it should not hold the write lock long
MAX_REPORTS = 64


def _change_many(state: ServerState, group: list[tuple[str, JobDecision[Any]]]) -> list[Any]:
    return state.store.jobs.change_many(group)


def _change(state: ServerState, item: tuple[str, JobDecision[Any]]) -> Any:
    return state.store.jobs.change(*item)


#: the group commit of job reports (``done``, ``fail``): the reports of one event-loop turn, applied
#: by ``Jobs.change_many``, each in its own savepoint
REPORTS: Batch[ServerState, tuple[str, JobDecision[Any]], Any] = Batch(
    "reports", _change_many, _change, MAX_REPORTS
)


def claim_body(state: ServerState, job: Job, server_url: str) -> dict[str, Any]:
    """A claimed job's answer: the job, its attempt, its environment, its gang's checkpoints and
    the lease the worker must renew (its self-fence counts it down)."""
    tasks = state.store.jobs.gang_tasks(job.gang_id) if job.gang_id is not None else None
    body = job_to_wire(job)
    body["attempt"] = job.attempts
    body["env"] = claim_env(state, job, server_url, tasks)
    body["gang_checkpoints"] = gang_checkpoints(tasks)
    body["lease_s"] = state.settings.heartbeat_timeout_s
    return body


async def job_heartbeat(request: Request) -> Response:
    state = state_of(request)
    worker_id, attempt = fence(request)
    body = await parse_body(request, JobHeartbeatBody, optional=True)
    report = JobReport(
        progress=body.progress,
        gpu_util_pct=body.gpu_util_pct,
        rss_mb=body.rss_mb,
        checkpoint_at=body.checkpoint_at,
    )
    settings = state.settings
    action = await state.executor.run(
        Work.SHORT,
        changes.heartbeat,
        state.store.jobs,
        request.path_params["job_id"],
        worker_id,
        attempt,
        state.clock.now(),
        report,
        defer_s=body.defer_s,
        checkpoint_timeout_s=settings.checkpoint_timeout_s,
        max_deferral_s=settings.max_deferral_s,
    )
    return json_response(heartbeat_answer(state, action, worker_id))


def heartbeat_answer(state: ServerState, action: HeartbeatAction, worker_id: str) -> dict[str, object]:
    """A job heartbeat's answer (its own, or its part of its worker's), counted and logged."""
    if action.failed_checkpoint:
        state.metrics.preemption_failed_checkpoint.inc()
        logger.warning(
            "preemption checkpoint timed out",
            extra={"job_id": action.job.id, "preemption_epoch": action.epoch, "worker_id": worker_id},
        )
    if action.action is None:
        return {}
    answer: dict[str, object] = {"action": action.action, "preemption_epoch": action.epoch}
    if action.deadline_s is not None:
        answer["deadline_s"] = round(action.deadline_s, 3)
    return answer


async def done(request: Request) -> Response:
    state = state_of(request)
    worker_id, attempt = fence(request)
    return json_response(await report_done(state, request.path_params["job_id"], worker_id, attempt))


async def report_done(state: ServerState, job_id: str, worker_id: str, attempt: int) -> dict[str, Any]:
    """``done`` of one attempt, fenced by ``worker_id`` and ``attempt``: the job's answer, or the
    refusal raised. Its own route and each item of a batch (``final_reports``) make it."""
    # applied with the other reports of this event-loop turn, in one transaction (group commit)
    decide = changes.done_decision(worker_id, attempt, state.clock.now())
    reported = await state.executor.grouped(REPORTS, (job_id, decide))
    job = reported.job
    state.metrics.jobs_completed.inc()
    if job.started_at is not None and job.finished_at is not None:
        state.metrics.execution_duration.observe(max(0.0, job.finished_at - job.started_at))
    logger.info("job done", extra={"job_id": job.id, "worker_id": worker_id, "attempt": attempt})
    record_reported(state, reported)
    state.released()
    return job_to_wire(job)


async def fail(request: Request) -> Response:
    state = state_of(request)
    worker_id, attempt = fence(request)
    body = await parse_body(request, FailBody, optional=True)
    return json_response(await report_fail(state, request.path_params["job_id"], worker_id, attempt, body))


async def report_fail(
    state: ServerState, job_id: str, worker_id: str, attempt: int, body: FailBody
) -> dict[str, Any]:
    """``fail`` of one attempt (re-queued while attempts remain), fenced like ``report_done``."""
    decide = changes.failure_decision(
        worker_id,
        attempt,
        state.clock.now(),
        body.exit_code,
        body.error,
        body.output_tail,
        body.release,
        body.reason,
    )
    reported = await state.executor.grouped(REPORTS, (job_id, decide))
    _record_fail(state, reported.job, worker_id, attempt, body.exit_code)
    record_reported(state, reported)
    state.released()
    return job_to_wire(reported.job)


#: reads one item of a batch of final reports (``FinalReport``: done or fail, by ``outcome``)
_FINAL_REPORT: TypeAdapter[DoneReport | FailReport] = TypeAdapter(FinalReport)

#: a batch's body: 160 KiB a report, for 64 reports (a worker's tail is 4 KiB by default; a batch
#: over it is refused 413, and the worker then sends its reports by their own routes)
FINAL_REPORTS_BODY_LIMIT = MAX_FINAL_REPORTS * 160 * 1024


async def final_reports(request: Request) -> Response:
    """A worker's final reports (done, fail) of several attempts in one request, answered per item
    in order (``FinalReportsAnswer``), each as its own route would answer it: its status and the
    job, or its error. The items go through the single routes' ``report_done`` and ``report_fail``
    together, so they join one group commit (one transaction), every fence, refusal and idempotency
    rule holds per item, and one item's refusal (or malformed item) never fails the others."""
    state = state_of(request)
    worker_id = request.path_params["worker_id"]
    body = await parse_body(request, FinalReportsBody, limit=FINAL_REPORTS_BODY_LIMIT)
    outcomes = await asyncio.gather(
        *(_final_report(state, worker_id, item) for item in body.reports), return_exceptions=True
    )
    items: list[dict[str, Any]] = []
    for outcome in outcomes:
        if isinstance(outcome, errors.CorralError):
            if isinstance(outcome, errors.StoreUnavailable):
                note_store_failure(state, outcome)
            error = {"code": outcome.code, "message": outcome.message}
            items.append({"status": outcome.http_status, "error": error})
        elif isinstance(outcome, Exception):
            logger.error("a batched final report failed", exc_info=outcome, extra={"worker_id": worker_id})
            items.append({"status": 500, "error": {"code": "internal", "message": "internal error"}})
        elif isinstance(outcome, BaseException):  # cancelled with its request: not answered
            raise outcome
        else:
            items.append({"status": 200, "job": outcome})
    return json_response({"items": items})


async def _final_report(state: ServerState, worker_id: str, item: Any) -> dict[str, Any]:
    """One item of a batch: checked as its own route checks its fence and body, then reported."""
    try:
        report = _FINAL_REPORT.validate_python(item)
    except ValidationError as error:
        field, message = describe_error(error)
        raise errors.InvalidRequest(message, field=field) from None
    if isinstance(report, DoneReport):
        return await report_done(state, report.job_id, worker_id, report.attempt)
    # a fail report is the single route's body with its fence (``FailReport`` extends ``FailBody``)
    return await report_fail(state, report.job_id, worker_id, report.attempt, report)


def _record_fail(state: ServerState, job: Job, worker_id: str, attempt: int, exit_code: int | None) -> None:
    fields = {"job_id": job.id, "worker_id": worker_id, "attempt": attempt, "exit_code": exit_code}
    if job.status == Status.PENDING:
        state.metrics.jobs_retried.inc()
        logger.warning("job failed, re-queuing", extra=fields)
    elif job.status == Status.FAILED:
        state.metrics.jobs_failed.inc()
        logger.error("job failed permanently", extra=fields)
    elif job.status == Status.CANCELLED:
        state.metrics.jobs_cancelled.inc()
        logger.info("job cancelled", extra=fields)
    elif job.gang_id is None:
        logger.info("job preempted", extra={**fields, "preemption_epoch": job.preemption_epoch})


async def preempted(request: Request) -> Response:
    state = state_of(request)
    worker_id, attempt = fence(request)
    epoch = query_int(request, "epoch")
    assert epoch is not None
    reported = await state.executor.run(
        Work.SHORT,
        changes.acknowledge_stop,
        state.store.jobs,
        request.path_params["job_id"],
        worker_id,
        attempt,
        epoch,
        state.clock.now(),
    )
    job = reported.job
    if job.status == Status.CANCELLED:
        state.metrics.jobs_cancelled.inc()
        logger.info(
            "job cancelled", extra={"job_id": job.id, "worker_id": worker_id, "preemption_epoch": epoch}
        )
    record_reported(state, reported)
    state.released()
    return json_response(job_to_wire(job))


async def watchdog(request: Request) -> Response:
    """A worker's watchdog stopped the job: re-queue it at the front, or fail it past the cap."""
    state = state_of(request)
    worker_id, attempt = fence(request)
    body = await parse_body(request, WatchdogBody)
    detail = body.detail if isinstance(body.detail, str) else orjson.dumps(body.detail or {}).decode()
    reported = await state.executor.run(
        Work.SHORT,
        changes.report_trip,
        state.store.jobs,
        request.path_params["job_id"],
        worker_id,
        attempt,
        state.clock.now(),
        body.kind,
        detail[:4096],
        state.settings.watchdog_max_retries,
    )
    job = reported.job
    if reported.trip_outcome is not None:
        state.metrics.watchdog_trips.labels(kind=body.kind, outcome=reported.trip_outcome).inc()
    fields = {
        "job_id": job.id,
        "worker_id": worker_id,
        "attempt": attempt,
        "kind": body.kind,
        "outcome": reported.trip_outcome or ("draining" if reported.drain else job.status.value),
        "watchdog_retries": job.watchdog_retries,
        "detail": body.detail,
    }
    if job.status == Status.FAILED:
        logger.error("watchdog tripped, job failed", extra=fields)
    else:
        logger.warning("watchdog tripped", extra=fields)
    record_reported(state, reported)
    state.released()
    return json_response(job_to_wire(job))


async def upload_checkpoint(request: Request) -> Response:
    """Opaque bytes for the job's next attempt: with ``epoch``, from a stop the server asked for
    (current epoch only); without, from the current attempt whatever way it is ending, until its
    final report."""
    state = state_of(request)
    worker_id, attempt = fence(request)
    epoch = query_int(request, "epoch", required=False)
    data = await read_body(request, state.settings.checkpoint_max_bytes)
    if not data:
        raise errors.InvalidRequest("checkpoint body is empty", field="body")
    accepted = await state.executor.run(
        Work.STORE,
        changes.save_checkpoint,
        state.store.jobs,
        request.path_params["job_id"],
        worker_id,
        attempt,
        epoch,
        data,
        state.clock.now(),
    )
    job = accepted.job
    if accepted.phase_seconds is not None:
        state.metrics.preemption_checkpoint_duration.observe(accepted.phase_seconds)
    logger.info(
        "checkpoint saved",
        extra={
            "job_id": job.id,
            "gang_id": job.gang_id,
            "attempt": attempt,
            "preemption_epoch": epoch,
            "bytes": len(data),
        },
    )
    saved = {"job_id": job.id, "bytes": len(data), "preemption_epoch": epoch, "attempt": attempt}
    return json_response(saved)


async def download_checkpoint(request: Request) -> Response:
    state = state_of(request)
    data = await state.executor.run(
        Work.STORE, state.store.jobs.get_checkpoint, request.path_params["job_id"]
    )
    if data is None:
        return Response(status_code=204)
    return Response(data, media_type="application/octet-stream")


_PROTOCOL = "job protocol"
described = [
    Operation(
        "GET",
        "/jobs/next",
        "claim work for a registered worker (204: nothing; wait long-polls; max: several at once)",
        _PROTOCOL,
        {200: (ClaimAnswer, ClaimsAnswer), 204: None},
        query=(
            string("worker_id", "the claiming worker", required=True, minLength=1),
            number(
                "wait", f"seconds to wait for work, at most {MAX_WAIT_S:.0f}", minimum=0, maximum=MAX_WAIT_S
            ),
            Param(
                "max",
                {"type": "integer", "minimum": 1, "maximum": MAX_CLAIMS},
                "claim up to this many jobs that fit together; answered as {items: [claim, ...]}",
            ),
        ),
        headers=(
            string(
                "Idempotency-Key",
                "a retried claim (its answer lost) is answered the runs the first one started, if they"
                " still run on the worker, and starts nothing new",
            ),
        ),
        errors=(400, 404),
    ),
    Operation(
        "POST",
        "/jobs/{job_id}/heartbeat",
        "renew the attempt's lease; the answer may ask to stop",
        _PROTOCOL,
        {200: HeartbeatAnswer},
        body=JobHeartbeatBody,
        body_required=False,
        query=FENCE,
        errors=(400, 404, 409, 413),
    ),
    Operation(
        "POST",
        "/jobs/{job_id}/done",
        "the attempt exited 0",
        _PROTOCOL,
        {200: JobAnswer},
        query=FENCE,
        errors=(400, 404, 409),
    ),
    Operation(
        "POST",
        "/jobs/{job_id}/fail",
        "the attempt failed (re-queued while attempts remain)",
        _PROTOCOL,
        {200: JobAnswer},
        body=FailBody,
        body_required=False,
        query=FENCE,
        errors=(400, 404, 409, 413),
    ),
    Operation(
        "POST",
        "/workers/{worker_id}/reports",
        "final reports (done, fail) of several attempts of the worker, answered per report",
        _PROTOCOL,
        {200: FinalReportsAnswer},
        body=FinalReportsBody,
        errors=(400, 413),
        description="Each item is `{job_id, attempt, outcome: done}` or `{job_id, attempt, outcome: fail,"
        " exit_code, error, output_tail, release, reason}`, fenced by the path's worker id and its"
        " attempt, and answered as `POST /jobs/{id}/done` or `/fail` would: `{status: 200, job}` or"
        " `{status, error}`; one refused or malformed item never fails the others.",
    ),
    Operation(
        "POST",
        "/jobs/{job_id}/preempted",
        "the stop asked at the epoch is done",
        _PROTOCOL,
        {200: JobAnswer},
        query=(*FENCE, integer("epoch", "the preemption epoch of the stop", required=True)),
        errors=(400, 404, 409),
    ),
    Operation(
        "POST",
        "/jobs/{job_id}/watchdog",
        "a watchdog of the worker stopped the job",
        _PROTOCOL,
        {200: JobAnswer},
        body=WatchdogBody,
        query=FENCE,
        errors=(400, 404, 409, 413),
    ),
    Operation(
        "POST",
        "/jobs/{job_id}/checkpoint",
        "store the attempt's checkpoint (opaque bytes)",
        _PROTOCOL,
        {200: CheckpointSaved},
        body=BYTES,
        query=(*FENCE, integer("epoch", "the stop's epoch, when the server asked for it")),
        errors=(400, 404, 409, 413),
    ),
    Operation(
        "GET",
        "/jobs/{job_id}/checkpoint",
        "the stored checkpoint (204: none)",
        "jobs",
        {200: BYTES, 204: None},
        errors=(404,),
    ),
]

routes = [
    Route("/jobs/next", claim, methods=["GET"]),
    Route("/jobs/{job_id}/heartbeat", job_heartbeat, methods=["POST"]),
    Route("/jobs/{job_id}/done", done, methods=["POST"]),
    Route("/jobs/{job_id}/fail", fail, methods=["POST"]),
    Route("/jobs/{job_id}/preempted", preempted, methods=["POST"]),
    Route("/workers/{worker_id}/reports", final_reports, methods=["POST"]),
    Route("/jobs/{job_id}/watchdog", watchdog, methods=["POST"]),
    Route("/jobs/{job_id}/checkpoint", upload_checkpoint, methods=["POST"]),
    Route("/jobs/{job_id}/checkpoint", download_checkpoint, methods=["GET"]),
]
