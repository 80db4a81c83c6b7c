"""PostgreSQL's short store work on the event loop itself: the store's code stays synchronous, and
each wait on the database's socket is handed to the loop instead of blocking it (issue 26).

Handing each claim, report or heartbeat to a store thread costs more of the server's CPU than the
store's own Python for it (``bench/heartbeat_app.py``: a batched heartbeat 620 us with the crossing,
400 us without): a ``Future``, a queue, a thread woken and the loop woken back. Here the work runs
in a greenlet on the loop thread with a database session of its own (``Session``: a connection and
its pipeline, never shared with another piece of work while this one runs). Where the store would
wait on its socket (``wait_socket``: the pipeline's waits, psycopg's own through ``LoopConnection``)
the greenlet hands the wait to ``run``, which awaits the socket on the loop and switches back once it
is ready; a blocking call that has no socket to wait on (a connect) is handed to a store thread
(``off_loop``). Meanwhile the loop serves every other request.

The executor sends short work here only while no long work runs beside the loop (a loop pass, a
list: ``server.switching``); then it goes to the store threads as before, where the waits for the
interpreter that such a thread imposes overlap instead of queueing on the loop.

A wait here has no bound of its own, as a wait on a store thread has none: PostgreSQL answers a
pipeline only at its sync, so one wait may cover every statement's lock waits, each bounded by the
session's ``lock_timeout`` (then ``store_busy``); a database that stops answering is found by the
connection's keepalives (then ``StoreUnavailable``). A bound here would have to give up on work the
server may still commit, and answer "nothing written" for it. A wait never holds the loop, and a
caller that goes away ends its work where it waits (its connection closed). Outside such a
greenlet (a store thread, a loop pass, a test) every function here blocks as the store always did.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import select
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

try:  # the PostgreSQL extra brings it (corral[postgres]); without it work is never run on the loop
    import greenlet
except ImportError:  # pragma: no cover - exercised only without the extra
    greenlet = None

T = TypeVar("T")


class Session:
    """A database session for work on the loop: what a store thread keeps in its thread-locals
    (``PostgresStore._local``: the connection, its pipeline, the transaction open on it), and the
    greenlet the work runs in (``OnLoop``: one kept from work to work, as a thread is; a new one
    costs a fresh frame stack, mapped and unmapped, every time)."""

    def __init__(self) -> None:
        self.connection: Any = None
        self.pipeline: Any = None
        self.open: Any = None
        self.runner: Any = None

    def greenlet(self) -> Any:
        """The session's greenlet, ready for its next work (``_serve``)."""
        if self.runner is None or self.runner.dead:
            self.runner = OnLoop(_serve, self)
        return self.runner


@dataclass(frozen=True)
class _Wait:
    """What the work asks of the loop: wake it once ``fileno`` is ready for ``events`` (poll's)."""

    fileno: int
    events: int
    #: whose socket it is (a connection closed and another opened may get the same number)
    owner: object


@dataclass(frozen=True)
class _Finished:
    """What the work's greenlet hands back once the work is over: its result, or what it raised."""

    result: Any
    error: BaseException | None


def _serve(work: Callable[[], Any]) -> None:
    """A session greenlet's life: run the work it is given, hand its outcome to the loop (which
    answers with the next work), and so on."""
    while True:
        try:
            finished = _Finished(work(), None)
        except BaseException as error:  # the work's outcome: the caller's to raise
            finished = _Finished(None, error)
        work = _current().parent.switch(finished)


@dataclass(frozen=True)
class _Call:
    """What the work asks of the loop: ``function()``'s result, from a store thread."""

    function: Callable[[], Any]


if greenlet is not None:

    class OnLoop(greenlet.greenlet):  # type: ignore[misc]
        """A piece of store work running on the event loop, in ``session``."""

        def __init__(self, run: Callable[..., Any], session: Session) -> None:
            super().__init__(run)
            self.session = session

    _current = greenlet.getcurrent


def available() -> bool:
    """Whether work can run on the loop here (greenlet is installed)."""
    return greenlet is not None


def session() -> Session | None:
    """The session of the work running on the event loop now, else None (a thread's own)."""
    if greenlet is None:
        return None
    current = _current()
    return current.session if type(current) is OnLoop else None


def wait_socket(fileno: int, events: int, owner: object = None) -> int:
    """Until ``fileno`` (``owner``'s: its connection) is ready for ``events`` (``select.POLLIN``,
    ``POLLOUT``), and what it is ready for: on the loop the work waits and the loop goes on;
    elsewhere this thread waits (without the interpreter)."""
    if greenlet is not None:
        current = _current()
        if type(current) is OnLoop:
            ready: int = current.parent.switch(_Wait(fileno, events, owner))
            return ready
    poller = select.poll()
    poller.register(fileno, events)
    return poller.poll()[0][1] if events else 0


def off_loop(function: Callable[[], T]) -> T:
    """``function()``, a blocking call with no socket to wait on (a connect): from work on the
    loop, on a store thread while the loop goes on; elsewhere here."""
    if greenlet is not None:
        current = _current()
        if type(current) is OnLoop:
            result: T = current.parent.switch(_Call(function))
            return result
    return function()


