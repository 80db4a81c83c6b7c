"""A clock tests move by hand."""

from __future__ import annotations

import threading


class FakeClock:
    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __getstate__(self) -> float:
        """A copy at this instant (the lock stays behind): a server hands its clock to the
        planner process, which reads it once a pass."""
        return self.now()

    def __setstate__(self, now: float) -> None:
        self._now = now
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        with self._lock:
            self._now += seconds
            return self._now
