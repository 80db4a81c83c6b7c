"""Synchronous store work run on the event loop (``corral.store.on_loop``), its socket waits the
loop's: proved with a socket pair standing in for the database's connection. The work's waits let
the loop go on; a socket that never answers fails the work, not the loop; a blocking call goes to a
thread; a caller that goes away ends the work where it waits; sessions are handed out in turn."""

from __future__ import annotations

import asyncio
import select
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from corral.domain import errors
from corral.store import on_loop

pytestmark = pytest.mark.skipif(not on_loop.available(), reason="greenlet is not installed")

#: a wait bound no test runs into, except the one about a socket that never answers
PATIENT_S = 60.0


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
        running = asyncio.ensure_future(on_loop.run(work, on_loop.Session(), threads, PATIENT_S))
        await asyncio.sleep(0)  # the work starts and waits
        await other()
        return await running

    answer, thread, readable = asyncio.run(main())
    assert (answer, readable) == (b"answer", True)
    assert thread == threading.main_thread().name  # the loop's own thread: no crossing
    assert seen == ["work sent", "other ran"]


def test_a_socket_that_never_answers_fails_the_work_with_store_unavailable(pair, threads) -> None:
    ours, _ = pair
    cleaned: list[str] = []

    def work() -> None:
        try:
            on_loop.wait_socket(ours.fileno(), select.POLLIN, ours)
        except errors.StoreUnavailable:
            cleaned.append("the work saw the failure where it waited")  # its connection is closed there
            raise

    async def main() -> int:
        served = 0
        running = asyncio.ensure_future(on_loop.run(work, on_loop.Session(), threads, 0.2))
        while not running.done():  # the loop goes on meanwhile
            served += 1
            await asyncio.sleep(0.01)
        with pytest.raises(errors.StoreUnavailable):
            await running
        return served

    assert asyncio.run(main()) > 1
    assert cleaned == ["the work saw the failure where it waited"]


def test_a_blocking_call_runs_on_a_store_thread_and_its_result_comes_back(threads) -> None:
    def work() -> tuple[str, str]:
        elsewhere = on_loop.off_loop(lambda: threading.current_thread().name)
        return elsewhere, threading.current_thread().name

    elsewhere, here = asyncio.run(on_loop.run(work, on_loop.Session(), threads, PATIENT_S))
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

    assert asyncio.run(on_loop.run(work, on_loop.Session(), threads, PATIENT_S)) == "caught: cannot connect"


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
        running = asyncio.ensure_future(on_loop.run(waits_forever, session, threads, PATIENT_S))
        await asyncio.sleep(0)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        return await on_loop.run(lambda: "next work", session, threads, PATIENT_S)

    assert asyncio.run(main()) == "next work"
    assert ended == ["cancelled where it waited"]


def test_the_session_is_the_works_own_and_none_outside_work_on_the_loop(threads) -> None:
    session = on_loop.Session()
    assert on_loop.session() is None
    assert asyncio.run(on_loop.run(on_loop.session, session, threads, PATIENT_S)) is session


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
