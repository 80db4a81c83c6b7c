"""The output of one or many jobs as lines of text: what ``JobHandle.logs()`` and the merged
``GangHandle.logs()`` / ``ArrayHandle.logs()`` of the SDK (``corral.handles``) yield.

One reader follows every task in turns instead of a thread per task: an array of 10,000 tasks, most
of them waiting, would otherwise hold 10,000 threads and their connections. Each round:

1. reads the tasks' jobs (one request for a gang or an array page, one per job otherwise), *before*
   their output, so that a task seen ended has stored all its output by the time it is read (a
   worker sends the rest of an attempt's output before its final report);
2. reads each started task's new bytes of its attempt (``GET /jobs/{id}/logs?attempt=&offset=``,
   page after page while more is stored), and yields the whole lines, each after the task's prefix
   (``[rank 1] ``); a task's unfinished line waits for its end, so tasks never interleave within a
   line;
3. ends a task once its attempt has ended (the job moved to another attempt or stopped running),
   yielding its last unfinished line; ends when every task has.

Without ``follow`` it is one round in which every task counts as ended: the output stored so far.
A task is read at the attempt asked for, else at its latest attempt when first seen started (a
follow of a task not started yet waits for its first attempt); like ``corral logs -f``, a follow
ends with that attempt, not with a retry after it. Bytes the server dropped (past
``CORRAL_LOG_MAX_BYTES``, the oldest first) are skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.connection import LogChunk
    from corral.protocol.answers import JobAnswer

#: statuses in which an attempt may still write (API.md: its lease is held)
_WRITING = frozenset({"running", "preempting"})
_ENDED = frozenset({"done", "failed", "cancelled"})

#: reads ``GET /jobs/{id}/logs``: (job id, attempt or None for the latest, offset) -> chunk
ReadLog = Callable[[str, "int | None", int], "LogChunk"]
#: the tasks to read, each as its job (read fresh) and the prefix of its lines
ReadTasks = Callable[[], "list[tuple[JobAnswer, str]]"]


class _Stream:
    """Where the reading of one task's output stands."""

    __slots__ = ("attempt", "ended", "offset", "partial", "prefix")

    def __init__(self, prefix: str, attempt: int | None) -> None:
        self.prefix = prefix
        self.attempt = attempt
        self.offset = 0
        self.partial = b""
        self.ended = False

    def lines(self, data: bytes) -> list[str]:
        """The whole lines ``data`` completes; the rest waits for more."""
        *whole, self.partial = (self.partial + data).split(b"\n")
        return [self.prefix + line.decode("utf-8", errors="replace") for line in whole]

    def end(self) -> list[str]:
        self.ended = True
        rest, self.partial = self.partial, b""
        return [self.prefix + rest.decode("utf-8", errors="replace")] if rest else []


def lines(
    read_tasks: ReadTasks, read_log: ReadLog, attempt: int | None, follow: bool, poll_s: float
) -> Iterator[str]:
    """The tasks' output as lines without their newline, each after its task's prefix (see the
    module doc for the order and when it ends)."""
    streams: dict[str, _Stream] = {}
    while True:
        tasks = read_tasks()
        for job, prefix in tasks:
            stream = streams.setdefault(job.id, _Stream(prefix, attempt))
            if not stream.ended:
                yield from _read(stream, job, read_log, follow)
        if not follow or all(streams[job.id].ended for job, _ in tasks):
            return
        time.sleep(poll_s)


def _read(stream: _Stream, job: JobAnswer, read_log: ReadLog, follow: bool) -> Iterator[str]:
    """One round of one task: its new lines, and its last one once its attempt has ended. ``job``
    was read before the bytes (see the module doc)."""
    if job.attempt == 0:  # never started
        if not follow or job.status in _ENDED:
            stream.ended = True
        return
    if stream.attempt is None:
        stream.attempt = job.attempt
    ended = not follow or job.attempt != stream.attempt or job.status not in _WRITING
    while True:
        chunk = read_log(job.id, stream.attempt, stream.offset)
        yield from stream.lines(chunk.data)
        stream.offset = chunk.start + len(chunk.data)
        if not chunk.data or stream.offset >= chunk.size:
            break
    if ended:
        yield from stream.end()
