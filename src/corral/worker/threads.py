"""Threads for job attempts, started once and reused.

A worker running hundreds of short jobs a second used to start a thread per attempt: the thread
object (a lock, a condition, an event), the OS thread and its stack, and the claim thread's wait
until the new one had started, for a job that ran a few milliseconds. ``ThreadPool.submit`` hands the
attempt to an idle thread when there is one and starts a thread only when none is idle, so a busy
worker keeps about as many threads as it runs jobs at once, and starts none per job. There is no
bound: every attempt gets its thread at once, as before (an attempt blocks in its process's wait
for as long as the job runs). A thread idle for ``idle_s`` ends.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

logger = logging.getLogger("corral.worker.threads")

#: an idle thread ends after this long without work
IDLE_S = 30.0


class ThreadPool:
    def __init__(self, name: str, idle_s: float = IDLE_S) -> None:
        self._name = name
        self._idle_s = idle_s
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for work, less the work already queued for them
        self._started = 0
        self._work: queue.SimpleQueue[tuple[Callable[[], None], str]] = queue.SimpleQueue()

    def submit(self, work: Callable[[], None], name: str) -> None:
        """Run ``work`` on a thread of the pool, named ``name`` while it runs; never waits."""
        with self._lock:
            spawn = self._idle == 0
            if spawn:
                self._started += 1
                number = self._started
            else:
                self._idle -= 1
        self._work.put((work, name))
        if spawn:
            threading.Thread(target=self._serve, name=f"{self._name}-{number}", daemon=True).start()

    def _serve(self) -> None:
        own_name = threading.current_thread().name
        while True:
            try:
                work, name = self._work.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    # Idle and no work was promised to an idle thread meanwhile: end.
                    if self._idle > 0:
                        self._idle -= 1
                        return
                continue
            thread = threading.current_thread()
            thread.name = name
            try:
                work()
            except Exception:
                logger.exception("pooled work failed", extra={"work": name})
            finally:
                thread.name = own_name
            with self._lock:
                self._idle += 1
