"""What this server has seen of its store's writes: since when they fail, and when they came back.

A store that cannot take writes (locked by another process past the busy timeout, unreachable,
its disk full) refuses every heartbeat with a 503: the workers' silence meanwhile is the server's
fault, not theirs (``core.hearing``). So the server notes each such failure it sees (a route's
error, a loop pass's), and from then on checks with a write of its own whether the store came back
(``Backend.ping(write=True)``: a write that changes nothing, and commits; a full disk lets a read,
a lock, even a transaction that writes nothing through, not a write): the first that commits is
the store's recovery, and every lease counts from it. The reaper checks before each pass while the
store is failing, ``/readyz`` at each call (it answers 503 until then), so the recovery is seen
with no other traffic; and while it is failing, the routes that write are answered 503 at once
(``store_gate``) instead of waiting behind the store's lock, each such answer starting a check
unless one is running already.

Thread-safe: failures are noted from the event loop and from loop threads, checks run on the
probe's and the reaper's threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from corral.core.hearing import Hearing
from corral.domain import errors
from corral.domain.clock import Clock

logger = logging.getLogger("corral.server.store")


class StoreHealth:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        #: since when writes have been failing, while they still are; None: the store is well
        self.failing_since: float | None = None
        #: when the store last came back after failing; None: it has not failed
        self.recovered_at: float | None = None
        #: failures noted so far: a check only ends the failures it saw begin before it
        self._failures = 0
        #: the error code of the last failure noted (``store_busy``, ``store_unavailable``): what
        #: the requests refused at once meanwhile are answered with (``store_gate``)
        self.failure_code = errors.StoreUnavailable.code

    @property
    def failing(self) -> bool:
        return self.failing_since is not None

    def failed(self, error: errors.StoreUnavailable) -> None:
        """A store call failed as busy, unreachable or unable to write."""
        with self._lock:
            self._failures += 1
            self.failure_code = error.code
            if self.failing_since is not None:
                return
            self.failing_since = self._clock.now()
        logger.warning(
            "the store is failing: no silence counts until a write commits again",
            extra={"code": error.code, "error": error.message},
        )

    def check(self, write: Callable[[], None]) -> None:
        """While the store is failing: ``write`` (a write that commits, or raises
        ``StoreUnavailable``), and, once it commits with no failure noted meanwhile, the store's
        recovery. Raises what ``write`` raised. Nothing to do while the store is well."""
        with self._lock:
            if self.failing_since is None:
                return
            failures = self._failures
        write()
        with self._lock:
            began = self.failing_since
            if began is None or self._failures != failures:
                return  # recovered by another check, or failed again meanwhile
            now = self._clock.now()
            self.failing_since, self.recovered_at = None, now
        logger.warning(
            "the store has recovered: every lease counts from now", extra={"failed_s": round(now - began, 3)}
        )

    def hearing(self, started_at: float) -> Hearing:
        """Since when this server, started at ``started_at``, has been able to hear its workers."""
        with self._lock:
            return Hearing(started_at, self.recovered_at, self.failing_since)
