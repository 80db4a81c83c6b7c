"""While the store is failing, the requests that write are answered 503 at once (issue 24's residual).

A store that cannot take writes (another process holding SQLite's write lock, a full disk, a
PostgreSQL server that does not answer) makes every write wait out the store's busy timeout before
it fails: the requests queue behind the lock (this process's writers take turns on it) and their
503s come late, one after another. A worker whose heartbeats are answered later than its
self-fence's delay (``worker.fence``) cannot tell that from a partition, and stops and hands back
healthy jobs. So once ``StoreHealth`` knows the store is failing (a request or a loop pass saw it
fail), a request that writes is answered at once with that failure's 503 (``store_busy`` or
``store_unavailable``, with ``Retry-After``: nothing was changed, sending it again is safe), never
queued. The worker counts such an answer to its heartbeat as heard
(``fence.heard_through_a_stall``), and the server counts no silence until the store has recovered
(``core.hearing``), so no lease ends meanwhile on either side.

What writes (``writes``): every route but the reads (``GET``), and the one read that writes, the
claim (``GET /jobs/next`` takes jobs). Reads go on: SQLite reads through a lock and a full disk
(the write-ahead log); an unreachable PostgreSQL fails them on its own connect timeout, and an
operator's ``LOCK TABLE jobs`` holds them up to the busy timeout as before. A request
for no route goes on too (the router answers its 404 or 405), and so does a request refused by
authentication (this gate comes after it).

The requests that passed the gate before the store failed, and still wait for a store thread, are
held to the same rule when their turn comes (``admission``, the executor's ``admission``): they
would each wait out the busy timeout too, and the queue that built up before the first failure was
known (a fleet's heartbeats) would drain a few threads at a time, for as long as the stall or more.

The recovery must still be seen, with no write let through to find it: each refusal starts a check
(``StoreHealth.check``: a write that commits is the recovery) on a thread of its own, unless one
is in flight or one started less than ``CHECK_INTERVAL_S`` ago; once one commits, the next request
goes through. The reaper and ``/readyz`` check the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from functools import partial

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from corral.domain import errors
from corral.server.http import error_response
from corral.server.store_health import StoreHealth

logger = logging.getLogger("corral.server.store")

#: the methods that only read, as routed (HEAD is answered by the GET routes)
READ_METHODS = frozenset({"GET", "HEAD"})
#: the paths of the reads that write all the same: the claim takes jobs
WRITING_READS = frozenset({"/jobs/next"})
#: the least time between two checks started by refusals: a full disk refuses a write at once, and a
#: fleet's heartbeats must not turn into a check per request
CHECK_INTERVAL_S = 0.2
#: what a refused request is told to wait before sending it again
RETRY_AFTER_S = 1


#: whether the request being served may write (set by the gate around each such request, read by
#: ``admission`` on the event loop when the request hands store work to a store thread)
_MAY_WRITE: ContextVar[bool] = ContextVar("corral_request_may_write", default=False)


def may_write(scope: Scope) -> bool:
    """Whether the request may write, from its method and path alone (no route matched)."""
    return scope["method"] not in READ_METHODS or scope["path"] in WRITING_READS


def writes(scope: Scope, routes: Sequence[BaseRoute]) -> bool:
    """Whether the request of ``scope`` needs the store to take a write (the module docstring): a
    read only when it is the claim; any other method when a route takes it (a request for no
    route, or a method its route does not take, is left to the router's 404 or 405)."""
    if scope["method"] in READ_METHODS:
        return may_write(scope)
    return any(route.matches(scope)[0] is Match.FULL for route in routes)


def refusal_message(code: str) -> str:
    return (
        f"the store cannot take writes now (it failed as {code}): this request was refused before it"
        f" reached the store, nothing was changed; send it again after {RETRY_AFTER_S} s"
    )


def refuse_if_failing(health: StoreHealth) -> None:
    """Raise ``StoreRefused`` while the store is failing."""
    if health.failing:
        code = health.failure_code
        raise errors.StoreRefused(code, refusal_message(code))


def admission(health: StoreHealth) -> Callable[[], Callable[[], None] | None]:
    """The executor's ``admission``: called on the event loop as a request hands store work to a
    store thread, it returns what the thread runs first: for a request that may write,
    ``refuse_if_failing`` (so that work queued before the store was known to fail is refused when
    its turn comes, not sent to wait on the store); for any other work, nothing."""
    refuse = partial(refuse_if_failing, health)

    def admit() -> Callable[[], None] | None:
        return refuse if _MAY_WRITE.get() else None

    return admit


class StoreGate:
    """The gate (pure ASGI, event loop only). ``check`` runs one ``StoreHealth.check`` of the
    store, raising ``StoreUnavailable`` while it still fails; ``routes``: the app's routes."""

    def __init__(
        self,
        app: ASGIApp,
        health: StoreHealth,
        check: Callable[[], Awaitable[None]],
        routes: Sequence[BaseRoute],
    ) -> None:
        self.app = app
        self.health = health
        self.check = check
        self.routes = routes
        self._checking: asyncio.Task[None] | None = None
        self._checked_at = float("-inf")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not may_write(scope):
            await self.app(scope, receive, send)
            return
        if not self.health.failing or not writes(scope, self.routes):
            marked = _MAY_WRITE.set(True)
            try:
                await self.app(scope, receive, send)
            finally:
                _MAY_WRITE.reset(marked)
            return
        self._start_check()
        code = self.health.failure_code
        response = error_response(503, code, refusal_message(code), {"Retry-After": str(RETRY_AFTER_S)})
        await response(scope, receive, send)

    def _start_check(self) -> None:
        """A check of the store, unless one is in flight or started less than
        ``CHECK_INTERVAL_S`` ago."""
        now = asyncio.get_running_loop().time()
        if (self._checking is not None and not self._checking.done()) or now - self._checked_at < (
            CHECK_INTERVAL_S
        ):
            return
        self._checked_at = now
        self._checking = asyncio.get_running_loop().create_task(self._check())

    async def _check(self) -> None:
        try:
            await self.check()
        except errors.StoreUnavailable:
            pass  # still failing: the next refusal checks again
        except Exception:
            logger.exception("the check of a failing store raised")
