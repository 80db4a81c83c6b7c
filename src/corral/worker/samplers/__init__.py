"""Where the watchdogs' physical signals come from, behind one small interface.

Two questions decide whether a silent job is wedged (seed 004): are its GPUs doing anything, and is
its memory moving? Each has its own sampler:

- a **GPU sampler** (``nvml``, ``fake:<path>``, or none at all) answers the first for one job's GPUs
  through a per-job ``GpuProbe``: a probe keeps the state a driver needs between two reads (NVML's
  "samples newer than" timestamp), so two jobs never consume each other's samples;
- the **memory sampler** (psutil) answers the second for the job's process tree, and also names
  the tree's processes, which is how the NVML sampler attributes per-process figures to the job.

The watchdogs never call a sampler themselves: the job's loop reads once and hands the same
reading to every watchdog that wants one, so a tick costs at most one read of each.

``open_gpu_sampler`` turns the ``CORRAL_GPU_SAMPLER`` setting into a sampler, or into None with a
sentence saying why: a worker never fails to start for lack of a GPU driver.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

logger = logging.getLogger("corral.worker.samplers")

MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuReading:
    """One read of a job's GPUs: the busiest figure (percent) and the memory in use (MB, summed)."""

    util_pct: float
    memory_used_mb: float | None = None


@dataclass(frozen=True)
class DeviceReading:
    """One GPU of the worker as a whole (every process on it): what the worker heartbeat reports."""

    index: int
    util_pct: float
    memory_used_mb: float | None = None


@dataclass(frozen=True)
class TreeReading:
    """One read of a job's process tree: its resident memory (MB) and the processes it holds."""

    memory_mb: float
    pids: frozenset[int] = field(default_factory=frozenset)


class GpuProbe(Protocol):
    """One job's view of its GPUs. ``read`` returns None when there is no reading (not a crash)."""

    def read(self, pids: Collection[int]) -> GpuReading | None: ...


class GpuSampler(Protocol):
    """A source of GPU readings for the whole worker; ``probe`` opens one job's view."""

    name: str

    def probe(self, gpu_indices: Sequence[int]) -> GpuProbe: ...

    def read_devices(self, gpu_indices: Sequence[int]) -> list[DeviceReading]:
        """Each GPU's own utilisation and memory in use; a GPU that cannot be read is left out."""
        ...

    def close(self) -> None: ...


class MemorySampler(Protocol):
    def read(self, root_pid: int) -> TreeReading | None: ...


@dataclass(frozen=True)
class Samplers:
    """What the agent hands every job's watch: the worker's GPU sampler (None: no GPU figures) and
    the memory sampler."""

    gpu: GpuSampler | None
    memory: MemorySampler


def open_gpu_sampler(setting: str | None) -> tuple[GpuSampler | None, str]:
    """The sampler ``CORRAL_GPU_SAMPLER`` names, and a sentence for the log.

    ``None`` (the default) tries NVML and quietly settles for no sampler; ``nvml`` asked for
    explicitly and not available is the same, but the caller should warn; ``none`` is no sampler;
    ``fake:<path>`` is the file-driven fake the tests script.
    """
    if setting == "none":
        return None, "no GPU sampler (CORRAL_GPU_SAMPLER=none)"
    if setting is not None and setting.startswith("fake:"):
        from corral.worker.samplers.fake import FakeGpuSampler

        fake = FakeGpuSampler(setting.removeprefix("fake:"))
        return fake, f"GPU sampler {fake.name}"
    from corral.worker.samplers.nvml import open_nvml

    return open_nvml()
