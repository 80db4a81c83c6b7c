"""``fake:<path>``: GPU readings scripted by a JSON file, for tests and benchmarks without a GPU.

The file holds ``{"util_pct": number, "mem_used_mb": number}`` and stands for every GPU of the
worker. It is read again at every sample, so a test turns a GPU idle or busy by rewriting it while
the worker runs. A missing file, a file caught half-written, or one without a numeric
``util_pct`` is "no reading", exactly like a driver that did not answer: never an exception.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from corral.worker.samplers import DeviceReading, GpuReading


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class FakeGpuProbe:
    def __init__(self, path: Path) -> None:
        self._path = path

    def read(self, pids: Collection[int]) -> GpuReading | None:
        try:
            data = json.loads(self._path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict):
            return None
        util = _number(data.get("util_pct"))
        if util is None:
            return None
        return GpuReading(util_pct=util, memory_used_mb=_number(data.get("mem_used_mb")))


class FakeGpuSampler:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.name = f"fake:{self.path}"

    def probe(self, gpu_indices: Sequence[int]) -> FakeGpuProbe:
        return FakeGpuProbe(self.path)

    def read_devices(self, gpu_indices: Sequence[int]) -> list[DeviceReading]:
        reading = FakeGpuProbe(self.path).read(())
        if reading is None:
            return []
        return [DeviceReading(index, reading.util_pct, reading.memory_used_mb) for index in gpu_indices]

    def close(self) -> None:
        """Nothing to release: the file is opened per read."""
