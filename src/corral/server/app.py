"""The composition root: store + core + loops + routes, wired once.

``create_app`` takes everything it needs (store, settings, clock) so tests build a server on any
store with a fake clock; ``corral.server.main`` builds the real one from settings.
"""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import Route

from corral.config import ServerSettings
from corral.domain import errors
from corral.domain.clock import Clock, SystemClock
from corral.domain.status import Status
from corral.server import auth, openapi, store_gate
from corral.server.connections import RefusedConnections
from corral.server.dashboard import routes as dashboard
from corral.server.executor import Work
from corral.server.http import (
    PageHeadersMiddleware,
    RequestIdMiddleware,
    corral_error_handler,
    http_error_handler,
)
from corral.server.limits import ClientLimitsMiddleware
from corral.server.log_watch import LogWatches
from corral.server.loops.admission import admission_tick
from corral.server.loops.dependencies import dependencies_tick
from corral.server.loops.history import history_tick
from corral.server.loops.reaper import dead_worker_sweep_interval, dead_worker_sweep_tick, reaper_tick
from corral.server.loops.retention import retention_tick
from corral.server.loops.runner import Loop, LoopGroup
from corral.server.offload import StoreProcess, StoreProcessConfig
from corral.server.routes import arrays, jobs, logs, operations, pools, protocol, usage, workers
from corral.server.state import ServerState
from corral.server.store_gate import StoreGate
from corral.store import Store
from corral.store.ports import Jobs

logger = logging.getLogger("corral.server")

#: every route's description, for ``GET /openapi.json`` (each declared beside its route)
DESCRIBED = [
    *protocol.described,
    *logs.described,
    *jobs.described,
    *arrays.described,
    *workers.described,
    *pools.described,
    *usage.described,
    *operations.described,
    *dashboard.described,
]


