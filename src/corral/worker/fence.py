"""Self-fencing: a worker that cannot renew a job's lease stops the job before the server can hand
it to another worker (issue 24 item 3).

Without it, a worker cut off from its server (a partition, a frozen host) runs its jobs on for as
long as the cut lasts, while the server, once the lease expired, re-queues each job and another
worker runs attempt 2 beside it: two copies writing the same outputs and checkpoints. The
worker cannot tell a partition from a server that is down (restarting, upgrading): both are "no
answer". A server that starts gives its workers a lease's grace before it reaps, so a restart
shorter than the fence's delay stops nothing; a longer one stops (and hands back) every job.

The decision is pure (``fence_after_s``, ``fence_due``) and takes the time as an argument; a
``LeaseFence`` keeps one attempt's last renewal, on the worker's monotonic clock:

- a renewal is counted from when the heartbeat that renewed it was *sent* (the server recorded
  it later, so its lease ends later than the worker reckons: the error is on the safe side), and
  the first from when the claim was sent;
- a heartbeat the server answered 503 ``store_busy`` / ``store_unavailable`` counts as a renewal
  (``heard_through_a_stall``): the server heard the worker, and a server whose store fails counts
  no silence until its store has recovered, a lease after that (``corral.core.hearing``), so the
  lease cannot end before the fence. A heartbeat is sent once (``HEARTBEAT_BUSY_RETRY_S``), not
  again and again inside one call as the SDK sends a 503 with ``Retry-After``: such a call is
  answered only once the stall ends or the retries run out (20 s), and all that time the fence
  would hear nothing (its renewal counts from the call's start); the next heartbeat is the retry.
  The server answers such a 503 at once while its store fails (``server.store_gate``), not after
  waiting behind the store's lock. (With several replicas, one whose own store connection fails
  while another's works: the balancer's ``/readyz`` check takes it out of rotation; until it does,
  the other replica may reap the job while this worker still runs it);
- the fence is due ``lease_s - margin`` after the last renewal, the margin being at most a quarter
  of the lease (``MAX_MARGIN_FRACTION``): a margin meant for a 30 s lease must not make a short
  lease's fence fire on one late heartbeat.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: the largest share of the lease the margin may take
MAX_MARGIN_FRACTION = 0.25


#: how long a heartbeat answered 503 with ``Retry-After`` is sent again inside its call: never
#: (the module docstring)
HEARTBEAT_BUSY_RETRY_S = 0.0

#: the error codes of a server that heard a heartbeat but could not write it (its store failing)
STORE_STALL_CODES = frozenset({"store_busy", "store_unavailable"})


def heard_through_a_stall(status: int, code: str) -> bool:
    """Whether a refused heartbeat still tells the worker its server heard it: a 503 for the
    server's store (``STORE_STALL_CODES``), not an unreachable server or one that refused the job."""
    return status == 503 and code in STORE_STALL_CODES


def effective_margin_s(lease_s: float, margin_s: float) -> float:
    """The margin as used: ``margin_s``, at most a quarter of the lease."""
    return max(0.0, min(margin_s, lease_s * MAX_MARGIN_FRACTION))


def fence_after_s(lease_s: float, margin_s: float) -> float:
    """How long an attempt may go without a renewal before the worker stops it."""
    return lease_s - effective_margin_s(lease_s, margin_s)


def fence_due(renewed_at: float, now: float, lease_s: float, margin_s: float) -> bool:
    """Whether an attempt last renewed at ``renewed_at`` must be stopped at ``now``."""
    return now - renewed_at >= fence_after_s(lease_s, margin_s)


class LeaseFence:
    """One attempt's lease as its worker sees it: the last renewal, and when the fence is due.

    ``renewed`` is called from the heartbeat thread, ``due`` and ``deadline`` from the attempt's
    own thread, hence the lock."""

    def __init__(
        self,
        lease_s: float,
        margin_s: float,
        renewed_at: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lease_s = lease_s
        self.margin_s = effective_margin_s(lease_s, margin_s)
        self._clock = clock
        self._renewed_at = renewed_at
        self._lock = threading.Lock()

    def renewed(self, sent_at: float) -> None:
        """The server renewed the lease with a heartbeat sent at ``sent_at``; an older heartbeat's
        late answer never moves the renewal back."""
        with self._lock:
            self._renewed_at = max(self._renewed_at, sent_at)

    @property
    def renewed_at(self) -> float:
        with self._lock:
            return self._renewed_at

    def deadline(self) -> float:
        """When the fence is due, unless a renewal comes first (the clock's time)."""
        return self.renewed_at + fence_after_s(self.lease_s, self.margin_s)

    def due(self, now: float | None = None) -> bool:
        return fence_due(self.renewed_at, self._clock() if now is None else now, self.lease_s, self.margin_s)

    def silent_s(self, now: float | None = None) -> float:
        """How long since the last renewal."""
        return (self._clock() if now is None else now) - self.renewed_at
