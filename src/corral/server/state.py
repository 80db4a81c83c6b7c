"""What every route and loop shares: built once by the composition root (``app.create_app``).

The event loop never waits on the store: a route hands its store work to the server's executor
(``state.executor``, ``executor.StoreExecutor``) with what the work is (``executor.Work``), and the
executor runs it where it belongs (on the event loop when the store can take it without any wait,
on one of the store threads, in a child process, grouped with the rest of the turn) while the loop
goes on serving other requests; the background loops run their passes on threads of their own.
Anything a route or a pass calls from such a thread must be thread-safe: metrics and logging are,
``WorkSignal.notify`` and ``wake_loop`` hand the wake-up to the event loop.
"""

from __future__ import annotations

import functools
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import InitVar, dataclass, field
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from corral.config import ServerSettings
from corral.core import cycle, topology
from corral.core.claim import Claim
from corral.core.hearing import Hearing
from corral.core.preemption import PreemptionSettings
from corral.core.schedulable import Verdicts
from corral.domain import pools
from corral.domain.clock import Clock
from corral.domain.pools import Pool, PoolDefaults
from corral.domain.records import Hold
from corral.observability.metrics import Metrics
from corral.server.connections import ConnectionBook
from corral.server.executor import StoreExecutor, Work
from corral.server.log_watch import LogWatches
from corral.server.offload import StoreProcess
from corral.server.signal import WorkSignal
from corral.server.store_health import StoreHealth
from corral.store import Store

#: how long ``ServerState.standing_verdicts`` keeps the workers it read
WORKERS_KEPT_S = 1.0


def kept_verdicts(store: Store, memory: dict[str, Any], generation: int) -> Verdicts:
    """The registered workers' verdicts (``core.schedulable``) kept in ``memory``: read again once
    ``WORKERS_KEPT_S`` old, or once ``generation`` (``ServerState.workers_changed``) is not the one
    they were read at. A change while they are read leaves them kept at the generation before it:
    the next call reads again. The server's own (``standing_verdicts``) and the writer process's
    (``routes.jobs.submit_batch_in_process``, given the server's generation)."""
    kept: tuple[float, int, Verdicts] | None = memory.get("verdicts")
    now = time.monotonic()
    if kept is None or kept[1] != generation or now - kept[0] >= WORKERS_KEPT_S:
        kept = memory["verdicts"] = (now, generation, Verdicts(store.workers.workers()))
    return kept[2]


