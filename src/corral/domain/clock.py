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
    moment = datetime.fromtimestamp(timestamp, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
