"""What every route and loop shares: built once by the composition root (``app.create_app``).

The event loop never waits on the store: a route hands its store work to ``run_store``, which runs
it on one of the server's store threads (``CORRAL_STORE_THREADS``) while the loop goes on serving
other requests (``run_short``, for the protocol's short calls, first tries the work on the event
loop where the store can take it without any wait: SQLite with no lock in the way); the background
loops run their passes on threads of their own (``loops.runner``). Anything a route or a pass
calls from such a thread must be thread-safe: metrics and logging are, ``WorkSignal.notify`` and
``wake_loop`` hand the wake-up to the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from corral.config import ServerSettings
from corral.core import cycle
from corral.core.claim import Claim
from corral.core.placement import CycleMemo
from corral.core.preemption import PreemptionSettings
from corral.domain import pools
from corral.domain.clock import Clock
from corral.domain.pools import PoolDefaults
from corral.observability.metrics import Metrics
from corral.server import switching
from corral.server.offload import OffloadGone, StoreProcess
from corral.server.signal import WorkSignal
from corral.store import Store
from corral.store.base import WouldWait

if TYPE_CHECKING:
    from corral.server.grouped import ReportGroups, TurnGroup

P = ParamSpec("P")
T = TypeVar("T")


@dataclass
class ServerState:
    store: Store
    settings: ServerSettings
    clock: Clock
    metrics: Metrics = field(default_factory=Metrics)
    signal: WorkSignal = field(default_factory=WorkSignal)
    instance_id: str = field(default_factory=lambda: secrets.token_hex(4))
    started_monotonic: float = field(default_factory=time.monotonic)
    #: when this server started, on its clock: the reaper's startup grace counts from it
    started_at: float = 0.0
    #: ask a background loop for a pass soon (set by the composition root; a no-op until then)
    wake_loop: Callable[[str], None] = field(default=lambda name: None)

    #: whether the last admission pass saw a gang waiting (blocked or reserved tasks); while none
    #: waits, a released slot has nothing for the admission cycle to do before its next tick
    gangs_waiting: bool = True
    #: when this replica last removed logs past their retention (``loops.reaper.purge_logs``)
    logs_purged_at: float = float("-inf")

    #: worker id -> when the admission cycle last made a preemptive placement on it (the backoff).
    #: Kept by the loop leader in memory: a new leader may preempt on a worker once more within
    #: one backoff, nothing worse.
    last_preemptive: dict[str, float] = field(default_factory=dict)
    #: what one admission pass counted from the workers (free capacity, worker shapes, the
    #: planner's victim units), for the next: the store hands the cycle the same record objects
    #: for unchanged rows (``Store.admission_inputs``), so a pass counts again only the workers
    #: whose records changed. Used by the admission loop's one thread; the decisions are the same
    #: without it (``placement.CycleMemo``)
    admission_memo: CycleMemo = field(default_factory=CycleMemo)
    #: the threads store work runs on (``run_store``); None: on the event loop (``store_threads`` 0)
    executor: ThreadPoolExecutor | None = field(init=False)
    #: the job reports of one event-loop turn, applied together (``grouped.groups_of``)
    report_groups: ReportGroups | None = field(default=None, init=False)
    #: the claims of one event-loop turn, started together (``routes.protocol.claim_groups``)
    claim_groups: TurnGroup[Any, Any] | None = field(default=None, init=False)
    #: the processes that plan the admission pass and build the large list answers
    #: (``offload.StoreProcess``); None: on the server's threads (a server made in a test, or
    #: ``CORRAL_STORE_PROCESSES=false``)
    planner: StoreProcess | None = None
    reader: StoreProcess | None = None
    #: the claim's policy with the pools it was made from, and when (``claim_policy``)
    _claim: tuple[float, Claim] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        threads = self.settings.store_threads
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix="corral-store") if threads else None

    def preemption_settings(self) -> PreemptionSettings:
        return cycle.preemption_settings(self.settings)

    @property
    def pool_defaults(self) -> PoolDefaults:
        """What a pool inherits when neither it nor an ancestor sets a value."""
        return cycle.pool_defaults(self.settings)

    def claim_policy(self) -> Claim:
        """The claim's policy (``corral.core.claim``), with the pools as stored (the claim reads a
        job's pool kind): read again once it is an admission tick old, and at once after this
        replica changed a pool (``pools_changed``); another replica's change reaches this one's
        claims within a tick. Called on store threads: the swap of one attribute is atomic."""
        kept = self._claim
        now = time.monotonic()
        if kept is None or now - kept[0] >= self.settings.admission_tick_s:
            kept = (now, Claim(pools.resolve(self.store.pools(), self.pool_defaults)))
            self._claim = kept
        return kept[1]

    def pools_changed(self) -> None:
        """A pool was stored or deleted here: the next claim reads the pools again."""
        self._claim = None

    def released(self, gang_waiting: bool = False) -> None:
        """Capacity may have come free: wake long-polling claims, and the admission cycle when a
        gang waits (or ``gang_waiting`` says one has just started to: a gang submit, a drain that
        put one back in the queue)."""
        self.signal.notify()
        if gang_waiting:
            self.gangs_waiting = True
        if self.gangs_waiting:
            self.wake_loop("admission")


async def run_store(state: ServerState, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``work(*args, **kwargs)`` on one of the store threads: the event loop serves every other
    request (heartbeats, ``/healthz``) while a store call, a slow read or a locked store takes its
    time. ``work`` is a store call, or a function of the route's doing several (and the encoding of
    a large answer), so that a request crosses to a thread once."""
    if state.executor is None:
        return work(*args, **kwargs)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(state.executor, partial(work, *args, **kwargs))


