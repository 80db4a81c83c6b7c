"""One store poll per followed job, shared by all of its follows (``GET /jobs/{id}/logs?follow=1``).

A follow used to poll the store itself every 0.25 s: 200 follows of a job that never started took
76% of a core, each polling for nothing. Now the first follow of a job starts a ``JobWatch``: one
task that reads the job and the size of its latest attempt's log every ``poll_s`` and publishes
what changed; every follow of the job waits on it and wakes only when there is something for it:

- the log grew past what the follow sent (the watch also reads the new bytes once, ``chunk``, so
  that follows at the same place take them without a store read of their own);
- the attempt ended (the job moved on to another attempt, or stopped running): the follow sends
  what is left and ends;
- the job is gone (removed by retention): the follow ends;
- the token file changed (``revision``): each follow checks that its token still stands for its
  caller, and ends when it does not.

A chunk a worker appends through this server nudges its job's watch (``nudge``): it polls at once
instead of at the end of its pause, so a follow on the same server sees a line about as soon as it
is stored; a follow on another replica sees it at that replica's next poll.

A watch stops polling once its job is terminal (nothing changes after that) and when its last
follow leaves; a follow of it later starts it again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from corral.domain import errors
from corral.domain.status import TERMINAL
from corral.store.base import LogSlice

logger = logging.getLogger("corral.server.logs")

#: read ``(job_id, attempt or None for the latest, offset, limit)`` of a job's log
ReadLog = Callable[[str, int | None, int, int], Awaitable[LogSlice]]
#: an offset past any log's end: a read from it answers the job and the sizes, no bytes
SIZE_ONLY = 2**62


@dataclass(eq=False)
class JobWatch:
    """What the last poll of one job saw; ``version`` moves at each change worth a look."""

    job_id: str
    #: the job and its latest attempt's log size (no bytes), as last read; None before the first poll
    latest: LogSlice | None = None
    #: the bytes the log grew by at the last change (its ``start`` is the size before)
    chunk: LogSlice | None = None
    #: the job is unknown to the store (removed by retention)
    gone: bool = False
    version: int = 0
    followers: int = 0
    task: asyncio.Task[None] | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    #: set by ``LogWatches.nudge``: the job's log grew here, poll now
    nudged: asyncio.Event = field(default_factory=asyncio.Event)

    def publish(self) -> None:
        self.version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def changed_after(self, version: int) -> None:
        """Return once the watch has published past ``version``."""
        if self.version == version:
            await self._changed.wait()


class LogWatches:
    """The watches of the jobs being followed on this server (event loop only)."""

    def __init__(
        self,
        read: ReadLog,
        poll_s: float,
        chunk_bytes: int,
        revision: Callable[[], int] = lambda: 0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``revision``: the token file's (``auth.TokenFile.revision``); ``sleep``: the pause
        between polls (a test's, to poll when it says)."""
        self.sleep = sleep
        self.read = read
        self.poll_s = poll_s
        self.chunk_bytes = chunk_bytes
        self.revision = revision
        self.watches: dict[str, JobWatch] = {}

    def subscribe(self, job_id: str) -> JobWatch:
        watch = self.watches.get(job_id)
        if watch is None:
            watch = self.watches[job_id] = JobWatch(job_id)
        watch.followers += 1
        if watch.task is None or watch.task.done():
            watch.task = asyncio.get_running_loop().create_task(self._poll(watch))
        return watch

    def unsubscribe(self, watch: JobWatch) -> None:
        watch.followers -= 1
        if watch.followers == 0 and self.watches.get(watch.job_id) is watch:
            del self.watches[watch.job_id]  # its poll ends after its current pass

    def nudge(self, job_id: str) -> None:
        """The job's log grew (a chunk was stored through this server): its watch, if any, polls
        now rather than at the end of its pause."""
        watch = self.watches.get(job_id)
        if watch is not None:
            watch.nudged.set()

    async def _pause(self, watch: JobWatch) -> None:
        """Wait ``poll_s``, or less when the watch is nudged meanwhile."""
        if not watch.nudged.is_set():
            pause = asyncio.ensure_future(self.sleep(self.poll_s))
            nudged = asyncio.ensure_future(watch.nudged.wait())
            try:
                await asyncio.wait((pause, nudged), return_when=asyncio.FIRST_COMPLETED)
            finally:
                pause.cancel()
                nudged.cancel()
        watch.nudged.clear()

    async def close(self) -> None:
        """Stop every poll (the server is stopping)."""
        tasks = [watch.task for watch in self.watches.values() if watch.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _poll(self, watch: JobWatch) -> None:
        revision = self.revision()
        while watch.followers:
            try:
                latest = await self.read(watch.job_id, None, SIZE_ONLY, 0)
            except errors.NotFound:
                watch.gone = True
                watch.publish()
                return
            except Exception:
                logger.warning("a log watch could not read its job", exc_info=True)
                await self.sleep(self.poll_s)
                continue
            previous = watch.latest
            changed = previous is None or _state(previous) != _state(latest)
            if changed and previous is not None and latest.attempt == previous.attempt:
                watch.chunk = await self._chunk(watch.job_id, latest.attempt, previous.size)
            watch.latest = latest
            now = self.revision()
            if changed or now != revision:
                revision = now
                watch.publish()
            if latest.job.status in TERMINAL:
                return
            await self._pause(watch)

    async def _chunk(self, job_id: str, attempt: int, offset: int) -> LogSlice | None:
        try:
            return await self.read(job_id, attempt, offset, self.chunk_bytes)
        except Exception:
            return None  # each follow reads for itself


def _state(piece: LogSlice) -> tuple[object, ...]:
    """What a follow acts on: the job's status and attempts, and its latest attempt's log."""
    return (piece.job.status, piece.job.attempts, piece.attempt, piece.size, piece.dropped)
