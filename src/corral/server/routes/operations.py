"""Operations: /health, /healthz (process up), /readyz (store answers within 1 s), /metrics,
/openapi.json."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from corral import __version__
from corral.domain import errors
from corral.protocol.answers import HealthAnswer, OpenApiAnswer, StatusAnswer
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
    """Ready when the store answers within a second (checked on a fresh connection in a thread, so a
    hung store cannot hang this probe)."""
    store = state_of(request).store
    try:
        await asyncio.wait_for(asyncio.to_thread(store.ping, READY_TIMEOUT_S), READY_TIMEOUT_S)
    except TimeoutError:
        return error_response(
            503, "store_unavailable", f"the store did not answer within {READY_TIMEOUT_S:.0f}s"
        )
    except errors.StoreUnavailable as error:
        return error_response(503, error.code, error.message)
    return json_response({"status": "ready"})


async def metrics(request: Request) -> Response:
    return Response(generate_latest(state_of(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


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
        "the store answers within 1 s (else 503)",
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
