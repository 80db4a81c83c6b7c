"""The cyclic garbage collector's first threshold for ``corral server`` (``gc_threshold``).

A server answering thousands of hosts allocates a heartbeat's objects and frees them a few
milliseconds later, almost all by reference counting. With the interpreter's first threshold
(700 container objects), a young collection comes every few requests and finds the objects of the
requests still in flight alive: they are promoted, the older generations fill with objects that
are already gone by the time they are looked at, and full collections follow, each one walking
every object of the process with the interpreter held. Measured with ``bench/fleet.py --db postgres
--workers 800 --batched --jobs-per-worker 8`` (one replica, 2-core box under load): 14 full
collections in the run, 1,083 ms of CPU, up to 99 ms each, none freeing anything; with 50,000, no
full collection and 3 young ones. The first threshold counts allocations net of frees, so a server
whose objects die young reaches it rarely; cyclic garbage waits for it, at most that many objects.
"""

from __future__ import annotations

import gc


def set_first_threshold(threshold: int) -> None:
    """The collector's first threshold, the others as they are; 0 leaves the interpreter's."""
    if threshold <= 0:
        return
    _, second, third = gc.get_threshold()
    gc.set_threshold(threshold, second, third)
