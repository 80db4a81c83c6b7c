"""When a silence counts: since the later of a worker's last contact and the moment the server
could hear it again.

A lease lapses, and a worker goes offline or is flagged dead, when nothing was heard from it for a
while. But a worker can only be heard while the server runs and its store takes writes: a
heartbeat sent while the server was down, or refused 503 while the store was locked by someone
else, full or unreachable, is lost through no fault of the worker (issue 24: a write lock held
past the lease made the reaper re-queue healthy jobs). So a silence counts from the latest of

- the last contact (a heartbeat of the worker or of one of its jobs; its registration; the job's
  start),
- the server's start (``Hearing.started_at``),
- the store's last recovery from failing (``Hearing.store_recovered_at``: the first write that
  committed after a busy, unreachable or full store),

and while the store is failing (no write has committed since it failed) nothing is silent at all:
the server cannot tell a silent worker from one it cannot hear. After a recovery every worker has a
whole lease to renew before anything of it is reaped; one that is really gone is reaped one lease
after the recovery.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hearing:
    """Since when the server has been able to hear its workers (the module docstring)."""

    #: when this server started, on its clock
    started_at: float
    #: when the store last came back after failing; None: it has not failed since the start
    store_recovered_at: float | None = None
    #: since when the store has been failing, while it still is; None: it is not failing now
    store_failing_since: float | None = None

    @property
    def since(self) -> float | None:
        """The earliest instant a silence may count from; None while the store is failing."""
        if self.store_failing_since is not None:
            return None
        if self.store_recovered_at is None:
            return self.started_at
        return max(self.started_at, self.store_recovered_at)


#: a server that has always heard its workers (a test's, or a caller that keeps no hearing)
ALWAYS = Hearing(started_at=float("-inf"))


def silence_cutoff(now: float, after_s: float, hearing: Hearing) -> float | None:
    """A last contact before the instant returned is a silence of ``after_s`` now; None: no silence
    can be that long yet (the server has not been able to hear for ``after_s``), so no lease lapses
    and no worker is judged silent. A contact at the cutoff itself is contact."""
    cutoff = now - after_s
    since = hearing.since
    if since is None or since >= cutoff:
        return None
    return cutoff


def silent(last_contact: float | None, now: float, after_s: float, hearing: Hearing) -> bool:
    """Whether a party last heard at ``last_contact`` has been silent for ``after_s`` now (a party
    never heard from is judged from the hearing alone)."""
    cutoff = silence_cutoff(now, after_s, hearing)
    return cutoff is not None and (last_contact is None or last_contact < cutoff)
