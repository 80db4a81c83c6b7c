"""Synchronous store work run on the event loop (``corral.store.on_loop``), its socket waits the
loop's: proved with a socket pair standing in for the database's connection. The work's waits let
the loop go on; a socket that never answers holds up its work alone, as on a store thread (no bound
of its own that could give up on work the database still commits); a blocking call goes to a
thread; a caller that goes away ends the work where it waits; a request the loop cannot take fails
the work, not its session; sessions are handed out in turn."""

from __future__ import annotations

import asyncio
import select
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

from corral.domain import errors
from corral.store import on_loop

pytestmark = pytest.mark.skipif(not on_loop.available(), reason="greenlet is not installed")

T = TypeVar("T")


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """The work's end (``ours``) and the database's end of a connection."""
    ours, theirs = socket.socketpair()
    yield ours, theirs
    ours.close()
    theirs.close()


@pytest.fixture
def threads() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(2, thread_name_prefix="test-store")
    yield pool
    pool.shutdown()


def test_a_wait_lets_the_loop_serve_others_and_the_work_goes_on_when_the_socket_is_ready(
    pair, threads
) -> None:
    ours, theirs = pair
    seen: list[str] = []

    def work() -> tuple[bytes, str, bool]:
        seen.append("work sent")
        ready = on_loop.wait_socket(ours.fileno(), select.POLLIN, ours)
        return ours.recv(16), threading.current_thread().name, bool(ready & select.POLLIN)

    async def other() -> None:
        seen.append("other ran")  # only while the work waits: it runs until then without a pause
        theirs.send(b"answer")

    async def main() -> tuple[bytes, str, bool]:
        running = asyncio.ensure_future(on_loop.run(work, on_loop.Session(), threads))
        await asyncio.sleep(0)  # the work starts and waits
        await other()
        return await running

    answer, thread, readable = asyncio.run(main())
    assert (answer, readable) == (b"answer", True)
    assert thread == threading.main_thread().name  # the loop's own thread: no crossing
    assert seen == ["work sent", "other ran"]


def test_a_socket_that_never_answers_holds_up_its_work_alone_until_its_caller_goes(pair, threads) -> None:
    ours, _ = pair
    ended: list[str] = []

    def work() -> None:
        try:
            on_loop.wait_socket(ours.fileno(), select.POLLIN, ours)
        except asyncio.CancelledError:
            ended.append("cancelled where it waited")
            raise

    async def main() -> int:
        served = 0
        running = asyncio.ensure_future(on_loop.run(work, on_loop.Session(), threads))
        while served < 50:  # the loop goes on meanwhile, and the work still waits: no bound of its own
            served += 1
            await asyncio.sleep(0.01)
        assert not running.done()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        return served

    assert asyncio.run(main()) == 50
    assert ended == ["cancelled where it waited"]


def test_a_blocking_call_runs_on_a_store_thread_and_its_result_comes_back(threads) -> None:
    def work() -> tuple[str, str]:
        elsewhere = on_loop.off_loop(lambda: threading.current_thread().name)
        return elsewhere, threading.current_thread().name

    elsewhere, here = asyncio.run(on_loop.run(work, on_loop.Session(), threads))
    assert elsewhere.startswith("test-store")
    assert here == threading.main_thread().name


def test_an_exception_of_a_blocking_call_is_raised_in_the_work(threads) -> None:
    def failing() -> None:
        raise errors.StoreUnavailable("cannot connect")

    def work() -> str:
        try:
            on_loop.off_loop(failing)
        except errors.StoreUnavailable as error:
            return f"caught: {error}"
        return "not raised"

    assert asyncio.run(on_loop.run(work, on_loop.Session(), threads)) == "caught: cannot connect"


def test_a_caller_cancelled_ends_the_work_where_it_waits_and_the_session_serves_the_next(
    pair, threads
) -> None:
    ours, _ = pair
    ended: list[str] = []
    session = on_loop.Session()

    def waits_forever() -> None:
        try:
            on_loop.wait_socket(ours.fileno(), select.POLLIN, ours)
        except asyncio.CancelledError:
            ended.append("cancelled where it waited")
            raise

    async def main() -> str:
        running = asyncio.ensure_future(on_loop.run(waits_forever, session, threads))
        await asyncio.sleep(0)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        return await on_loop.run(lambda: "next work", session, threads)

    assert asyncio.run(main()) == "next work"
    assert ended == ["cancelled where it waited"]


def test_the_session_is_the_works_own_and_none_outside_work_on_the_loop(threads) -> None:
    session = on_loop.Session()
    assert on_loop.session() is None
    assert asyncio.run(on_loop.run(on_loop.session, session, threads)) is session


