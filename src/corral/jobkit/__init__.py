"""What a job imports to talk to the corral worker that runs it. Standard library only.

``beat(step=None)`` reports progress. The worker gives every job ``CORRAL_BEAT_FILE``, a path in
the job's private directory; **any write to that file is a beat**, and an integer in it is the
step, so a shell job beats with::

    echo 42 > "$CORRAL_BEAT_FILE"

The worker sees a beat by the file's modification time and size changing; it reads the content
only to show the last step when a watchdog trips. Why beat at all: the stall watchdog is inert
until a job's first beat (so loading a model is never policed), then suspects a stall when no
beat came for ``stall_timeout_s`` and, if the job's GPUs are idle and its memory static, stops
it and has it re-queued. The GPU-health watchdog also starts a fresh window at each beat. A job
that never beats is never stall-tripped.

``beat`` is cheap enough to call on every training step: it writes at most once a second
(``time.monotonic()`` decides, no system call otherwise) and does nothing outside corral (no
``CORRAL_BEAT_FILE``). Write errors are swallowed: progress reporting must never break a job.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["BEAT_INTERVAL_S", "beat"]

#: The shortest time between two writes of the beat file, in seconds.
BEAT_INTERVAL_S = 1.0

_lock = threading.Lock()
_last_write = -float("inf")
_calls = 0


def beat(step: int | None = None) -> bool:
    """Report progress: write ``step`` (else a count of calls) to ``$CORRAL_BEAT_FILE``.

    Returns True when this call wrote the file, False when it was skipped (rate limit, outside
    corral, or the file could not be written).
    """
    global _calls, _last_write
    path = os.environ.get("CORRAL_BEAT_FILE")
    if not path:
        return False
    now = time.monotonic()
    with _lock:
        _calls += 1
        if now - _last_write < BEAT_INTERVAL_S:
            return False
        _last_write = now
        value = _calls if step is None else step
    try:
        with open(path, "w", encoding="ascii") as beat_file:
            beat_file.write(f"{value}\n")
    except OSError:
        return False
    return True


def _reset() -> None:
    """Forget the rate limit and the count (tests, or a forked child that beats on its own)."""
    global _calls, _last_write
    with _lock:
        _calls = 0
        _last_write = -float("inf")
