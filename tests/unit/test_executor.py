"""The server's executor (``corral.server.executor``): each placement rule, proved with a fake store
and fake child processes. Each piece of work records where it ran: on the event loop's thread, a
store thread, a loop's lane, a thread of its own, or a child; and the switch interval it ran with."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from corral.server.executor import Place, StoreExecutor, Work, places
from corral.server.grouped import Batch
from corral.server.offload import OffloadGone
from corral.store.base import WouldWait

SHORT_S = 0.0003


class FakeStore:
    """Takes work inline unless told it would wait; counts the tries."""

    def __init__(self, would_wait: bool = False) -> None:
        self.would_wait = would_wait
        self.inline_tries = 0

    def run_inline(self, work: Callable[[], Any]) -> Any:
        self.inline_tries += 1
        if self.would_wait:
            raise WouldWait("a lock is in the way")
        return work()


class FakeChild:
    """A child process: records each call and the thread that waited for it; gone when told."""

    def __init__(self, gone: bool = False) -> None:
        self.gone = gone
        self.calls: list[tuple[Any, tuple[Any, ...], str]] = []

    def call(self, function: Any, *args: Any) -> Any:
        self.calls.append((function, args, threading.current_thread().name))
        if self.gone:
            raise OffloadGone("the child ended")
        return ("child", function(None, {}, *args))


def where(*args: Any) -> tuple[str, float, tuple[Any, ...]]:
    """The thread this ran on, the switch interval it ran with, what it was given."""
    return threading.current_thread().name, sys.getswitchinterval(), args


def standalone(
    store: Any, memory: dict[str, Any], *args: Any, **kwargs: Any
) -> tuple[str, Any, tuple[Any, ...]]:
    memory["calls"] = memory.get("calls", 0) + 1
    return threading.current_thread().name, (store, memory["calls"]), args


def executor(
    store: FakeStore | None = None,
    threads: int = 2,
    planner: FakeChild | None = None,
    reader: FakeChild | None = None,
) -> StoreExecutor[str]:
    return StoreExecutor(
        store or FakeStore(),
        "the context",
        threads=threads,
        switch_interval_s=SHORT_S,
        planner=planner,  # type: ignore[arg-type]
        reader=reader,  # type: ignore[arg-type]
    )


def run(work: Callable[[], Any]) -> Any:
    """``work()`` awaited on a fresh event loop, with the loop thread's name."""

    async def main() -> Any:
        return await work()

    return asyncio.run(main())


LOOP = threading.current_thread().name  # asyncio.run runs the loop on this thread
NORMAL_S = sys.getswitchinterval()
SHORT = min(SHORT_S, NORMAL_S)


# --- the rules, as a table -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("work", "on_loop", "threads", "children", "expected"),
    [
        (Work.SHORT, True, True, False, (Place.INLINE_UNLESS_WAIT, Place.STORE_THREAD)),
        (Work.SHORT, True, False, False, (Place.INLINE,)),
        (Work.SHORT, False, True, False, (Place.INLINE,)),
        (Work.STORE, True, True, False, (Place.STORE_THREAD,)),
        (Work.STORE, True, False, False, (Place.INLINE,)),
        (Work.LONG, True, True, False, (Place.STORE_THREAD,)),
        (Work.LONG, False, True, False, (Place.INLINE,)),
        (Work.READ, True, True, True, (Place.READER, Place.STORE_THREAD)),
        (Work.READ, True, True, False, (Place.STORE_THREAD,)),
        (Work.READ, False, True, True, (Place.READER, Place.INLINE)),
        (Work.WRITE, True, True, True, (Place.WRITER,)),
        (Work.WRITE, True, True, False, (Place.STORE_THREAD,)),
        (Work.WRITE, False, True, True, (Place.WRITER,)),
        (Work.WRITE, False, True, False, (Place.INLINE,)),
        (Work.PLAN, False, True, True, (Place.PLANNER,)),
        (Work.PLAN, False, True, False, (Place.INLINE,)),
        (Work.PROBE, True, False, False, (Place.OWN_THREAD,)),
        (Work.PROBE, False, True, False, (Place.INLINE,)),
    ],
)
def test_where_each_kind_of_work_runs(
    work: Work, on_loop: bool, threads: bool, children: bool, expected: tuple[Place, ...]
) -> None:
    assert (
        places(work, on_loop=on_loop, threads=threads, planner=children, reader=children, writer=children)
        == expected
    )


# --- the rules, applied ----------------------------------------------------------------------


def test_short_work_runs_on_the_event_loop_when_the_store_need_not_wait() -> None:
    store = FakeStore()
    thread, interval, args = run(lambda: executor(store).run(Work.SHORT, where, 1, 2))
    assert (thread, interval, args, store.inline_tries) == (LOOP, NORMAL_S, (1, 2), 1)


