"""Worker routes: register (upsert), heartbeat, list, get, drain, leave, remove."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from corral.core import workers as worker_rules
from corral.core.lifecycle import HeartbeatAction
from corral.domain import errors
from corral.domain.clock import to_rfc3339
from corral.protocol.answers import WorkerAnswer, WorkerHeartbeatAnswer, WorkerPage
from corral.protocol.models import GpuReading, WorkerHeartbeatBody, WorkerRegisterBody
from corral.server import changes
from corral.server.auth import principal_of, require_worker_id
from corral.server.executor import Work
from corral.server.http import answer, json_response, parse_body
from corral.server.loops.reaper import record_lost
from corral.server.openapi import Operation
from corral.server.routes import protocol
from corral.server.state import ServerState, state_of
from corral.store.base import JobReport, WorkerRegistration, WorkerView
from corral.store.ports import Store

logger = logging.getLogger("corral.server.workers")


def worker_to_wire(view: WorkerView) -> dict[str, Any]:
    worker = view.worker
    return {
        "id": worker.id,
        "address": worker.address,
        "resources": worker.resources.to_dict(),
        "gpu_model": worker.gpu_model,
        "labels": worker.labels,
        "status": worker.status,
        "last_heartbeat_at": to_rfc3339(worker.last_heartbeat_at),
        "registered_at": to_rfc3339(worker.registered_at),
        "flagged_dead_at": to_rfc3339(worker.flagged_dead_at),
        "used": view.used.to_dict(),
        "running": list(view.running),
        "unhealthy_gpus": list(worker.unhealthy_gpus),
        "gpu_stats": [
            {"index": reading.index, "util_pct": reading.util_pct, "mem_used_mb": reading.mem_used_mb}
            for reading in worker.gpu_stats
        ],
        "enforcement": dict(worker.enforcement),
    }


def _view(state: ServerState, worker_id: str) -> WorkerView:
    view = state.store.workers.get_worker(worker_id)
    if view is None:
        raise errors.NotFound(f"worker {worker_id} not found")
    return view


def _register(state: ServerState, registration: WorkerRegistration, now: float) -> WorkerView:
    worker = state.store.workers.register_worker(registration, now)
    state.workers_changed()
    return _view(state, worker.id)


def _drain(state: ServerState, worker_id: str) -> WorkerView:
    worker = state.store.workers.drain_worker(worker_id)
    state.workers_changed()
    return _view(state, worker.id)


async def register(request: Request) -> Response:
    state = state_of(request)
    body = await parse_body(request, WorkerRegisterBody)
    worker_id = body.id or ""
    principal = principal_of(request)
    if not worker_id and principal is not None and principal.role == "worker" and principal.name != "*":
        worker_id = principal.name  # a token bound to one worker id registers as that worker
    if worker_id:
        # (no id with a fleet token, ``*``: the server assigns one, as without auth)
        require_worker_id(request, worker_id)
    view = await state.executor.run(
        Work.STORE,
        _register,
        state,
        WorkerRegistration(
            id=worker_id,
            address=body.address,
            resources=body.resources.to_domain(),
            gpu_model=body.gpu_model,
            labels=dict(body.labels),
            enforcement=body.enforcement.model_dump() if body.enforcement is not None else {},
        ),
        state.clock.now(),
    )
    worker = view.worker
    logger.info("worker registered", extra={"worker_id": worker.id, "resources": worker.resources.to_dict()})
    state.released()
    return answer(WorkerAnswer, worker_to_wire(view), 201)


async def heartbeat(request: Request) -> Response:
    state = state_of(request)
    body = await parse_body(request, WorkerHeartbeatBody, optional=True)
    readings = readings_of(body.gpus) if body.gpus is not None else None
    worker_id = request.path_params["worker_id"]
    now = state.clock.now()
    beats = [
        changes.JobBeat(
            beat.id,
            beat.attempt,
            JobReport(beat.progress, beat.gpu_util_pct, beat.rss_mb, beat.checkpoint_at),
            beat.defer_s,
        )
        for beat in body.jobs or ()
    ]
    applied, jobs = await state.executor.run(Work.SHORT, _beat, state, worker_id, now, readings, body, beats)
    worker = applied.beat.worker
    if body.unhealthy_gpus and set(body.unhealthy_gpus) - set(applied.beat.previous_unhealthy):
        # Once per newly reported GPU, not at every heartbeat that repeats it.
        logger.error(
            "worker reports unhealthy GPUs",
            extra={"worker_id": worker.id, "unhealthy_gpus": list(worker.unhealthy_gpus)},
        )
    for gone in applied.gone:
        record_lost(state, gone, f"worker {worker_id} no longer runs the job")
    if applied.gone:
        state.released()
    if body.jobs is None:
        return json_response({})
    answers: dict[str, object] = {}
    for job_id, action in jobs.items():
        if isinstance(action, errors.CorralError):
            answers[job_id] = {"error": {"code": action.code, "message": action.message}}
        elif action is None:  # renewed on a running job: carry on
            answers[job_id] = {}
        else:
            answers[job_id] = protocol.heartbeat_answer(state, action, worker_id)
    return json_response({"jobs": answers})


def readings_of(gpus: list[GpuReading]) -> list[dict[str, object]]:
    """Each reading as ``model_dump`` gives it, written out: a serializer call per GPU, 8 in
    every heartbeat, cost more than the dictionaries."""
    return [
        {"index": reading.index, "util_pct": reading.util_pct, "mem_used_mb": reading.mem_used_mb}
        for reading in gpus
    ]


def _beat(
    state: ServerState,
    worker_id: str,
    now: float,
    readings: list[dict[str, object]] | None,
    body: WorkerHeartbeatBody,
    beats: list[changes.JobBeat],
) -> tuple[changes.WorkerHeartbeat, dict[str, HeartbeatAction | errors.CorralError | None]]:
    """The worker's own heartbeat, then its jobs' leases: renewed with it (SQLite: in its
    transaction; PostgreSQL: right after it commits) when each job is named once and ``running``
    lists it, else after it on their own (a job ``running`` leaves out is judged first:
    ``unlisted``)."""
    settings = state.settings
    together = may_renew_with(beats, body.running)
    applied = changes.worker_heartbeat(
        state.store,
        worker_id,
        now,
        settings.heartbeat_timeout_s,
        readings,
        body.unhealthy_gpus,
        body.running,
        beats if together else (),
    )
    if not beats:
        return applied, {}
    timeouts = settings.checkpoint_timeout_s, settings.max_deferral_s
    if together:
        return applied, changes.beat_answers(
            state.store.jobs, worker_id, now, beats, applied.beat.renewed, *timeouts
        )
    return applied, changes.heartbeat_jobs(state.store.jobs, worker_id, now, beats, *timeouts)


def may_renew_with(beats: list[changes.JobBeat], running: list[str] | None) -> bool:
    """Whether the leases ``beats`` may be renewed with the worker's heartbeat
    (``Workers.worker_heartbeat``'s ``jobs``): each job named once, each in ``running`` if given."""
    job_ids = {beat.job_id for beat in beats}
    if len(job_ids) != len(beats):
        return False
    return running is None or job_ids.issubset(running)


async def list_workers(request: Request) -> Response:
    state = state_of(request)
    body = await state.executor.run(Work.READ, worker_page, state.topology_levels)
    return Response(body, media_type="application/json")


def worker_page(store: Store, memory: dict[str, Any], topology_levels: tuple[str, ...] = ()) -> bytes:
    """Every worker, read and encoded (by the reader process, or a store thread: thousands of them
    take a while), with the server's topology levels (``corral workers`` groups by them)."""
    views = store.workers.list_workers()
    # Not checked against WorkerPage: for 2,000 workers with their GPU readings the check cost more
    # than the rest of the answer; the items are the same worker_to_wire as every single-worker
    # answer, which is checked.
    return orjson.dumps(
        {
            "items": [worker_to_wire(view) for view in views],
            "next": None,
            "topology_levels": list(topology_levels),
        }
    )


async def get_worker(request: Request) -> Response:
    state = state_of(request)
    view = await state.executor.run(Work.STORE, _view, state, request.path_params["worker_id"])
    return answer(WorkerAnswer, worker_to_wire(view))


async def drain(request: Request) -> Response:
    state = state_of(request)
    view = await state.executor.run(Work.STORE, _drain, state, request.path_params["worker_id"])
    logger.info("worker draining", extra={"worker_id": view.worker.id})
    return answer(WorkerAnswer, worker_to_wire(view))


def _undrain(state: ServerState, worker_id: str) -> WorkerView:
    worker = state.store.workers.undrain_worker(worker_id)
    state.workers_changed()
    return _view(state, worker.id)


async def undrain(request: Request) -> Response:
    """Undo a drain: the worker takes work again (a re-register keeps ``draining``; this does not)."""
    state = state_of(request)
    view = await state.executor.run(Work.STORE, _undrain, state, request.path_params["worker_id"])
    logger.info("worker undrained", extra={"worker_id": view.worker.id, "status": view.worker.status})
    state.released(gang_waiting=True)
    return answer(WorkerAnswer, worker_to_wire(view))


async def leave(request: Request) -> Response:
    """The worker is stopping (SIGTERM, Ctrl-C: ``corral worker`` says so as it ends): offline
    now, not after ``CORRAL_WORKER_OFFLINE_S`` of silence. Its jobs were handed back before."""
    state = state_of(request)
    view = await state.executor.run(Work.STORE, _leave, state, request.path_params["worker_id"])
    logger.info("worker left", extra={"worker_id": view.worker.id, "status": view.worker.status})
    return answer(WorkerAnswer, worker_to_wire(view))


def _leave(state: ServerState, worker_id: str) -> WorkerView:
    state.store.workers.change_worker(worker_id, worker_rules.leaves)
    state.workers_changed()
    return _view(state, worker_id)


async def remove(request: Request) -> Response:
    """Forget an offline worker (admin): ``corral workers remove ID``. 409 ``conflict`` for one
    that is not offline or still holds jobs (``core.workers.removal_refused``)."""
    state = state_of(request)
    worker_id = request.path_params["worker_id"]
    await state.executor.run(
        Work.STORE, state.store.workers.remove_worker, worker_id, worker_rules.removal_refused
    )
    state.workers_changed()
    logger.info("worker removed", extra={"worker_id": worker_id})
    return Response(status_code=204)


described = [
    Operation(
        "POST",
        "/workers/register",
        "register a worker (an upsert by id; revives an offline worker; 409 when the new resources"
        " would not cover the jobs it holds)",
        "workers",
        {201: WorkerAnswer},
        body=WorkerRegisterBody,
        errors=(400, 409, 413),
    ),
    Operation("GET", "/workers", "every worker", "workers", {200: WorkerPage}, errors=()),
    Operation("GET", "/workers/{worker_id}", "the worker", "workers", {200: WorkerAnswer}, errors=(404,)),
    Operation(
        "POST",
        "/workers/{worker_id}/heartbeat",
        "the worker is alive: GPU readings, the jobs it runs, their leases (answered per job)",
        "workers",
        {200: WorkerHeartbeatAnswer},
        body=WorkerHeartbeatBody,
        body_required=False,
        errors=(400, 404, 413),
    ),
    Operation(
        "POST",
        "/workers/{worker_id}/drain",
        "place no more work on the worker",
        "workers",
        {200: WorkerAnswer},
        errors=(404,),
    ),
    Operation(
        "POST",
        "/workers/{worker_id}/undrain",
        "undo a drain: the worker takes work again (admin)",
        "workers",
        {200: WorkerAnswer},
        errors=(404,),
    ),
    Operation(
        "POST",
        "/workers/{worker_id}/leave",
        "the worker is stopping: offline at once (a register or heartbeat revives it)",
        "workers",
        {200: WorkerAnswer},
        errors=(404,),
    ),
    Operation(
        "DELETE",
        "/workers/{worker_id}",
        "remove an offline worker that holds no job (admin); 409 otherwise",
        "workers",
        {204: None},
        errors=(404, 409),
    ),
]

#: the worker heartbeat: a fleet's most frequent request (every host every 5 s, its jobs' leases
#: with it). The app tries it before every other route: Starlette matches its routes in order, a
#: regular expression each, and from 33rd place the matching cost 7% of the heartbeat's time in the
#: application. No other route's path matches this one's (``app.routed_first`` checks it).
heartbeat_route = Route("/workers/{worker_id}/heartbeat", heartbeat, methods=["POST"])

routes = [
    Route("/workers/register", register, methods=["POST"]),
    Route("/workers", list_workers, methods=["GET"]),
    Route("/workers/{worker_id}", get_worker, methods=["GET"]),
    Route("/workers/{worker_id}", remove, methods=["DELETE"]),
    Route("/workers/{worker_id}/leave", leave, methods=["POST"]),
    Route("/workers/{worker_id}/drain", drain, methods=["POST"]),
    Route("/workers/{worker_id}/undrain", undrain, methods=["POST"]),
]
