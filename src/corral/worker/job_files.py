"""Reading the files a job writes for its worker (beat, defer, checkpoint): bounded, never blocking.

The job owns these files and may put anything there: a number too large for any heartbeat, binary,
megabytes, a FIFO (an ``open`` for reading waits for a writer forever), a symlink to ``/dev/zero``
(a read never ends) or to a file of someone else's that the worker, not the job, may read. Every read
here opens without following a symlink and without waiting (``O_NOFOLLOW | O_NONBLOCK``), takes a
regular file only, reads at most the bytes asked for, and checks who owns it when the caller says
who should; anything else reads as nothing. So whatever a job writes affects that job alone: the
worker's heartbeat (every job's lease) goes on.
"""

from __future__ import annotations

import math
import os
import re
import stat
from pathlib import Path

#: the most bytes read from the beat file (a step number, by convention)
BEAT_BYTES = 64
#: the most bytes read from the defer file (a number of seconds)
DEFER_BYTES = 64
#: a step the heartbeat carries: an integer any JSON reader takes (< 2**63: 18 digits at most)
_STEP = re.compile(rb"\s*(-?[0-9]{1,18})\s*")
#: the latest time an answer can write (9999-12-31T23:59:59Z; ``JobHeartbeatBody.checkpoint_at``)
MAX_TIMESTAMP = 253402300799.0


def open_regular(path: Path | str, owner: int | None = None) -> tuple[int, os.stat_result] | None:
    """A read-only descriptor of ``path`` and its status, when it is a regular file that is not a
    symlink (and belongs to ``owner`` when given); None otherwise. The caller closes it."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        status = os.fstat(descriptor)
    except OSError:
        os.close(descriptor)
        return None
    if not stat.S_ISREG(status.st_mode) or (owner is not None and status.st_uid != owner):
        os.close(descriptor)
        return None
    return descriptor, status


def read_head(path: Path | str, limit: int, owner: int | None = None) -> bytes | None:
    """At most ``limit`` bytes from the start of ``path``; None where it is not a readable regular
    file (absent, a FIFO, a device, a symlink, someone else's)."""
    opened = open_regular(path, owner)
    if opened is None:
        return None
    descriptor, _status = opened
    try:
        return os.read(descriptor, limit)
    except OSError:
        return None
    finally:
        os.close(descriptor)


def read_value(path: Path | str, limit: int) -> bytes | None:
    """A value the job wrote (a step, a number of seconds): the file's bytes when it holds at most
    ``limit``; None when it holds more (megabytes of digits are no number) or is no regular file."""
    raw = read_head(path, limit + 1)
    return None if raw is None or len(raw) > limit else raw


def read_whole(path: Path | str, limit: int, owner: int | None = None) -> bytes | None:
    """The whole of ``path`` when it is a regular file of at most ``limit`` bytes; None otherwise
    (absent, empty, too large, a FIFO, a device, a symlink, someone else's)."""
    opened = open_regular(path, owner)
    if opened is None:
        return None
    descriptor, status = opened
    try:
        if status.st_size == 0 or status.st_size > limit:
            return None
        chunks = []
        left = limit + 1  # one byte more than allowed says it grew past the limit meanwhile
        while left > 0:
            chunk = os.read(descriptor, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        return data if 0 < len(data) <= limit else None
    except OSError:
        return None
    finally:
        os.close(descriptor)


def parse_step(raw: bytes | None) -> int | None:
    """The step a beat file holds, when it is a plain decimal integer of at most 18 digits (so any
    heartbeat can carry it); None for anything else."""
    if not raw:
        return None
    match = _STEP.fullmatch(raw)
    return int(match.group(1)) if match else None


def parse_seconds(raw: bytes | None) -> float | None:
    """A positive, finite number of seconds written as text; None for anything else."""
    if not raw:
        return None
    try:
        seconds = float(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 else None


def sane_time(seconds: float) -> float | None:
    """A file time a heartbeat can carry (between the epoch and year 9999); None for one a job set
    outside (``touch -d``)."""
    return seconds if 0 <= seconds <= MAX_TIMESTAMP else None
