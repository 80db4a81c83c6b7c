"""What an attempt is held to on its host (API.md "A job is contained on its host", Limits): its
memory, its CPUs, its processes, and the GPU device nodes of the GPUs it was not given."""

from __future__ import annotations

import glob
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass

#: the GPU device nodes, one per GPU, numbered as the server's GPU indices (NVML's order)
GPU_DEVICES = "/dev/nvidia[0-9]*"
_TRAILING_NUMBER = re.compile(r"(\d+)$")


@dataclass(frozen=True, slots=True)
class Limits:
    """``memory_bytes`` None: no limit; ``cpus`` 0: no quota; ``pids_max`` None: no cap;
    ``denied_devices``: (major, minor) of character devices the attempt may not open."""

    memory_bytes: int | None = None
    cpus: float = 0
    pids_max: int | None = None
    denied_devices: tuple[tuple[int, int], ...] = ()


def gpu_device_numbers(pattern: str = GPU_DEVICES) -> dict[int, tuple[int, int]]:
    """GPU index -> (major, minor) of its device node, for the nodes ``pattern`` finds (the
    trailing number of the name is the index: ``/dev/nvidia3`` is GPU 3). ``nvidiactl``,
    ``nvidia-uvm`` and the rest have no trailing number of that kind and stay open."""
    numbers = {}
    for path in glob.glob(pattern):
        match = _TRAILING_NUMBER.search(os.path.basename(path))
        if match is None:
            continue
        try:
            status = os.stat(path)
        except OSError:
            continue
        if stat.S_ISCHR(status.st_mode):
            numbers[int(match.group(1))] = (os.major(status.st_rdev), os.minor(status.st_rdev))
    return numbers


def attempt_limits(
    memory_mb: int,
    cpus: int,
    gpu_indices: Iterable[int],
    default_memory_mb: int | None,
    pids_max: int | None,
    devices: dict[int, tuple[int, int]],
) -> Limits:
    """The limits of an attempt asking for ``memory_mb`` (0: ``default_memory_mb``, None there:
    unlimited) and ``cpus`` (0: no quota), given ``gpu_indices`` of the GPUs in ``devices``."""
    memory = memory_mb or default_memory_mb
    allowed = set(gpu_indices)
    denied = tuple(sorted({number for index, number in devices.items() if index not in allowed}))
    return Limits(memory * 1024 * 1024 if memory else None, float(cpus), pids_max, denied)