class Sessions:
    """The sessions work on the loop takes, at most ``size`` at once (a connection each, as many
    as the store threads that ran this work before): work that finds them all taken waits for one,
    first come first served, as it waited for a store thread."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._idle: list[Session] = []
        self._made = 0
        self._waiting: collections.deque[asyncio.Future[Session]] = collections.deque()

    async def take(self) -> Session:
        """An idle session, a new one while fewer than ``size`` exist, else the next given back."""
        if self._idle:
            return self._idle.pop()
        if self._made < self.size:
            self._made += 1
            return Session()
        given: asyncio.Future[Session] = asyncio.get_running_loop().create_future()
        self._waiting.append(given)
        try:
            return await given
        except asyncio.CancelledError:
            if given.done() and not given.cancelled():  # handed over as the waiter went: pass it on
                self.give_back(given.result())
            raise

    def give_back(self, taken: Session) -> None:
        """``taken`` to the first work waiting for a session, else idle."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(taken)
                return
        self._idle.append(taken)


async def run(work: Callable[[], T], taken: Session, threads: Executor | None) -> T:
    """``work()`` on the event loop in the session ``taken``, every wait it makes the loop's, each
    as long as the database takes (as on a store thread). Called from the loop thread."""
    assert greenlet is not None, "work on the loop needs greenlet (corral[postgres])"
    driver = _Driver(asyncio.get_running_loop(), work, taken, threads)
    driver.start()
    try:
        result: T = await driver.done
    except asyncio.CancelledError:
        driver.abandon()
        raise
    return result


class _Driver:
    """Runs one piece of work's greenlet: into it at once, then again from the loop's own callback
    each time the socket it waits on is ready (no task step, no future per wait), until it returns
    or raises into ``done``. The socket it reads stays registered with the loop from its first
    wait to its end (a reader added and removed per wait cost as much as the rest of the wait)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        work: Callable[[], Any],
        taken: Session,
        threads: Executor | None,
    ) -> None:
        self.loop = loop
        self.threads = threads
        self.done: asyncio.Future[Any] = loop.create_future()
        self.work = work
        self.task = taken.greenlet()
        self.task.gr_context = contextvars.copy_context()
        #: the socket registered to read, and whose it is (a reconnect may reuse the number)
        self.reading: tuple[int, object] | None = None
        #: the socket registered to write (only while a wait asks for it)
        self.writing: int | None = None
        #: the events the wait in progress waits for
        self.wanted = 0

    def start(self) -> None:
        """Run the work until it first waits, or ends."""
        self._went_on(partial(self.task.switch, self.work))

    def step(self, value: Any, error: BaseException | None) -> None:
        """Resume the work with ``value`` (or raise ``error`` in it) until it waits again or ends."""
        self._went_on(partial(self.task.switch, value) if error is None else partial(self.task.throw, error))

    def _went_on(self, resume: Callable[[], Any]) -> None:
        """``resume()`` the work, then do what it asks next: wait, call, or nothing (it ended).
        Where the loop cannot take the request (a store pool shut down, a socket the loop refuses)
        the failure is raised in the work where it asked, as a blocking call would raise it there:
        the work ends (or goes on) and its greenlet is ready for the session's next work."""
        while True:
            try:
                request = resume()
            except BaseException as failure:  # the greenlet itself ended (killed): a new one next time
                request = _Finished(None, failure)
            if type(request) is _Finished:
                self._ended()
                if self.done.done():
                    pass
                elif request.error is not None:
                    self.done.set_exception(request.error)
                else:
                    self.done.set_result(request.result)
                return
            try:
                self._hand_on(request)
                return
            except Exception as failure:
                self._ended()
                resume = partial(self.task.throw, failure)

    def _hand_on(self, request: _Wait | _Call) -> None:
        """The loop to wake the work once ``request`` is answered."""
        if isinstance(request, _Wait):
            self._wait_for(request)
            return
        # the socket it reads may be closed while the call runs (a reconnect) and its number
        # given to another session's connection: the loop must not wake this work for that one
        self._stop_reading()
        called = self.loop.run_in_executor(self.threads, request.function)
        called.add_done_callback(self._called)

    def _wait_for(self, wait: _Wait) -> None:
        if wait.events & select.POLLIN and self.reading != (wait.fileno, wait.owner):
            self._stop_reading()
            self.loop.add_reader(wait.fileno, self._readable)
            self.reading = (wait.fileno, wait.owner)
        if wait.events & select.POLLOUT:
            self.loop.add_writer(wait.fileno, self._writable)
            self.writing = wait.fileno
        self.wanted = wait.events

    def _readable(self) -> None:
        if self.wanted & select.POLLIN:
            self._resume(select.POLLIN)
        else:  # nothing waits to read it now (an answer nobody asked for yet): the next wait will
            self._stop_reading()

    def _writable(self) -> None:
        self._resume(select.POLLOUT)

    def _resume(self, ready: int) -> None:
        self._stop_waiting()
        self.step(ready, None)

    def _stop_waiting(self) -> None:
        self.wanted = 0
        if self.writing is not None:
            self.loop.remove_writer(self.writing)
            self.writing = None

    def _stop_reading(self) -> None:
        if self.reading is not None:
            self.loop.remove_reader(self.reading[0])  # a socket closed meanwhile is no error
            self.reading = None

    def _ended(self) -> None:
        self._stop_waiting()
        self._stop_reading()

    def _called(self, called: asyncio.Future[Any]) -> None:
        if self.done.done():  # abandoned meanwhile
            return
        if called.cancelled():
            self.step(None, asyncio.CancelledError())
        elif called.exception() is not None:
            self.step(None, called.exception())
        else:
            self.step(called.result(), None)

    def abandon(self) -> None:
        """The caller is gone (cancelled): end the work where it waits (its connection is closed
        on the way out, a half-read answer cannot be used again)."""
        self._ended()
        while not self.task.dead:
            try:
                request = self.task.throw(asyncio.CancelledError())
            except BaseException:
                break
            if type(request) is _Finished:
                break
