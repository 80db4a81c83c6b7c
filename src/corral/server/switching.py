"""The interpreter's switch interval: short only while long work runs beside the event loop.

Store work and loop passes run on threads that share the GIL with the event loop. A thread in a long
stretch of Python (a 5,000-job list, an admission pass over 2,000 workers) keeps the GIL for up to
the switch interval each time the loop wants it back, and a request on the loop wants it back at
every SQLite statement: with CPython's 5 ms, heartbeat p99 at 2,000 hosts was 150 ms idle and
550 ms loaded; at 0.5 ms, 43 and 186 ms (``bench/fleet.py``). But the short interval costs the
loop's own work 3-5% of its CPU when no such thread runs (``bench/protocol.py``: 603/582/563 us
of server CPU per job at 0.5 ms, 547/567/564 at 5 ms, main 556/555/537, alternating runs). So the
interval is short only while long work is running: ``long_work()`` around a long read
(``state.run_long_read``: lists, ``why``, dashboard pages, metrics) and a loop pass.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: the switch interval while long work runs beside the event loop (``CORRAL_SWITCH_INTERVAL_S``)
SHORT_S = float(os.environ.get("CORRAL_SWITCH_INTERVAL_S") or 0.0005)

_lock = threading.Lock()
_running = 0
_normal_s = sys.getswitchinterval()


@contextmanager
def long_work() -> Iterator[None]:
    """The short switch interval while this (and any other long work) runs; the interpreter's own
    interval again once the last one ends."""
    global _running, _normal_s
    with _lock:
        if _running == 0:
            _normal_s = sys.getswitchinterval()
            sys.setswitchinterval(min(SHORT_S, _normal_s))
        _running += 1
    try:
        yield
    finally:
        with _lock:
            _running -= 1
            if _running == 0:
                sys.setswitchinterval(_normal_s)
