"""A job's output: one thread drains every job's pipe, and each job keeps a bounded tail of it.

Why one thread (``OutputPump``, on ``epoll`` where there is one): what it does with a chunk is two
appends under short locks, so it keeps up with many jobs, and a worker running hundreds of short
jobs a second does not start (and switch between) a reader thread per job. Moved out of
``corral.worker.executor``, which re-exports the names.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import threading
import time
from collections.abc import Callable

logger = logging.getLogger("corral.worker.executor")

_POLL_S = 0.05


class OutputPump:
    """One thread that reads every registered pipe until its end.

    ``add(descriptor, on_chunk, on_end)``: ``on_chunk(bytes)`` for each read (it must not block),
    then ``on_end()`` once, at the end of the pipe or on a read error, which closes the descriptor
    (the pump never does: the descriptor's owner may hold it in a file object). Started on first
    use; one per process (``shared_pump``).

    Registrations: on ``epoll`` the adding thread registers the descriptor itself (the kernel's set
    changes under a wait already under way), under the lock the pump takes to unregister. Elsewhere
    (``poll``, ``kqueue``, ``select``: the set is the one handed to the wait) they go through a
    queue and a wake-up pipe to the pump's thread. Why: a worker starting hundreds of jobs a second
    paid for each a write, the pump's wake-up and two reads, each a hand-over of the interpreter's
    lock between threads (bench/README.md, "Fewer hand-overs of the interpreter's lock": with the
    kept cgroup descriptors and the bare output pipe, a fifth of the worker's CPU per job).
    """

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        self._selector.register(self._wake_read, selectors.EVENT_READ, None)
        self._pending: list[tuple[int, Callable[[bytes], None], Callable[[], None]]] = []
        self._lock = threading.Lock()
        self._direct = isinstance(self._selector, getattr(selectors, "EpollSelector", ()))
        self._thread = threading.Thread(target=self._run, name="output-pump", daemon=True)
        self._thread.start()

    def add(self, descriptor: int, on_chunk: Callable[[bytes], None], on_end: Callable[[], None]) -> None:
        with self._lock:
            if self._direct:
                self._selector.register(descriptor, selectors.EVENT_READ, (on_chunk, on_end))
                return
            self._pending.append((descriptor, on_chunk, on_end))
        os.write(self._wake_write, b"\0")

    def _register_pending(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_read, 4096):
                pass
        with self._lock:
            pending, self._pending = self._pending, []
            for descriptor, on_chunk, on_end in pending:
                self._selector.register(descriptor, selectors.EVENT_READ, (on_chunk, on_end))

    def _run(self) -> None:
        while True:
            try:
                events = self._selector.select()
            except OSError:
                logger.exception("output pump: select failed")
                time.sleep(_POLL_S)
                continue
            for key, _mask in events:
                if key.data is None:
                    self._register_pending()
                else:
                    self._read(key.fd, *key.data)

    def _read(self, descriptor: int, on_chunk: Callable[[bytes], None], on_end: Callable[[], None]) -> None:
        try:
            chunk = os.read(descriptor, 65536)
        except OSError:
            chunk = b""
        if chunk:
            try:
                on_chunk(chunk)
            except Exception:
                logger.exception("output pump: a listener failed")
            return
        with self._lock:
            self._selector.unregister(descriptor)
        try:
            on_end()
        except Exception:
            logger.exception("output pump: a listener failed at the end of its pipe")


_pump: OutputPump | None = None
_pump_lock = threading.Lock()


def shared_pump() -> OutputPump:
    global _pump
    with _pump_lock:
        if _pump is None:
            _pump = OutputPump()
        return _pump


class OutputTail:
    """The last ``limit`` bytes written by the job; thread-safe."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buffer = bytearray()
        self._lock = threading.Lock()

    def append(self, chunk: bytes) -> None:
        if self._limit <= 0:
            return
        with self._lock:
            self._buffer += chunk
            if len(self._buffer) > self._limit:
                del self._buffer[: len(self._buffer) - self._limit]

    def text(self) -> str:
        with self._lock:
            return self._buffer.decode("utf-8", errors="replace")
