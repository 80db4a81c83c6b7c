"""The agent's reused attempt threads (corral.worker.threads)."""

from __future__ import annotations

import threading
import time

from corral.worker.threads import ThreadPool


def wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_every_submitted_work_runs_at_once_even_while_others_block() -> None:
    pool = ThreadPool("t")
    release = threading.Event()
    started = []
    for index in range(5):
        pool.submit(lambda index=index: (started.append(index), release.wait(5)), f"w-{index}")
    wait_for(lambda: len(started) == 5)
    release.set()


def test_a_thread_is_reused_and_named_after_its_work_while_it_runs() -> None:
    pool = ThreadPool("t")
    seen: list[tuple[int, str]] = []
    for index in range(20):
        done = threading.Event()

        def work(done: threading.Event = done, index: int = index) -> None:
            seen.append((threading.get_ident(), threading.current_thread().name))
            done.set()

        pool.submit(work, f"job-{index}")
        assert done.wait(5)
        wait_for(lambda: pool._idle == 1)
    assert len({ident for ident, _name in seen}) == 1
    assert [name for _ident, name in seen] == [f"job-{index}" for index in range(20)]


def test_a_failing_work_does_not_end_its_thread() -> None:
    pool = ThreadPool("t")

    def fail() -> None:
        raise RuntimeError("boom")

    pool.submit(fail, "bad")
    wait_for(lambda: pool._idle == 1)
    done = threading.Event()
    pool.submit(done.set, "good")
    assert done.wait(5)
    assert pool._started == 1


def test_idle_threads_end() -> None:
    pool = ThreadPool("idle", idle_s=0.05)
    done = threading.Event()
    pool.submit(done.set, "one")
    assert done.wait(5)
    wait_for(lambda: not any(thread.name.startswith("idle-") for thread in threading.enumerate()))
    assert pool._idle == 0
    again = threading.Event()
    pool.submit(again.set, "two")
    assert again.wait(5)
