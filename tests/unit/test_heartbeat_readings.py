"""A worker heartbeat's GPU readings are stored as pydantic would dump them (``readings_of``
writes the dictionaries out by hand, for speed)."""

from __future__ import annotations

from corral.protocol.models import GpuReading
from corral.server.routes.workers import readings_of


def test_readings_are_what_model_dump_gives() -> None:
    readings = [GpuReading(index=0), GpuReading(index=3, util_pct=95.5, mem_used_mb=60000)]

    assert readings_of(readings) == [reading.model_dump() for reading in readings]