@dataclass
class ServerState:
    store: Store
    settings: ServerSettings
    clock: Clock
    metrics: Metrics = field(default_factory=Metrics)
    signal: WorkSignal = field(default_factory=WorkSignal)
    instance_id: str = field(default_factory=lambda: secrets.token_hex(4))
    started_monotonic: float = field(default_factory=time.monotonic)
    #: when this server started, on its clock: no silence counts from before it (``hearing``)
    started_at: float = 0.0
    #: ask a background loop for a pass soon (set by the composition root; a no-op until then)
    wake_loop: Callable[[str], None] = field(default=lambda name: None)

    #: whether the last admission pass saw a gang waiting (blocked or reserved tasks); while none
    #: waits, a released slot has nothing for the admission cycle to do before its next tick
    gangs_waiting: bool = True
    #: whether a job may be waiting on its ``after`` conditions: set by a submit that has one,
    #: cleared by a dependency pass that found none. While none waits, a job's end has nobody to
    #: settle and does not wake the dependency loop (on PostgreSQL a pass is a lock round trip and
    #: a read: 9-17% of the server's CPU per job in a claim-and-done storm, ``bench/protocol.py``).
    #: A dependent submitted on another replica is settled by this one's next tick.
    dependents_waiting: bool = True
    #: when this replica last removed logs past their retention (``loops.reaper.purge_logs``)
    logs_purged_at: float = float("-inf")

    #: worker id -> when the admission cycle last made a preemptive placement on it (the backoff).
    #: Kept by the loop leader in memory: a new leader may preempt on a worker once more within
    #: one backoff, nothing worse.
    last_preemptive: dict[str, float] = field(default_factory=dict)
    #: worker id -> the reservations (holds with a start) this replica's admission loop last wrote,
    #: for ``backfill_started_total`` (a claim beside one, ending before it starts)
    reservations: dict[str, list[Hold]] = field(default_factory=dict)
    #: the one way routes, loops and the dashboard run store work (``executor``)
    executor: StoreExecutor[ServerState] = field(init=False)
    #: whether the store's writes fail now, and when they last came back (``store_health``)
    store_health: StoreHealth = field(init=False)
    #: the processes that plan the admission pass and build the large list answers
    #: (``offload.StoreProcess``), handed to the executor (``executor.planner``, ``.reader``: not
    #: attributes of the state, so that a reader of ``state.planner`` fails loudly instead of
    #: finding None); None: on the server's threads (a server made in a test, or
    #: ``CORRAL_STORE_PROCESSES=false``)
    planner_process: InitVar[StoreProcess | None] = None
    reader_process: InitVar[StoreProcess | None] = None
    #: the process that takes a batch submit (``executor.Work.WRITE``; PostgreSQL only)
    writer_process: InitVar[StoreProcess | None] = None
    #: open connections, in all and per client (``connections``; counted by the HTTP protocol)
    connections: ConnectionBook = field(init=False)
    #: client address -> requests in flight (``limits.ClientLimitsMiddleware``)
    requests_in_flight: dict[str, int] = field(default_factory=dict)
    #: the shared polls of the jobs whose logs are followed (``log_watch``; set by ``create_app``)
    log_watches: LogWatches = field(init=False)
    #: the pools as resolved, the claim's policy made from them, and when (``claim_policy``)
    _claim: tuple[float, dict[str, Pool], Claim] | None = field(default=None, init=False)
    #: bumped by ``pools_changed``: a claim policy read before the bump is never kept after it
    _pools_generation: int = field(default=0, init=False)
    #: the registered workers' verdicts as last read for the reasons of waiting work
    #: (``standing_verdicts``, ``kept_verdicts``)
    _verdicts: dict[str, Any] = field(default_factory=dict, init=False)
    _workers_generation: int = field(default=0, init=False)

    def __post_init__(
        self, planner: StoreProcess | None, reader: StoreProcess | None, writer: StoreProcess | None
    ) -> None:
        settings = self.settings
        self.connections = ConnectionBook(settings.max_connections, settings.max_connections_per_client)
        self.executor = StoreExecutor(
            self.store,
            self,
            threads=settings.store_threads,
            switch_interval_s=settings.switch_interval_s,
            planner=planner,
            reader=reader,
            store_on_loop=settings.store_on_loop,
            writer=writer,
        )
        self.store_health = StoreHealth(self.clock)

    def hearing(self) -> Hearing:
        """Since when this server has been able to hear its workers: its start, the store's last
        recovery, or not now (the store is failing): the liveness rules count silence from it."""
        return self.store_health.hearing(self.started_at)

    @property
    def topology_levels(self) -> tuple[str, ...]:
        """``CORRAL_TOPOLOGY_LEVELS``, widest first (``corral.core.topology``)."""
        return topology.parse_levels(self.settings.topology_levels)

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
        claims within a tick. Called on store threads: the swap of one attribute is atomic, and a
        policy read before a change here (``pools_changed`` ran meanwhile) is used once, not kept."""
        return self._kept_pools()[2]

    def resolved_pools(self) -> dict[str, Pool]:
        """The pools as resolved (``corral.domain.pools.resolve``), kept as the claim's policy is
        (``claim_policy``): what a submit's time limits are read from."""
        return self._kept_pools()[1]

    def _kept_pools(self) -> tuple[float, dict[str, Pool], Claim]:
        kept = self._claim
        now = time.monotonic()
        if kept is None or now - kept[0] >= self.settings.admission_tick_s:
            generation = self._pools_generation
            resolved = pools.resolve(self.store.pools.pools(), self.pool_defaults)
            kept = (now, resolved, Claim(resolved))
            if generation == self._pools_generation:
                self._claim = kept
        return kept

    def pools_changed(self) -> None:
        """A pool was stored or deleted here: the next claim reads the pools again."""
        self._pools_generation += 1
        self._claim = None

    def standing_verdicts(self) -> Verdicts:
        """What the registered workers make of waiting work, for what a submit and a read say
        about it (``core.schedulable``: ``unschedulable`` or ``queued``), each shape of request
        asked once while the workers are kept: read again once ``WORKERS_KEPT_S`` old, and at
        once after this replica registered, drained, undrained, removed a worker or heard it
        leave (``workers_changed``), so a submit does not read every worker. A worker another
        replica registered, or one the reaper found silent, reaches these reasons within
        ``WORKERS_KEPT_S``."""
        return kept_verdicts(self.store, self._verdicts, self._workers_generation)

    @property
    def workers_generation(self) -> int:
        """Bumped by ``workers_changed``: a process that keeps its own verdicts (the writer's,
        ``routes.jobs.submit_batch_in_process``) reads the workers again once it moved."""
        return self._workers_generation

    def workers_changed(self) -> None:
        """A worker came, went or changed status here: the next ``standing_verdicts`` reads again."""
        self._workers_generation += 1

    def released(self, gang_waiting: bool = False, dependent_waiting: bool = False) -> None:
        """Capacity may have come free: wake long-polling claims, the dependency loop when a job
        may wait on its ``after`` conditions (or ``dependent_waiting`` says one has just been
        submitted), and the admission cycle when a gang waits (or ``gang_waiting`` says one has
        just started to: a gang submit, a drain that put one back in the queue)."""
        self.signal.notify()
        if dependent_waiting:
            self.dependents_waiting = True
        if self.dependents_waiting:
            # a job that ended may settle the jobs that run after it
            self.wake_loop("dependencies")
        if gang_waiting:
            self.gangs_waiting = True
        if self.gangs_waiting:
            self.wake_loop("admission")


def store_handler(
    work: Literal[Work.SHORT, Work.STORE, Work.LONG], handler: Callable[[Request], Response]
) -> Callable[[Request], Awaitable[Response]]:
    """A route whose whole handler is store work (it awaits nothing), run by the executor as
    ``work`` (the dashboard's pages: ``Work.LONG``)."""

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        return await state_of(request).executor.run(work, handler, request)

    return endpoint


def state_of(request: Request) -> ServerState:
    """The state of the server answering ``request``."""
    return state_of_app(request.app)


def state_of_app(app: Starlette) -> ServerState:
    """The state ``app.create_app`` gave ``app`` (the one place that reads it untyped)."""
    state = app.state.corral
    assert isinstance(state, ServerState)
    return state
