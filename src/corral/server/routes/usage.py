"""``GET /usage`` (API.md "Usage"): the GPU- and CPU-seconds a window's attempts used, per user,
pool or both (an attempt still holding its resources counts up to now). A user sees their own
rows, an admin everyone's (``?user=`` narrows); without auth everyone is an admin. The sums are the
store's (``store.usage``), the grouping, window and wait percentiles the core's (``core.usage``).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from corral.core import usage
from corral.domain import errors
from corral.domain.clock import from_rfc3339, to_rfc3339
from corral.protocol.answers import UsagePage
from corral.server.auth import Role, principal_of
from corral.server.executor import Work
from corral.server.http import answer
from corral.server.openapi import Operation, string
from corral.server.state import ServerState, state_of


def _time(request: Request, name: str) -> float | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        return from_rfc3339(raw)
    except ValueError:
        raise errors.InvalidRequest(f"{name} must be an RFC 3339 time, got {raw!r}", field=name) from None


async def get_usage(request: Request) -> Response:
    state = state_of(request)
    try:
        by = usage.grouping(request.query_params.get("by") or "user,pool")
    except ValueError as error:
        raise errors.InvalidRequest(str(error), field="by") from None
    try:
        since, until = usage.window(state.clock.now(), _time(request, "since"), _time(request, "until"))
    except ValueError as error:
        raise errors.InvalidRequest(str(error), field="since") from None
    principal = principal_of(request)
    user = request.query_params.get("user") or None
    if principal is not None and principal.role != Role.ADMIN:
        user = principal.name
    content = await state.executor.run(Work.LONG, _usage, state, since, until, by, user, state.clock.now())
    return answer(UsagePage, content)


def _usage(
    state: ServerState, since: float, until: float, by: tuple[str, ...], user: str | None, now: float
) -> dict[str, Any]:
    totals = state.store.usage.usage_totals(since, until, by, now, user)
    waits = state.store.usage.usage_waits(since, until, by, now, user)
    return {
        "since": to_rfc3339(since),
        "until": to_rfc3339(until),
        "items": [
            {
                "user": item.totals.user,
                "pool": item.totals.pool,
                "gpu_seconds": round(item.totals.gpu_seconds, 3),
                "cpu_seconds": round(item.totals.cpu_seconds, 3),
                "attempts": item.totals.attempts,
                "jobs": item.totals.jobs,
                "wait_s": {"p50": _rounded(item.wait_p50_s), "p90": _rounded(item.wait_p90_s)},
            }
            for item in usage.items(totals, waits)
        ],
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


described = [
    Operation(
        "GET",
        "/usage",
        "GPU- and CPU-seconds, attempts, jobs and waits of a window, per user, pool or both",
        "usage",
        {200: UsagePage},
        query=(
            string("since", "RFC 3339 (default: a week before until)", format="date-time"),
            string("until", "RFC 3339 (default: now)", format="date-time"),
            string(
                "by", "user, pool or user,pool (default)", enum=["user", "pool", "user,pool", "pool,user"]
            ),
            string("user", "one user's rows (admins; a user always sees their own only)"),
        ),
        errors=(400,),
    ),
]

routes = [Route("/usage", get_usage, methods=["GET"])]
