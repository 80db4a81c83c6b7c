"""Worker routes: register (upsert), heartbeat, list, get, drain."""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from corral.domain import errors
from corral.domain.clock import to_rfc3339
from corral.protocol.answers import EmptyAnswer, WorkerAnswer, WorkerPage
from corral.protocol.models import WorkerHeartbeatBody, WorkerRegisterBody
from corral.server import changes
from corral.server.auth import principal_of, require_worker_id
from corral.server.http import answer, json_response, parse_body
from corral.server.loops.reaper import record_lost
from corral.server.openapi import Operation
from corral.server.state import state_of
from corral.store.base import WorkerRegistration, WorkerView

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
    }


def _view(request: Request, worker_id: str) -> WorkerView:
    view = state_of(request).store.get_worker(worker_id)
    if view is None:
        raise errors.NotFound(f"worker {worker_id} not found")
    return view


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
    worker = state.store.register_worker(
        WorkerRegistration(
            id=worker_id,
            address=body.address,
            resources=body.resources.to_domain(),
            gpu_model=body.gpu_model,
            labels=dict(body.labels),
        ),
        state.clock.now(),
    )
    logger.info("worker registered", extra={"worker_id": worker.id, "resources": worker.resources.to_dict()})
    state.released()
    return answer(WorkerAnswer, worker_to_wire(_view(request, worker.id)), 201)


async def heartbeat(request: Request) -> Response:
    state = state_of(request)
    body = await parse_body(request, WorkerHeartbeatBody, optional=True)
    readings = [reading.model_dump() for reading in body.gpus] if body.gpus is not None else None
    worker_id = request.path_params["worker_id"]
    now = state.clock.now()
    applied = changes.worker_heartbeat(
        state.store,
        worker_id,
        now,
        state.settings.heartbeat_timeout_s,
        readings,
        body.unhealthy_gpus,
        body.running,
    )
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
    return json_response({})


async def list_workers(request: Request) -> Response:
    views = state_of(request).store.list_workers()
    return answer(WorkerPage, {"items": [worker_to_wire(view) for view in views], "next": None})


async def get_worker(request: Request) -> Response:
    return answer(WorkerAnswer, worker_to_wire(_view(request, request.path_params["worker_id"])))


async def drain(request: Request) -> Response:
    state = state_of(request)
    worker = state.store.drain_worker(request.path_params["worker_id"])
    logger.info("worker draining", extra={"worker_id": worker.id})
    return answer(WorkerAnswer, worker_to_wire(_view(request, worker.id)))


async def undrain(request: Request) -> Response:
    """Undo a drain: the worker takes work again (a re-register keeps ``draining``; this does not)."""
    state = state_of(request)
    worker = state.store.undrain_worker(request.path_params["worker_id"])
    logger.info("worker undrained", extra={"worker_id": worker.id, "status": worker.status})
    state.released(gang_waiting=True)
    return answer(WorkerAnswer, worker_to_wire(_view(request, worker.id)))


described = [
    Operation(
        "POST",
        "/workers/register",
        "register a worker (an upsert by id; revives an offline worker)",
        "workers",
        {201: WorkerAnswer},
        body=WorkerRegisterBody,
        errors=(400, 413),
    ),
    Operation("GET", "/workers", "every worker", "workers", {200: WorkerPage}, errors=()),
    Operation("GET", "/workers/{worker_id}", "the worker", "workers", {200: WorkerAnswer}, errors=(404,)),
    Operation(
        "POST",
        "/workers/{worker_id}/heartbeat",
        "the worker is alive: GPU readings, the jobs it runs",
        "workers",
        {200: EmptyAnswer},
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
]

routes = [
    Route("/workers/register", register, methods=["POST"]),
    Route("/workers", list_workers, methods=["GET"]),
    Route("/workers/{worker_id}", get_worker, methods=["GET"]),
    Route("/workers/{worker_id}/heartbeat", heartbeat, methods=["POST"]),
    Route("/workers/{worker_id}/drain", drain, methods=["POST"]),
    Route("/workers/{worker_id}/undrain", undrain, methods=["POST"]),
]
