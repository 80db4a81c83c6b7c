"""One way for the server to run store work: the caller declares what the work is, the executor
decides where it runs.

The event loop serves every request, so it must never wait on the store; a long stretch of Python
beside it (a page of 5,000 jobs, an admission pass over 2,000 hosts) must not keep it from the
interpreter either. Routes, the dashboard and the background loops therefore hand every piece of
store work to the server's ``StoreExecutor`` with a declaration of what the work is: a ``Work``
kind, a ``Batch`` (work combined with the same batch's items of one event-loop turn), or a loop
pass. Where it runs follows from that and from what this server has configured (``places``):

- ``SHORT``, a protocol call of a few statements (a claim, a report, a heartbeat): on the event loop
  through ``Backend.run_inline`` where the store can take it without waiting (SQLite, no lock in the
  way): crossing to a thread would cost as much again (``bench/protocol.py``); else on a store
  thread, with the short switch interval so that it finishes without queueing the next calls. On a
  store whose waits the loop can make (PostgreSQL, ``waits_on_loop``; ``store_on_loop`` on): on
  the event loop too, in a session of its own (``store.on_loop``: a greenlet and a connection,
  as many as there are store threads), each wait on the database the loop's, as long as it would
  be on a thread; no thread crossing per call (``bench/heartbeat_app.py``). Except while long
  work runs beside the loop (``switching.long_work_beside``: a loop pass, a list built on a store
  thread, not one the reader process builds): a thread in Python then takes the interpreter for a
  switch interval at each of the loop's waits, and the loop alone would pay every one in turn
  (``bench/fleet.py``'s load window: heartbeat p99 250 ms to 3.5 s against 45-80 ms); on the
  store threads, as before, the waits overlap.
- ``STORE``, a route's store work (a submit, a cancel, a worker's registration): a store thread.
- ``LONG``, store work long in Python (a page of jobs, ``why``, a dashboard page, the metrics'
  gauges): a store thread with the short switch interval (``switching``), so that the event loop
  gets the interpreter back at once.
- ``READ``, a long read that makes its answer from the store alone (a module-level function of
  ``(store, memory, *args)``): the reader process where the server runs one (``offload``); a reader
  gone meanwhile is replaced at the next read, and this one runs as ``LONG`` instead.
- ``WRITE``, a write long in Python that makes its answer from its arguments and the store alone
  (a module-level function of ``(store, memory, *args)``: a batch submit of 10,000 jobs, its body
  decoded, validated, made into rows, inserted and its answer encoded): the writer process where
  the server runs one (PostgreSQL only, ``app.create_app``), so that the event loop keeps the
  interpreter meanwhile (``bench/fleet.py --submit-window``: on a store thread the batch's Python
  took the interpreter in 5 ms slices at each of the loop's waits); else as ``STORE``. A writer
  gone mid-call (or stopped past ``CORRAL_STORE_PROCESS_TIMEOUT_S``) fails that call with 503
  (whether it wrote is not known: a retry with its ``Idempotency-Key`` is safe), never runs it
  again on a thread; the next call starts a new one.
  Its answer is waited for on a thread of its own, not a store thread: the batches queued behind
  a long one hold none of them.
- ``PLAN``, the admission pass's planning (a module-level function of ``(store, memory, *args)``):
  the planner process where the server runs one (a planner gone mid-pass fails that pass; the next
  pass starts a new one), else on the caller's thread with a ``memory`` this executor keeps from
  call to call, as the planner process keeps its own.
- ``PROBE``, the readiness probe: a thread of its own, so that busy store threads cannot hold it up.
- a ``Batch`` (``grouped``): the claims, the reports of one event-loop turn, applied in one
  transaction (``grouped.TurnGroup``), placed as ``SHORT`` work.
- a loop pass (``run_pass``): the loop's own thread, with the short switch interval: a long pass
  never takes a store thread from the requests.

Without store threads (``store_threads`` 0) what the event loop hands over runs on it, as before
there were threads. From a thread of the server's own (a loop pass, ``call``) work runs on that
thread, except what a child process does.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Concatenate, Final, Generic, Literal, ParamSpec, Protocol, TypeVar, overload

from corral.domain import errors
from corral.server import switching
from corral.server.grouped import Batch, TurnGroup
from corral.server.offload import OffloadGone, StoreProcess
from corral.store import on_loop
from corral.store.base import WouldWait

P = ParamSpec("P")
T = TypeVar("T")
C = TypeVar("C")
Item = TypeVar("Item")
Result = TypeVar("Result")


class Work(enum.Enum):
    """What a piece of store work is (the module docstring says where each kind runs)."""

    SHORT = "short"
    STORE = "store"
    LONG = "long"
    READ = "read"
    WRITE = "write"
    PLAN = "plan"
    PROBE = "probe"


_SHORT = Work.SHORT
#: the kinds whose function is a module-level ``(store, memory, *args)``: a child may run it
STANDALONE = frozenset({Work.READ, Work.WRITE, Work.PLAN})
#: the kinds long in Python: the short switch interval wherever they run in this process
LONG = frozenset({Work.LONG, Work.READ})


class Place(enum.Enum):
    """Where a piece of work runs."""

    #: the caller's own thread (the event loop, or a loop pass's thread)
    INLINE = "inline"
    #: the event loop, through ``Backend.run_inline``: refused (``WouldWait``) when the store would wait
    INLINE_UNLESS_WAIT = "inline unless the store would wait"
    STORE_THREAD = "a store thread"
    #: a thread outside the store threads (the event loop's default executor)
    OWN_THREAD = "a thread of its own"
    PLANNER = "the planner process"
    READER = "the reader process"
    WRITER = "the writer process"


#: the places in a child process (``offload.StoreProcess``)
_CHILDREN = (Place.PLANNER, Place.READER, Place.WRITER)

#: what makes a place hand its work on to the next one: the store would wait, the child is gone
_FALLBACK: dict[Place, type[Exception]] = {
    Place.INLINE_UNLESS_WAIT: WouldWait,
    Place.PLANNER: OffloadGone,
    Place.READER: OffloadGone,
}


def places(
    work: Work, *, on_loop: bool, threads: bool, planner: bool, reader: bool, writer: bool = False
) -> tuple[Place, ...]:
    """Where ``work`` runs, first choice first: a later place takes the work only when an earlier
    one refused it (the store would have waited; the child process is gone). ``on_loop``: the
    caller is the event loop (else a thread of the server's own); ``threads``: the server has store
    threads; ``planner``, ``reader``, ``writer``: it runs those child processes."""
    beside = Place.STORE_THREAD if on_loop and threads else Place.INLINE
    if work is Work.SHORT:
        return (Place.INLINE_UNLESS_WAIT, Place.STORE_THREAD) if on_loop and threads else (Place.INLINE,)
    if work is Work.READ:
        return (Place.READER, beside) if reader else (beside,)
    if work is Work.WRITE:
        return (Place.WRITER,) if writer else (beside,)
    if work is Work.PLAN:
        return (Place.PLANNER,) if planner else (Place.INLINE,)
    if work is Work.PROBE:
        return (Place.OWN_THREAD,) if on_loop else (Place.INLINE,)
    return (beside,)


class InlineStore(Protocol):
    """What the executor needs of the store itself (the rest is the work's business)."""

    def run_inline(self, work: Callable[[], T]) -> T: ...


class Lanes:
    """A thread of its own for each background loop, each pass with the short switch interval."""

    def __init__(self, switch_interval_s: float | None) -> None:
        self._switch_interval_s = switch_interval_s
        self._threads: dict[str, ThreadPoolExecutor] = {}

    async def run(self, name: str, function: Callable[[], T]) -> T:
        lane = self._threads.get(name)
        if lane is None:
            lane = self._threads[name] = ThreadPoolExecutor(1, thread_name_prefix=f"corral-loop-{name}")
        return await asyncio.get_running_loop().run_in_executor(
            lane, partial(_with_short_interval, self._switch_interval_s, function)
        )

    async def close(self) -> None:
        """Wait for the passes running (the store must not close under one), then end the threads."""
        lanes, self._threads = list(self._threads.values()), {}
        for lane in lanes:
            await asyncio.to_thread(lane.shutdown)


class StoreExecutor(Generic[C]):
    """The server's one way to run store work (module docstring). ``context`` is what a ``Batch``'s
    functions are given (the server's state)."""

    def __init__(
        self,
        store: InlineStore,
        context: C,
        threads: int,
        switch_interval_s: float | None,
        planner: StoreProcess | None = None,
        reader: StoreProcess | None = None,
        store_on_loop: bool = False,
        writer: StoreProcess | None = None,
    ) -> None:
        self._store = store
        #: a store whose waits the event loop can make (PostgreSQL): the sessions ``SHORT`` work
        #: takes there, one connection each, as many as there are store threads
        self._sessions = (
            on_loop.Sessions(threads)
            if threads and store_on_loop and getattr(store, "waits_on_loop", False)
            else None
        )
        self._context = context
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="corral-store") if threads else None
        self._switch_interval_s = switch_interval_s
        #: the child processes (``offload``): fixed once made, as the placements are
        self.planner: Final = planner
        self.reader: Final = reader
        self.writer: Final = writer
        #: where a batch waits for the writer: one thread, as the writer takes one call at a time
        #: (``StoreProcess.call``), so that batches queued behind a long one (or behind a writer that
        #: hangs) hold no store thread meanwhile: the replica's other store work goes on
        self._writer_waits = ThreadPoolExecutor(1, thread_name_prefix="corral-writer") if writer else None
        self.lanes = Lanes(switch_interval_s)
        self._memory: dict[Work, dict[str, Any]] = {work: {} for work in STANDALONE}
        self._groups: dict[Batch[C, Any, Any], TurnGroup[Any, Any]] = {}
        #: called on the event loop as work is handed to a store thread: what the thread runs
        #: first (it may raise, refusing the work when its turn comes), or None (``store_gate``:
        #: a request that may write is refused there while the store is failing); None: nothing
        self.admission: Callable[[], Callable[[], None] | None] | None = None
        #: ``places`` of each kind for this server, from the event loop (True) or a thread (False)
        self._places = {
            (work, on_loop): places(
                work,
                on_loop=on_loop,
                threads=threads > 0,
                planner=planner is not None,
                reader=reader is not None,
                writer=writer is not None,
            )
            for work in Work
            for on_loop in (True, False)
        }

    @property
    def has_threads(self) -> bool:
        return self._threads is not None

    def places(self, work: Work, on_loop: bool) -> tuple[Place, ...]:
        """``places`` for this server."""
        return self._places[work, on_loop]

    @overload
    async def run(
        self,
        work: Literal[Work.READ, Work.WRITE, Work.PLAN],
        function: Callable[Concatenate[Any, dict[str, Any], P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T: ...

    @overload
    async def run(
        self,
        work: Literal[Work.SHORT, Work.STORE, Work.LONG, Work.PROBE],
        function: Callable[P, T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T: ...

    async def run(self, work: Work, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``function(*args, **kwargs)`` (for ``READ``, ``WRITE`` and ``PLAN``: ``function(store, memory,
        *args, **kwargs)``), awaited from the event loop, where ``work`` runs."""
        if work is _SHORT and self._threads is not None:
            if self._sessions is not None and not switching.long_work_beside():
                return await self._run_on_loop(partial(function, *args, **kwargs))
            # ``places``' first choice for the protocol's hot path (a claim, a report, a heartbeat),
            # written out: enum lookups cost as much as the rest of the crossing on CPython 3.11
            try:
                return self._store.run_inline(partial(function, *args, **kwargs))
            except WouldWait:
                return await self._run_at(Place.STORE_THREAD, work, function, args, kwargs)
        chosen = self._places[work, True]
        for place in chosen[:-1]:
            try:
                return await self._run_at(place, work, function, args, kwargs)
            except _FALLBACK[place]:
                continue
        return await self._run_at(chosen[-1], work, function, args, kwargs)

    async def _run_on_loop(self, call: Callable[[], T]) -> T:
        """``SHORT`` work on a store whose waits the loop makes (PostgreSQL): on the event loop in a
        session of its own (``on_loop``: no thread crossing), once one is free. What the admission
        says runs first, as on a store thread when the work's turn comes."""
        assert self._sessions is not None
        taken = await self._sessions.take()
        try:
            admit = self.admission() if self.admission is not None else None
            if admit is not None:
                admit()
            return await on_loop.run(call, taken, self._threads)
        finally:
            self._sessions.give_back(taken)

    @overload
    def call(
        self,
        work: Literal[Work.READ, Work.WRITE, Work.PLAN],
        function: Callable[Concatenate[Any, dict[str, Any], P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T: ...

    @overload
    def call(
        self,
        work: Literal[Work.SHORT, Work.STORE, Work.LONG, Work.PROBE],
        function: Callable[P, T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T: ...

    def call(self, work: Work, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``run`` from a thread of the server's own (a loop pass), waiting for the result."""
        chosen = self.places(work, on_loop=False)
        for place in chosen[:-1]:
            try:
                return self._blocking(place, work, function, args, kwargs)()
            except _FALLBACK[place]:
                continue
        return self._blocking(chosen[-1], work, function, args, kwargs)()

    async def grouped(self, batch: Batch[C, Item, Result], item: Item) -> Result:
        """``item``'s outcome, applied with the other items of ``batch`` in this event-loop turn."""
        group = self._groups.get(batch)
        if group is None:
            group = self._groups[batch] = TurnGroup(
                partial(batch.apply_many, self._context),
                partial(batch.apply_one, self._context),
                batch.max_group,
                partial(self.run, Work.SHORT),
            )
        result: Result = await group.apply(item)
        return result

    def start_writer(self, warm_up: Callable[..., object] | None = None) -> None:
        """Start the writer process now and run ``warm_up`` there (``StoreProcess.start``), on the
        thread batches wait for it on (a batch that arrives meanwhile waits for the start, as it
        would have started it): the first batch after the server starts is not the one that pays
        for it. The planner and reader start at their first call (a pass or a list that takes
        seconds anyway)."""
        if self.writer is not None and self._writer_waits is not None:
            self._writer_waits.submit(self.writer.start, warm_up)

    async def run_pass(self, name: str, function: Callable[[], T]) -> T:
        """A background loop's pass, on that loop's own thread."""
        return await self.lanes.run(name, function)

    async def close(self) -> None:
        """Once the server stops: the passes finish, the children end, the store threads end."""
        await self.lanes.close()
        for process in (self.planner, self.reader, self.writer):
            if process is not None:
                await asyncio.to_thread(process.close)
        if self._writer_waits is not None:
            await asyncio.to_thread(self._writer_waits.shutdown)
        if self._threads is not None:
            await asyncio.to_thread(self._threads.shutdown)

    async def _run_at(
        self,
        place: Place,
        work: Work,
        function: Callable[..., T],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> T:
        blocking = self._blocking(place, work, function, args, kwargs)
        if place is Place.OWN_THREAD:
            return await asyncio.to_thread(blocking)
        # on a store thread; a child's answer is waited for there too, where there are threads,
        # except the writer's (on its own thread: ``_writer_waits``)
        waits = self._writer_waits if place is Place.WRITER else self._threads
        if place in (Place.STORE_THREAD, *_CHILDREN) and waits is not None:
            admit = self.admission() if self.admission is not None else None
            if admit is not None:
                blocking = partial(_admitted, admit, blocking)
            return await asyncio.get_running_loop().run_in_executor(waits, blocking)
        return blocking()

    def _blocking(
        self,
        place: Place,
        work: Work,
        function: Callable[..., T],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Callable[[], T]:
        """The work at ``place`` as one call that waits for its result."""
        if place in _CHILDREN:
            child = {Place.PLANNER: self.planner, Place.READER: self.reader, Place.WRITER: self.writer}[place]
            assert child is not None
            # pickled by name: the keyword arguments travel bound to the module-level function
            call = partial(child.call, partial(function, **kwargs) if kwargs else function, *args)
            return partial(_written, call) if place is Place.WRITER else call
        if work in STANDALONE:
            call = partial(function, self._store, self._memory[work], *args, **kwargs)
        else:
            call = partial(function, *args, **kwargs)
        if place is Place.INLINE_UNLESS_WAIT:
            return partial(self._store.run_inline, call)
        if work in LONG:
            return partial(_with_short_interval, self._switch_interval_s, call)
        if work is Work.SHORT and place is Place.STORE_THREAD:
            # a short call on a thread holds SQLite's write lock: it must not keep it for 5 ms
            # slices while the loop's calls queue behind it (``bench/protocol.py``)
            return partial(_with_short_interval, self._switch_interval_s, call, True)
        return call


def _written(call: Callable[[], T]) -> T:
    """``call()`` in the writer process; its end mid-call a 503 (``OutcomeUnknown``, not noted as
    the store failing: the child ended, not the store): the write may or may not have committed,
    so it is not done again here (a retry with the same ``Idempotency-Key`` is safe)."""
    try:
        return call()
    except OffloadGone as gone:
        raise errors.OutcomeUnknown(
            f"{gone}: whether this request was applied is not known; sent with an Idempotency-Key,"
            " send it again with the same key (a replay answers what was stored); sent without one,"
            " look for its jobs (GET /jobs) before sending it again"
        ) from gone


def _admitted(admit: Callable[[], None], call: Callable[[], T]) -> T:
    """``call()`` once ``admit()`` lets it (on the store thread, when the work's turn has come)."""
    admit()
    return call()


def _with_short_interval(
    switch_interval_s: float | None, call: Callable[[], T], short_call: bool = False
) -> T:
    with switching.long_work(switch_interval_s, short_call):
        return call()