def cluster_gauges(store: Jobs) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Jobs by status, workers by status, and the GPUs of active workers by state."""
    jobs_by_status = store.count_jobs_by_status()
    counts = store.cluster_counts()
    held = counts.held_gpus_by_status
    reserved = held.get(Status.RESERVED, 0)
    busy = sum(held.values()) - reserved
    gpus = {"free": max(0, counts.active_gpus - reserved - busy), "reserved": reserved, "busy": busy}
    return jobs_by_status, counts.workers_by_status, gpus


def create_app(
    store: Store,
    settings: ServerSettings | None = None,
    clock: Clock | None = None,
    run_loops: bool = True,
    tokens: auth.TokenFile | None = None,
    store_url: str | None = None,
) -> Starlette:
    """The server application. ``run_loops=False`` leaves the background loops to the caller (tests
    drive ``state.loops`` by hand with a fake clock). ``store_url``: the store's URL, for the
    processes that plan the admission pass and build large lists (``offload``; ``corral server``
    passes it, a server made in a test does that work on its threads). Authentication is on when
    ``tokens`` is given or ``settings.auth_tokens`` names a token file (an unreadable one raises
    ``OSError``)."""
    settings = settings or ServerSettings()
    planner = reader = writer = None
    if store_url is not None and settings.store_processes:
        config = StoreProcessConfig(
            store_url, settings.store_busy_timeout_s, settings.log_level, settings.gc_threshold
        )
        timeout_s = settings.store_process_timeout_s
        planner = StoreProcess(config, "planner", timeout_s)
        reader = StoreProcess(config, "reader", timeout_s)
        # a batch submit's Python in a process of its own (``executor.Work.WRITE``): on PostgreSQL
        # only, where its write waits on row locks like any replica's; a second process writing a
        # SQLite file would hold the lock the event loop's inline calls count on finding free
        if not store_url.startswith("sqlite"):
            writer = StoreProcess(config, "writer", timeout_s)
    # the executor (``state.executor``) holds the store threads, the children, the loops' threads
    # and the switch interval long work runs with (``CORRAL_SWITCH_INTERVAL_S``)
    state = ServerState(
        store=store,
        settings=settings,
        clock=clock or SystemClock(),
        planner_process=planner,
        reader_process=reader,
        writer_process=writer,
    )
    state.started_at = state.clock.now()
    state.metrics.watch_store(partial(cluster_gauges, store.jobs))
    state.metrics.watch_connections(state.connections.figures)
    state.metrics.watch_store_size(
        lambda: (store.retention.size_bytes(), store.retention.oldest_job_submitted_at())
    )
    loops = LoopGroup(
        [
            Loop(name, interval, partial(tick, state), lead=partial(store.try_lead, name))
            for name, interval, tick in (
                ("admission", settings.admission_tick_s, admission_tick),
                ("reaper", settings.reaper_tick_s, reaper_tick),
                ("dead_worker_sweep", dead_worker_sweep_interval(settings), dead_worker_sweep_tick),
                ("retention", settings.retention_tick_s, retention_tick),
                ("dependencies", settings.dependency_tick_s, dependencies_tick),
                ("history", settings.history_interval_s / 2, history_tick),  # each interval sampled
            )
        ],
        state.metrics,
        state.executor.lanes,
        store_failed=state.store_health.failed,
    )
    state.wake_loop = loops.wake
    # a request that may write, queued for a store thread, is refused when its turn comes while
    # the store is failing (``store_gate``)
    state.executor.admission = store_gate.admission(state.store_health)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if run_loops:
            loops.start(on_death=_exit_on_loop_death)
        state.executor.start_writer(jobs.warm_writer)
        logger.info("server started", extra={"instance_id": state.instance_id, "store": store.dialect})
        yield
        await state.log_watches.close()
        await loops.stop()
        await state.executor.close()

    routes = routed_first(
        workers.heartbeat_route,
        [
            *protocol.routes,
            *logs.routes,
            *jobs.routes,
            *arrays.routes,
            *workers.routes,
            *pools.routes,
            *usage.routes,
            *operations.routes,
            *dashboard.routes,
        ],
    )
    auth.check_every_route_has_a_rule(routes)
    middleware = [
        Middleware(RequestIdMiddleware),
        Middleware(RefusedConnections, book=state.connections),
        Middleware(PageHeadersMiddleware),
        Middleware(
            ClientLimitsMiddleware,
            body_timeout_s=settings.body_timeout_s,
            max_requests_per_client=settings.max_requests_per_client,
            in_flight=state.requests_in_flight,
        ),
    ]
    if tokens is None and settings.auth_tokens:
        tokens = auth.TokenFile(settings.auth_tokens)
    state.log_watches = LogWatches(
        partial(logs.read_log, state),
        logs.FOLLOW_POLL_S,
        logs.FOLLOW_READ_BYTES,
        revision=tokens.revision if tokens is not None else _no_tokens,
    )
    if tokens is not None:
        owner_of = partial(_owner_lookup, state)
        middleware.append(Middleware(auth.AuthMiddleware, tokens=tokens, routes=routes, owner_of=owner_of))
        # after authentication: a connection counts under the principal its request proved
        middleware.append(Middleware(RefusedConnections, book=state.connections, identify=True))
    # innermost, after authentication: a caller without a token is told so, stall or not
    middleware.append(
        Middleware(StoreGate, health=state.store_health, check=partial(_check_store, state), routes=routes)
    )
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={
            errors.CorralError: corral_error_handler,
            HTTPException: http_error_handler,
        },
        lifespan=lifespan,
    )
    app.state.corral = state
    app.state.openapi = openapi.build(DESCRIBED)
    app.state.loops = loops
    return app


def routed_first(first: Route, routes: Sequence[Route]) -> list[Route]:
    """``first``, then ``routes``: Starlette tries its routes in order, so the most frequent
    request is matched at the first try. Refused (at start-up) when another route would match one
    of ``first``'s paths: that route, not ``first``, answered it before."""
    sample = re.sub(r"{[^}]*}", "x", first.path)
    for route in routes:
        if route.path_regex.match(sample):
            raise ValueError(f"route {route.path} matches {sample}: {first.path} cannot go first")
    return [first, *routes]


async def _owner_lookup(state: ServerState, kind: str, object_id: str) -> tuple[bool, str | None]:
    """``_owner_of``, run by the executor as a short call (the access rules ask it before a route)."""
    return await state.executor.run(Work.SHORT, _owner_of, state.store.jobs, kind, object_id)


async def _check_store(state: ServerState) -> None:
    """One check of a failing store (``StoreHealth.check``: a write that commits is its recovery),
    on a thread of its own as ``/readyz``'s, so that busy store threads cannot hold it up."""
    ping = partial(state.store.ping, state.settings.store_busy_timeout_s, write=True)
    await state.executor.run(Work.PROBE, state.store_health.check, ping)


def _owner_of(store: Jobs, kind: str, object_id: str) -> tuple[bool, str | None]:
    """Whether a job, gang or array exists, and its ``user`` (for the access rules)."""
    if kind == "job":
        job = store.get_job(object_id)
        return (False, None) if job is None else (True, job.spec.user)
    tasks = store.array_tasks(object_id, 1) if kind == "array" else store.gang_tasks(object_id)
    return (False, None) if not tasks else (True, tasks[0].spec.user)


def _no_tokens() -> int:
    """The token revision without authentication: it never changes."""
    return 0


def _exit_on_loop_death(name: str, error: BaseException | None) -> None:
    """A background loop must never stop silently: stop the server so its supervisor restarts it."""
    logger.critical("a background loop died; shutting down", extra={"loop": name})
    os.kill(os.getpid(), signal.SIGTERM)
