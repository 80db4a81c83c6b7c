"""Log follows share one poll per job (``server.log_watch``), and end when their attempt ends, when
their job is gone, or when their token is revoked (issue 24: 200 follows of a job that never
started polled the store 800 times a second and never ended).

The follows here are the route's own generator (``routes.logs._follow``) over a scripted store,
and the watch's pause between polls is the test's: a poll happens when the test ticks."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from functools import partial
from types import SimpleNamespace
from typing import Any

from corral.domain import errors
from corral.domain.records import Job, JobSpec
from corral.domain.status import Status
from corral.server.log_watch import SIZE_ONLY, LogWatches
from corral.server.routes import logs
from corral.store.base import LogSlice

JOB = "j-1"


class ScriptedLogs:
    """The store's ``read_log`` over a job and its attempts' output that the test changes."""

    def __init__(self) -> None:
        self.job = Job(JOB, JobSpec(command="x"), Status.PENDING, 0.0)
        self.output: dict[int, bytes] = {}
        self.gone = False
        self.reads: list[tuple[int | None, int]] = []

    def read_log(self, job_id: str, attempt: int | None, offset: int, limit: int) -> LogSlice:
        self.reads.append((attempt, offset))
        if self.gone:
            raise errors.NotFound(f"job {job_id} not found")
        which = self.job.attempts if attempt is None else attempt
        data = self.output.get(which, b"")
        start = min(offset, len(data))
        return LogSlice(self.job, which, start, len(data), 0, data[start : start + limit])

    def start(self) -> None:
        self.job = dataclasses.replace(self.job, status=Status.RUNNING, attempts=1)

    def write(self, data: bytes) -> None:
        self.output[1] = self.output.get(1, b"") + data

    def follow_reads(self) -> int:
        """Reads made by the follows themselves (not the watch's size-only polls)."""
        return sum(1 for _, offset in self.reads if offset != SIZE_ONLY)


class Harness:
    def __init__(self) -> None:
        self.store = ScriptedLogs()
        self.revision = 0
        self._ticks: asyncio.Queue[None] = asyncio.Queue()

        async def run(work: Any, function: Any, *args: Any) -> Any:
            return function(*args)

        self.state = SimpleNamespace(
            executor=SimpleNamespace(run=run), store=SimpleNamespace(logs=self.store)
        )
        self.state.log_watches = LogWatches(
            partial(logs.read_log, self.state),
            logs.FOLLOW_POLL_S,
            logs.FOLLOW_READ_BYTES,
            revision=lambda: self.revision,
            sleep=self._pause,
        )

    async def _pause(self, seconds: float) -> None:
        await self._ticks.get()

    async def tick(self) -> None:
        """Let the watch poll once more, and everyone run until they wait again."""
        self._ticks.put_nowait(None)
        await settle()

    def follow(self, authorized: Any = lambda: True) -> Follow:
        piece = self.store.read_log(JOB, None, 0, logs.FOLLOW_READ_BYTES)
        return Follow(logs._follow(self.state, JOB, None, piece, authorized))  # type: ignore[arg-type]


class Follow:
    """A follow's generator, drained by a task of its own, as the HTTP response would."""

    def __init__(self, stream: AsyncIterator[bytes]) -> None:
        self.received = b""
        self.task = asyncio.get_running_loop().create_task(self._drain(stream))

    async def _drain(self, stream: AsyncIterator[bytes]) -> None:
        async for data in stream:
            self.received += data

    @property
    def ended(self) -> bool:
        return self.task.done()


async def settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


def test_follows_of_one_job_share_one_poll_and_one_read_of_new_output():
    async def scenario() -> None:
        harness = Harness()
        store = harness.store
        follows = [harness.follow() for _ in range(100)]
        await settle()
        reads = len(store.reads)
        for _ in range(5):
            await harness.tick()
        assert len(store.reads) - reads == 5, "one poll a tick, whatever the number of follows"
        assert not any(follow.ended for follow in follows)

        store.start()
        store.write(b"hello\n")
        await harness.tick()
        assert all(follow.received == b"hello\n" for follow in follows)
        reads = len(store.reads)
        store.write(b"world\n")
        await harness.tick()
        assert len(store.reads) - reads == 2, "the poll and one read of the new bytes, for all"
        assert all(follow.received == b"hello\nworld\n" for follow in follows)

        store.write(b"bye\n")
        store.job = dataclasses.replace(store.job, status=Status.DONE)
        await harness.tick()
        assert all(follow.ended and follow.received == b"hello\nworld\nbye\n" for follow in follows)
        assert harness.state.log_watches.watches == {}

    asyncio.run(scenario())


def test_an_idle_follow_is_not_woken_by_polls_that_find_nothing():
    async def scenario() -> None:
        harness = Harness()
        harness.store.start()
        harness.store.write(b"x")
        follow = harness.follow()
        await settle()
        reads = harness.store.follow_reads()
        for _ in range(10):
            await harness.tick()
        assert harness.store.follow_reads() == reads
        assert follow.received == b"x" and not follow.ended
        follow.task.cancel()
        await settle()

    asyncio.run(scenario())


def test_a_follow_ends_when_its_token_is_revoked():
    async def scenario() -> None:
        harness = Harness()
        allowed = {"alice": True, "bob": True}
        alice = harness.follow(lambda: allowed["alice"])
        bob = harness.follow(lambda: allowed["bob"])
        await harness.tick()
        allowed["bob"] = False
        harness.revision += 1  # the token file changed
        await harness.tick()
        assert bob.ended and bob.task.exception() is None
        assert not alice.ended
        alice.task.cancel()
        await settle()

    asyncio.run(scenario())


def test_a_follow_ends_cleanly_when_its_job_is_removed():
    async def scenario() -> None:
        harness = Harness()
        waiting = harness.follow()
        harness.store.start()
        harness.store.write(b"partial")
        running = harness.follow()
        await harness.tick()
        harness.store.gone = True
        await harness.tick()
        for follow in (waiting, running):
            assert follow.ended and follow.task.exception() is None
        assert running.received == b"partial"

    asyncio.run(scenario())


def test_a_follow_of_a_job_cancelled_before_it_started_ends():
    async def scenario() -> None:
        harness = Harness()
        follow = harness.follow()
        await harness.tick()
        harness.store.job = dataclasses.replace(harness.store.job, status=Status.CANCELLED)
        await harness.tick()
        assert follow.ended and follow.received == b""

    asyncio.run(scenario())


def test_a_chunk_stored_through_this_server_nudges_the_watch_to_poll_without_waiting_its_pause():
    async def scenario() -> None:
        harness = Harness()
        harness.store.start()
        follow = harness.follow()
        await harness.tick()
        harness.store.write(b"line\n")
        await settle()
        assert follow.received == b"", "no tick, no nudge: the watch still waits its pause"
        harness.state.log_watches.nudge(JOB)
        await settle()
        assert follow.received == b"line\n"
        harness.state.log_watches.nudge("j-unfollowed")  # a job nobody follows: nothing to do
        follow.task.cancel()
        await settle()

    asyncio.run(scenario())
