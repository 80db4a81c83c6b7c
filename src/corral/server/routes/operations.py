"""Operations: /health, /healthz (process up), /readyz (store answers within 1 s), /metrics,
/openapi.json."""

from __future__ import annotations

import asyncio
import time
from functools import partial

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from corral import __version__
from corral.domain import errors
from corral.protocol.answers import HealthAnswer, OpenApiAnswer, StatusAnswer
from corral.server.executor import Work
from corral.server.http import answer, error_response, json_response
from corral.server.openapi import PROMETHEUS, Operation
from corral.server.state import state_of

READY_TIMEOUT_S = 1.0


async def health(request: Request) -> Response:
    state = state_of(request)
    return answer(
        HealthAnswer,
        {
            "status": "ok",
            "instance_id": state.instance_id,
            "uptime_s": round(time.monotonic() - state.started_monotonic, 3),
            "version": __version__,
            "store": state.store.dialect,
        },
    )


async def healthz(request: Request) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready when the store answers, and could take a write, within a second (checked on the
    store's probe connection in a thread of its own, so neither a hung store nor busy store threads
    can hold this probe up): a store locked by someone else is 503 ``store_busy``. While the
    server's writes are failing (``store_health``: a full disk lets the lock be taken, not the
    write) the probe commits a write too: 503 ``store_unavailable`` until one commits, which is
    also the store's recovery (so a server this probe took out of rotation comes back with no
    other traffic)."""
    state = state_of(request)
    health, ping = state.store_health, state.store.ping
    probe = partial(health.check, partial(ping, READY_TIMEOUT_S * 0.8, write=True))
    if not health.failing:
        probe = partial(ping, READY_TIMEOUT_S * 0.8)
    try:
        await asyncio.wait_for(state.executor.run(Work.PROBE, probe), READY_TIMEOUT_S)
    except TimeoutError:
        return error_response(
            503, "store_unavailable", f"the store did not answer within {READY_TIMEOUT_S:.0f}s"
        )
    except errors.StoreUnavailable as error:
        headers = {"Retry-After": str(error.retry_after_s)} if error.retry_after_s is not None else None
        return error_response(503, error.code, error.message, headers)
    return json_response({"status": "ready"})


async def metrics(request: Request) -> Response:
    """On a store thread: the cluster gauges read the store at every scrape."""
    state = state_of(request)
    text = await state.executor.run(Work.LONG, generate_latest, state.metrics.registry)
    return Response(text, media_type=CONTENT_TYPE_LATEST)


async def openapi_document(request: Request) -> Response:
    """The description is built once per app (``app.create_app`` hands it over)."""
    return json_response(request.app.state.openapi)


described = [
    Operation(
        "GET", "/health", "the server's identity and uptime", "operations", {200: HealthAnswer}, errors=()
    ),
    Operation("GET", "/healthz", "the process is up", "operations", {200: StatusAnswer}, errors=()),
    Operation(
        "GET",
        "/readyz",
        "the store answers within 1 s, and takes writes (else 503)",
        "operations",
        {200: StatusAnswer},
        errors=(503,),
    ),
    Operation("GET", "/metrics", "Prometheus metrics (corral_*)", "operations", {200: PROMETHEUS}, errors=()),
    Operation(
        "GET",
        "/openapi.json",
        "this description (OpenAPI 3.1)",
        "operations",
        {200: OpenApiAnswer},
        errors=(),
    ),
]

routes = [
    Route("/health", health, methods=["GET"]),
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/openapi.json", openapi_document, methods=["GET"]),
]