async def run_long_read(state: ServerState, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``run_store`` for a read that runs long in Python (a page of 5,000 jobs, every worker, a
    dashboard page, ``why``): with the short switch interval while it runs (``switching``), so that
    the event loop gets the interpreter back at once for the heartbeats meanwhile. (Not for a
    submit: what waits on it waits for the write lock, not the interpreter.)"""
    call = partial(work, *args, **kwargs)

    def long_read() -> T:
        with switching.long_work():
            return call()

    return await run_store(state, long_read)


async def run_read(
    state: ServerState,
    work: Callable[Concatenate[Store, dict[str, Any], P], T],
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """A long read that makes its answer from the store alone (a page of 5,000 jobs, every
    worker): done by the reader process where the server runs one (``offload``: its Python then
    never competes with the requests for the interpreter), else on a store thread as a long read.
    ``work(store, memory, *args)`` is a module-level function; a reader that died is replaced at
    the next read, and this one is done on a store thread instead."""
    reader = state.reader
    if reader is not None:
        try:
            return await run_store(state, reader.call, partial(work, **kwargs), *args)
        except OffloadGone:
            pass
    return await run_long_read(state, work, state.store, {}, *args, **kwargs)


async def run_short(state: ServerState, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``run_store`` for the protocol's short calls (a claim, a report, a heartbeat): tried on the
    event loop first when the store can take it without waiting (SQLite with no writer in the way,
    ``Store.run_inline``), which is as fast as before the store threads; else on a store thread."""
    if state.executor is None:
        return work(*args, **kwargs)
    call = partial(work, *args, **kwargs)
    try:
        return state.store.run_inline(call)
    except WouldWait:
        pass
    return await run_store(state, _beside_the_loop, call)


def _beside_the_loop(call: Callable[[], T]) -> T:
    """Work on a store thread with the short switch interval: the thread gets the interpreter back
    from the event loop within 0.5 ms at each statement, not 5 ms. On SQLite this thread holds the
    write lock meanwhile, so every call tried inline finds it taken and follows onto a thread: a
    thread slow to finish would keep the calls queueing behind one another (``bench/protocol.py``:
    6.7% of the calls on threads and 8-10% fewer jobs/s than main at 5 ms)."""
    with switching.long_work():
        return call()


def off_loop(handler: Callable[[Request], Response]) -> Callable[[Request], Awaitable[Response]]:
    """A route whose whole handler is store work (it awaits nothing), run on a store thread as a
    long read (the dashboard's pages)."""

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        return await run_long_read(state_of(request), handler, request)

    return endpoint


def state_of(request: Request) -> ServerState:
    state: ServerState = request.app.state.corral
    return state