def test_short_work_the_store_would_make_wait_goes_to_a_store_thread_with_the_short_interval() -> None:
    store = FakeStore(would_wait=True)
    thread, interval, _ = run(lambda: executor(store).run(Work.SHORT, where))
    assert thread.startswith("corral-store") and interval == SHORT
    assert store.inline_tries == 1


def test_without_store_threads_everything_of_the_loops_runs_on_it() -> None:
    store = FakeStore(would_wait=True)
    for work in (Work.SHORT, Work.STORE, Work.LONG):
        thread, _, _ = run(lambda work=work: executor(store, threads=0).run(work, where))
        assert thread == LOOP, work
    assert store.inline_tries == 0, "not tried through run_inline: there is no thread to fall back on"


def test_store_work_runs_on_a_store_thread_with_the_interpreters_interval() -> None:
    thread, interval, _ = run(lambda: executor().run(Work.STORE, where))
    assert thread.startswith("corral-store") and interval == NORMAL_S


def test_long_work_runs_on_a_store_thread_with_the_short_interval() -> None:
    thread, interval, _ = run(lambda: executor().run(Work.LONG, where))
    assert thread.startswith("corral-store") and interval == SHORT
    assert sys.getswitchinterval() == NORMAL_S, "the interpreter's own again after it"


def test_a_read_goes_to_the_reader_process_waited_for_on_a_store_thread() -> None:
    reader = FakeChild()
    answer = run(lambda: executor(reader=reader).run(Work.READ, standalone, "page", limit=5))
    assert answer[0] == "child"
    [(function, args, waited_on)] = reader.calls
    assert args == ("page",) and function.keywords == {"limit": 5}, "keywords travel bound to the function"
    assert waited_on.startswith("corral-store")


def test_a_read_the_reader_could_not_do_runs_as_long_work_with_the_store() -> None:
    store, reader = FakeStore(), FakeChild(gone=True)
    thread, (given, _), args = run(lambda: executor(store, reader=reader).run(Work.READ, standalone, 7))
    assert len(reader.calls) == 1
    assert thread.startswith("corral-store") and given is store and args == (7,)


def test_without_a_reader_a_read_runs_as_long_work() -> None:
    store = FakeStore()
    thread, (given, _), _ = run(lambda: executor(store).run(Work.READ, standalone))
    assert thread.startswith("corral-store") and given is store


def test_the_plan_goes_to_the_planner_and_a_planner_gone_fails_the_pass() -> None:
    planner = FakeChild()
    assert executor(planner=planner).call(Work.PLAN, standalone, 1)[0] == "child"
    assert planner.calls[0][2] == LOOP, "waited for on the caller's thread"
    with pytest.raises(OffloadGone):
        executor(planner=FakeChild(gone=True)).call(Work.PLAN, standalone, 1)


def test_without_a_planner_the_plan_runs_on_the_callers_thread_with_a_memory_kept() -> None:
    store = FakeStore()
    running = executor(store)
    first = running.call(Work.PLAN, standalone)
    second = running.call(Work.PLAN, standalone)
    assert first[0] == LOOP and first[1] == (store, 1) and second[1] == (store, 2)


def test_the_probe_runs_on_a_thread_of_its_own() -> None:
    thread, _, _ = run(lambda: executor().run(Work.PROBE, where))
    assert thread != LOOP and not thread.startswith("corral-store")


def test_from_a_pass_work_runs_on_the_passs_thread() -> None:
    store = FakeStore(would_wait=True)
    for work in (Work.SHORT, Work.STORE, Work.LONG, Work.PROBE):
        assert executor(store).call(work, where)[0] == LOOP, work
    assert store.inline_tries == 0


def test_a_loop_pass_runs_on_its_loops_lane_with_the_short_interval() -> None:
    running = executor()

    async def two_passes() -> list[Any]:
        passes = [await running.run_pass("reaper", where), await running.run_pass("reaper", where)]
        await running.close()
        return passes

    (first, interval, _), (second, _, _) = run(two_passes)
    assert first == second and first.startswith("corral-loop-reaper") and interval == SHORT


def test_the_items_of_one_turn_are_one_group_placed_as_short_work() -> None:
    store = FakeStore()
    seen: list[tuple[str, list[int], str]] = []

    def apply_many(context: str, items: list[int]) -> list[int | BaseException]:
        seen.append((context, items, threading.current_thread().name))
        return [item * 10 for item in items]

    def apply_one(context: str, item: int) -> int:
        raise AssertionError("a turn of three is one group")

    tens: Batch[str, int, int] = Batch("tens", apply_many, apply_one, max_group=8)
    running = executor(store)

    async def turn() -> list[int]:
        return list(await asyncio.gather(*(running.grouped(tens, item) for item in (1, 2, 3))))

    assert run(turn) == [10, 20, 30]
    assert seen == [("the context", [1, 2, 3], LOOP)] and store.inline_tries == 1


# --- admission (``store_gate``) ------------------------------------------------------------------