def test_outside_work_on_the_loop_a_wait_blocks_here_as_before(pair) -> None:
    ours, theirs = pair
    theirs.send(b"x")
    assert on_loop.wait_socket(ours.fileno(), select.POLLIN) & select.POLLIN
    assert on_loop.off_loop(lambda: threading.current_thread().name) == threading.current_thread().name


def test_work_that_finds_every_session_taken_waits_for_the_first_given_back() -> None:
    async def main() -> list[str]:
        sessions = on_loop.Sessions(1)
        first = await sessions.take()
        order: list[str] = []

        async def second() -> None:
            taken = await sessions.take()
            order.append("second took it")
            assert taken is first  # the same session (and connection), handed on
            sessions.give_back(taken)

        waiting = asyncio.ensure_future(second())
        await asyncio.sleep(0)
        order.append("first gives it back")
        sessions.give_back(first)
        await waiting
        return order

    assert asyncio.run(main()) == ["first gives it back", "second took it"]


def run_on(loop_kind: str, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``main()`` on asyncio's own loop or uvloop's (the server's, where installed)."""
    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
        with runner:
            return runner.run(main())
    return asyncio.run(main())


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_socket_closed_in_work_that_goes_on_leaves_no_reader_for_the_next_socket_of_its_number(
    loop_kind: str, threads: ThreadPoolExecutor
) -> None:
    """A work that closed the connection it read (a statement failed with the connection lost)
    and goes on (a reconnect on a store thread): another session's socket given the same number
    is woken when its answer comes, not left to the first work's stale reader."""
    first_ours, first_theirs = socket.socketpair()
    go_on = threading.Event()
    freed: list[int] = []

    async def main() -> bytes:
        closed = asyncio.Event()

        def closes_and_reconnects() -> str:
            first_theirs.send(b"x")
            on_loop.wait_socket(first_ours.fileno(), select.POLLIN, first_ours)  # reading it, kept
            first_ours.recv(1)
            freed.append(first_ours.fileno())
            first_ours.close()
            closed.set()  # on the loop's thread: the work runs there
            on_loop.off_loop(lambda: go_on.wait(30))  # the reconnect
            return "first"

        first = asyncio.ensure_future(on_loop.run(closes_and_reconnects, on_loop.Session(), threads))
        await closed.wait()
        pair = socket.socketpair()
        (mine,) = [end for end in pair if end.fileno() == freed[0]]
        (peer,) = [end for end in pair if end is not mine]

        def reads() -> bytes:
            on_loop.wait_socket(mine.fileno(), select.POLLIN, mine)
            return mine.recv(16)

        try:
            second = asyncio.ensure_future(on_loop.run(reads, on_loop.Session(), threads))
            await asyncio.sleep(0)  # it waits to read
            peer.send(b"answer")
            done, _ = await asyncio.wait([second], timeout=10)
            assert done, "the second session was never woken"
            return await second
        finally:
            go_on.set()
            assert await first == "first"
            first_theirs.close()
            for end in pair:
                end.close()

    assert run_on(loop_kind, main) == b"answer"


def test_a_blocking_call_the_loop_cannot_hand_on_fails_the_work_and_its_session_serves_the_next() -> None:
    """The store threads shut down (the server stopping): the work's call raises where it was
    made, and the session's greenlet is back where the next work starts, not in the old frame."""
    session = on_loop.Session()
    gone = ThreadPoolExecutor(1)
    gone.shutdown()
    resumed: list[object] = []

    def connects() -> str:
        resumed.append(on_loop.off_loop(lambda: "a connection"))
        return "connected"

    async def main() -> str:
        with pytest.raises(RuntimeError, match="shutdown"):
            await on_loop.run(connects, session, gone)
        with ThreadPoolExecutor(1) as live:
            return await on_loop.run(lambda: "next work", session, live)

    assert asyncio.run(main()) == "next work"
    assert resumed == []


def test_a_socket_the_loop_refuses_to_watch_fails_the_work_where_it_waits(threads) -> None:
    session = on_loop.Session()
    seen: list[str] = []

    def waits_on_no_socket() -> None:
        try:
            on_loop.wait_socket(-1, select.POLLIN)
        except ValueError:
            seen.append("raised where it waited")
            raise

    async def main() -> str:
        with pytest.raises(ValueError):
            await on_loop.run(waits_on_no_socket, session, threads)
        return await on_loop.run(lambda: "next work", session, threads)

    assert asyncio.run(main()) == "next work"
    assert seen == ["raised where it waited"]
