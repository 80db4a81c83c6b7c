"""Time as a parameter: the server reads a ``Clock``; policies take ``now`` as an argument."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the Unix epoch, UTC."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()


def to_rfc3339(timestamp: float | None) -> str | None:
    """RFC 3339 in UTC with a ``Z`` suffix, millisecond precision; ``None`` stays ``None``."""
    if timestamp is None:
        return None
    # isoformat is implemented in C (strftime is not): "...T08:00:00.250+00:00" -> "...250Z"
    return datetime.fromtimestamp(timestamp, tz=UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def from_rfc3339(text: str) -> float:
    """Seconds since the Unix epoch of an RFC 3339 time (``2026-11-20T08:00:00Z``, an offset, or
    none: UTC); ValueError for anything else."""
    moment = datetime.fromisoformat(text.strip().replace("z", "Z"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
