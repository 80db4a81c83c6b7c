"""Pool routes (API.md "Pools"): the tree with each pool's effective settings and usage, and the
admin's PUT / DELETE of one pool. Inheritance is ``corral.domain.pools.resolve``'s; the rows and
the safety checks of a delete are the store's.

``DELETE`` answers 204 with no body: there is nothing left to show.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from corral.core import fairshare
from corral.core.fairshare import PoolShare
from corral.domain import errors
from corral.domain.clock import to_rfc3339
from corral.domain.pools import (
    NOT_STARVING,
    UNLIMITED,
    Pool,
    PoolSettings,
    PoolUsage,
    StarvationState,
    check_path,
    resolve,
    subtree_usage,
    tree_order,
    with_job_pools,
)
from corral.domain.resources import ZERO, Resources
from corral.protocol.answers import PoolAnswer, PoolPage
from corral.protocol.models import PoolBody
from corral.server.executor import Work
from corral.server.http import answer, parse_body
from corral.server.openapi import Operation
from corral.server.state import ServerState, state_of


def limits_to_wire(limits: Resources | None) -> dict[str, int | None] | None:
    """A limit as sent: null for a resource it leaves free."""
    if limits is None:
        return None
    return {name: None if value == UNLIMITED else value for name, value in limits.to_dict().items()}


def settings_to_wire(settings: PoolSettings) -> dict[str, Any]:
    """The stored settings, shaped as the PUT body that stored them."""
    return {
        "weight": settings.weight,
        "guarantee": settings.guarantee.to_dict() if settings.guarantee is not None else None,
        "limits": limits_to_wire(settings.limits),
        "mode": settings.mode,
        "kind": settings.kind,
        "starvation_timeout_s": settings.starvation_timeout_s,
        "aggressive_starvation_timeout_s": settings.aggressive_starvation_timeout_s,
        "starvation_tolerance": settings.starvation_tolerance,
        "enable_aggressive_starvation": settings.enable_aggressive_starvation,
        "allow_aggressive_preemption": settings.allow_aggressive_preemption,
        "default_walltime_s": settings.default_walltime_s,
        "max_walltime_s": settings.max_walltime_s,
    }


def pool_to_wire(
    pool: Pool,
    settings: PoolSettings | None,
    usage: PoolUsage,
    share: PoolShare | None = None,
    starvation: StarvationState = NOT_STARVING,
    total: Resources = ZERO,
) -> dict[str, Any]:
    fair = share.fair if share is not None else (0.0, 0.0, 0.0)
    return {
        "path": pool.path,
        "parent": pool.parent,
        "explicit": pool.explicit,
        "weight": pool.weight,
        "guarantee": pool.guarantee.to_dict(),
        "limits": limits_to_wire(pool.limits),
        "mode": pool.mode,
        "kind": pool.kind,
        "starvation_timeout_s": pool.starvation_timeout_s,
        "aggressive_starvation_timeout_s": pool.aggressive_starvation_timeout_s,
        "starvation_tolerance": pool.starvation_tolerance,
        "enable_aggressive_starvation": pool.enable_aggressive_starvation,
        "allow_aggressive_preemption": pool.allow_aggressive_preemption,
        "default_walltime_s": pool.default_walltime_s,
        "max_walltime_s": pool.max_walltime_s,
        "settings": settings_to_wire(settings or PoolSettings()),
        "usage": usage.held.to_dict(),
        "demand": usage.demand.to_dict(),
        "jobs": usage.jobs,
        "fair_share": {
            "gpus": round(fair[0] * total.gpus, 3),
            "cpus": round(fair[1] * total.cpus, 3),
            "memory_mb": round(fair[2] * total.memory_mb, 1),
        },
        "fair_share_ratio": round(share.fair_share, 6) if share is not None else 0.0,
        "satisfaction": _rounded(share.satisfaction) if share is not None else None,
        "starvation": str(starvation.status),
        "below_fair_share_since": to_rfc3339(starvation.below_since),
        "starvation_since": to_rfc3339(starvation.since) if starvation.status != "non_starving" else None,
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _resolved(state: ServerState) -> tuple[dict[str, PoolSettings], dict[str, PoolUsage], dict[str, Pool]]:
    """The stored settings, each pool's own usage, and every pool resolved: the stored ones, their
    ancestors, and any pool a job not yet ended names without a row (a pool deleted under it by
    a race)."""
    stored = state.store.pools.pools()
    own_usage = state.store.pools.pool_usage()
    pools = with_job_pools(resolve(stored, state.pool_defaults), own_usage, state.pool_defaults)
    return stored, own_usage, pools


def _cluster(state: ServerState) -> Resources:
    return fairshare.cluster_of(state.store.workers.workers())


def fair_share_now(state: ServerState) -> fairshare.FairShareState:
    """The fair shares as of now, with the starvation timers the admission cycle last stored."""
    _, own_usage, pools = _resolved(state)
    shares = fairshare.compute(pools, own_usage, _cluster(state))
    return fairshare.FairShareState(shares, state.store.pools.pool_starvation(), pools)


def _tree(state: ServerState) -> list[dict[str, Any]]:
    """Every pool, each right before its subtree (``tree_order``)."""
    stored, own_usage, pools = _resolved(state)
    usage = subtree_usage(own_usage, pools)
    total = _cluster(state)
    shares = fairshare.compute(pools, own_usage, total)
    starvation = state.store.pools.pool_starvation()
    return [
        pool_to_wire(
            pools[path],
            stored.get(path),
            usage[path],
            shares.pools.get(path),
            starvation.get(path, NOT_STARVING),
            total,
        )
        for path in sorted(pools, key=tree_order)
    ]


def _path(request: Request) -> str:
    path: str = request.path_params["path"]
    try:
        return check_path(path)
    except ValueError as error:
        raise errors.InvalidRequest(f"path: {error}", field="path") from None


def _one(state: ServerState, path: str) -> dict[str, Any]:
    for item in _tree(state):
        if item["path"] == path:
            return item
    raise errors.NotFound(f"pool {path} not found")


async def list_pools(request: Request) -> Response:
    state = state_of(request)
    return answer(PoolPage, {"items": await state.executor.run(Work.LONG, _tree, state), "next": None})


async def get_pool(request: Request) -> Response:
    state = state_of(request)
    return answer(PoolAnswer, await state.executor.run(Work.STORE, _one, state, _path(request)))


async def put_pool(request: Request) -> Response:
    state = state_of(request)
    path = _path(request)
    body = await parse_body(request, PoolBody, optional=True)
    return answer(
        PoolAnswer,
        await state.executor.run(Work.STORE, _put, state, path, body.to_domain(), state.clock.now()),
    )


def _put(state: ServerState, path: str, settings: PoolSettings, now: float) -> dict[str, Any]:
    state.store.pools.put_pool(path, settings, now)
    state.pools_changed()
    return _one(state, path)


async def delete_pool(request: Request) -> Response:
    state = state_of(request)
    await state.executor.run(Work.STORE, state.store.pools.delete_pool, _path(request))
    state.pools_changed()
    return Response(status_code=204)


described = [
    Operation(
        "GET",
        "/pools",
        "the pool tree: effective settings, usage and demand",
        "pools",
        {200: PoolPage},
        errors=(),
    ),
    Operation(
        "GET",
        "/pools/{path}",
        "one pool (a path such as team/project)",
        "pools",
        {200: PoolAnswer},
        errors=(404,),
    ),
    Operation(
        "PUT",
        "/pools/{path}",
        "create a pool or replace its settings (missing ancestors are created)",
        "pools",
        {200: PoolAnswer},
        body=PoolBody,
        body_required=False,
        # 404: a path no route matches (a line break in it), before the pool path rule's 400
        errors=(400, 404, 413),
    ),
    Operation(
        "DELETE",
        "/pools/{path}",
        "delete a pool that has no child pools and no unfinished jobs",
        "pools",
        {204: None},
        errors=(404, 409),
    ),
]

routes = [
    Route("/pools", list_pools, methods=["GET"]),
    Route("/pools/{path:path}", get_pool, methods=["GET"]),
    Route("/pools/{path:path}", put_pool, methods=["PUT"]),
    Route("/pools/{path:path}", delete_pool, methods=["DELETE"]),
]
