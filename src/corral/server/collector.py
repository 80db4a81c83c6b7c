"""The cyclic garbage collector in ``corral server``: its first threshold (``gc_threshold``), and
the admission pass planned with it paused (``collector_paused``).

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

import contextlib
import gc
from collections.abc import Iterator


def set_first_threshold(threshold: int) -> None:
    """The collector's first threshold, the others as they are; 0 leaves the interpreter's."""
    if threshold <= 0:
        return
    _, second, third = gc.get_threshold()
    gc.set_threshold(threshold, second, third)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the duration, back on after (if it was on before).

    A pass holds every row and record of its snapshot at once (80,000 holding jobs and 10,000
    workers at 10,000 hosts x 8): while they live, the allocation counts trigger collections that
    find nothing to free, promote the pass's short-lived objects to the oldest generation and so
    set off full collections, each walking every object of the process (the kept records
    included). At that size the collector took about as much CPU as the rest of the pass. What a
    pass leaves is freed by reference counting when it ends; cyclic garbage made meanwhile (by
    the pass, or by another thread) waits for the first collection after it."""
    was_enabled = gc.isenabled()
    if was_enabled:
        gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