def test_work_handed_to_a_store_thread_runs_what_the_admission_said_first_there():
    """The admission is asked on the event loop as the work is handed over (where the request's
    context is), and what it returned runs on the store thread first: raising, it refuses the
    work, which never runs. Inline work, which waits for nothing, is not asked about."""
    ran: list[str] = []
    pool = executor(FakeStore(would_wait=True))
    refusing = {"now": False}
    asked: list[str] = []

    def admit() -> None:
        ran.append(f"admit on {threading.current_thread().name}")
        if refusing["now"]:
            raise RuntimeError("refused when its turn came")

    def admission() -> Callable[[], None] | None:
        asked.append(threading.current_thread().name)
        return admit

    pool.admission = admission

    def work() -> str:
        ran.append(f"work on {threading.current_thread().name}")
        return "done"

    assert run(lambda: pool.run(Work.STORE, work)) == "done"
    assert asked == [LOOP]
    assert [line.split(" on ")[0] for line in ran] == ["admit", "work"]
    assert all("corral-store" in line for line in ran)
    refusing["now"] = True
    ran.clear()
    with pytest.raises(RuntimeError, match="refused"):
        run(lambda: pool.run(Work.SHORT, work))  # would wait inline: on a store thread
    assert [line.split(" on ")[0] for line in ran] == ["admit"]
    inline = executor(FakeStore(would_wait=False))
    inline.admission = admission
    assert run(lambda: inline.run(Work.SHORT, work)) == "done"
    assert len(asked) == 2  # the inline run was not asked about


# --- a store whose waits the loop makes (PostgreSQL: ``store.on_loop``) ------------------------


class LoopWaitingStore(FakeStore):
    """A store whose short work runs on the event loop in a session (``waits_on_loop``)."""

    waits_on_loop = True


def on_loop_executor(store: FakeStore) -> StoreExecutor[str]:
    return StoreExecutor(store, "the context", threads=2, switch_interval_s=SHORT_S, store_on_loop=True)


def test_short_work_of_a_store_whose_waits_the_loop_makes_runs_on_the_loop_in_a_session() -> None:
    from corral.store import on_loop

    store = LoopWaitingStore(would_wait=True)  # never tried inline: no ``run_inline`` round

    def in_session() -> tuple[str, bool]:
        return threading.current_thread().name, on_loop.session() is not None

    assert run(lambda: on_loop_executor(store).run(Work.SHORT, in_session)) == (LOOP, True)
    assert store.inline_tries == 0


def test_while_long_work_runs_beside_the_loop_short_work_goes_to_a_store_thread() -> None:
    from corral.server import switching

    store = LoopWaitingStore(would_wait=True)
    with switching.long_work(SHORT_S):  # a loop pass on its lane, a list on a store thread
        thread, interval, _ = run(lambda: on_loop_executor(store).run(Work.SHORT, where))
    assert thread.startswith("corral-store") and interval == SHORT


def test_a_short_call_on_a_store_thread_is_not_long_work_beside_the_loop() -> None:
    from corral.server import switching

    with switching.long_work(SHORT_S, short_call=True):
        assert not switching.long_work_beside()
        with switching.long_work(SHORT_S):
            assert switching.long_work_beside()
    assert not switching.long_work_beside()


class WatchedChild(FakeChild):
    """A reader process whose work waits until the test lets it go, saying meanwhile whether long
    work ran beside the loop and with which switch interval."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.seen: list[tuple[bool, float]] = []

    def call(self, function: Any, *args: Any) -> Any:
        from corral.server import switching

        self.seen.append((switching.long_work_beside(), sys.getswitchinterval()))
        self.entered.set()
        assert self.release.wait(30), "the test never let the read go"
        return super().call(function, *args)


def test_a_read_in_the_reader_process_is_no_long_work_beside_the_loop() -> None:
    """A list built by the reader process runs no Python of this process while the store thread
    waits for it: short work stays on the loop meanwhile, with the interpreter's own interval (the
    list's duration must not send every heartbeat to the store threads)."""
    from corral.store import on_loop

    reader = WatchedChild()
    store = LoopWaitingStore(would_wait=True)
    chosen = StoreExecutor(
        store, "the context", threads=2, switch_interval_s=SHORT_S, reader=reader, store_on_loop=True
    )  # type: ignore[arg-type]

    def in_session() -> tuple[str, bool, float]:
        return threading.current_thread().name, on_loop.session() is not None, sys.getswitchinterval()

    async def main() -> tuple[Any, tuple[str, bool, float]]:
        listing = asyncio.ensure_future(chosen.run(Work.READ, standalone, "page"))
        assert await asyncio.to_thread(reader.entered.wait, 30)
        try:
            beside = await chosen.run(Work.SHORT, in_session)
        finally:
            reader.release.set()
        return await listing, beside

    answer, beside = run(main)
    assert answer[0] == "child"
    assert reader.seen == [(False, NORMAL_S)]
    assert beside == (LOOP, True, NORMAL_S)
