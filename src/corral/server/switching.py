"""The interpreter's switch interval: short only while long work runs beside the event loop.

Store work and loop passes run on threads that share the GIL with the event loop. A thread in a long
stretch of Python (a 5,000-job list, an admission pass over 2,000 workers) keeps the GIL for up to
the switch interval each time the loop wants it back, and a request on the loop wants it back at
every SQLite statement: with CPython's 5 ms, heartbeat p99 at 2,000 hosts was 150 ms idle and
550 ms loaded; at 0.5 ms, 43 and 186 ms (``bench/fleet.py``). But the short interval costs the
loop's own work 3-5% of its CPU when no such thread runs (``bench/protocol.py``: 603/582/563 us
of server CPU per job at 0.5 ms, 547/567/564 at 5 ms, main 556/555/537, alternating runs). So the
interval is short only while long work is running: ``long_work(short_s)`` around a long read (the
executor's ``Work.LONG`` and ``Work.READ``: lists, ``why``, dashboard pages, metrics), a short call
sent to a store thread, and a loop pass.

The short interval is a setting (``ServerSettings.switch_interval_s``, ``CORRAL_SWITCH_INTERVAL_S``),
handed by the server's composition root to its executor, which passes it here: nothing is read from
the environment at import. The count of long work running is the process's, as the interval is.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_running = 0
#: of ``_running``, the long work proper: not a short call sent to a store thread
_long = 0
_normal_s = sys.getswitchinterval()


@contextmanager
def long_work(short_s: float | None, short_call: bool = False) -> Iterator[None]:
    """The short switch interval (``short_s``, at most) while this and any other long work runs;
    the interpreter's own interval again once the last one ends. ``short_s`` None: the interval is
    left as it is (a loop group made without an executor, in a test). ``short_call``: a short call
    on a store thread, not long work beside the loop (``long_work_beside``)."""
    global _running, _long, _normal_s
    if short_s is None:
        yield
        return
    with _lock:
        if _running == 0:
            _normal_s = sys.getswitchinterval()
            sys.setswitchinterval(min(short_s, _normal_s))
        _running += 1
        _long += not short_call
    try:
        yield
    finally:
        with _lock:
            _running -= 1
            _long -= not short_call
            if _running == 0:
                sys.setswitchinterval(_normal_s)


def long_work_beside() -> bool:
    """Whether long work (a list, a loop pass; not a short call) runs beside the event loop now:
    a thread that may hold the interpreter for a switch interval each time the loop lets go of it
    (read without the lock: a glance, for a choice of where to run)."""
    return _long > 0
