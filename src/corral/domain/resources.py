"""Resources as exact integers.

Every quantity is an integer (GPUs, MB of VRAM per GPU, MB of memory, CPUs), so adding and
subtracting allocations never drifts the way floats do: a worker whose jobs all finish is back to
exactly its registered capacity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RESOURCE_NAMES = ("gpus", "vram_mb", "memory_mb", "cpus")


@dataclass(frozen=True, slots=True)
class Resources:
    """A request or a capacity. ``vram_mb`` is per GPU, so it is compared, never summed."""

    gpus: int = 0
    vram_mb: int = 0
    memory_mb: int = 0
    cpus: int = 0

    @classmethod
    def from_mapping(cls, values: dict[str, Any] | None) -> Resources:
        values = values or {}
        return cls(**{name: int(values.get(name, 0) or 0) for name in RESOURCE_NAMES})

    def to_dict(self) -> dict[str, int]:
        return {"gpus": self.gpus, "vram_mb": self.vram_mb, "memory_mb": self.memory_mb, "cpus": self.cpus}

    def __add__(self, other: Resources) -> Resources:
        """Sum of two allocations. VRAM per GPU is not additive: the larger one is kept."""
        return Resources(
            gpus=self.gpus + other.gpus,
            vram_mb=max(self.vram_mb, other.vram_mb),
            memory_mb=self.memory_mb + other.memory_mb,
            cpus=self.cpus + other.cpus,
        )

    def minus(self, used: Resources) -> Resources:
        """Capacity left after ``used``: per-GPU VRAM stays the worker's."""
        return Resources(
            gpus=self.gpus - used.gpus,
            vram_mb=self.vram_mb,
            memory_mb=self.memory_mb - used.memory_mb,
            cpus=self.cpus - used.cpus,
        )

    def covers(self, request: Resources) -> bool:
        """True when this free capacity can hold ``request``.

        VRAM is only checked when the request holds GPUs: a CPU job asks for no GPU memory.
        """
        if request.gpus > self.gpus or request.memory_mb > self.memory_mb or request.cpus > self.cpus:
            return False
        return not (request.gpus > 0 and request.vram_mb > self.vram_mb)

    def shortfall(self, request: Resources) -> list[str]:
        """Names of the resources this free capacity lacks for ``request`` (for reasons shown to people)."""
        missing = []
        if request.gpus > self.gpus:
            missing.append("gpus")
        if request.gpus > 0 and request.vram_mb > self.vram_mb:
            missing.append("vram_mb")
        if request.memory_mb > self.memory_mb:
            missing.append("memory_mb")
        if request.cpus > self.cpus:
            missing.append("cpus")
        return missing


ZERO = Resources()
