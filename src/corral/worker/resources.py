"""What a worker offers: flags win, else what the host has.

GPUs are read through NVML (``pynvml``, from the optional ``nvidia-ml-py``), imported only here and
only when a GPU figure was not given on the command line, so a CPU-only host never needs the
package or a driver. Without NVML the host simply offers 0 GPUs: a worker never fails to start for
lack of a GPU.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import psutil

logger = logging.getLogger("corral.worker.resources")


@dataclass(frozen=True)
class GpuInventory:
    """The GPUs NVML sees: how many, the model of the first, the smallest VRAM among them (MB).

    The smallest VRAM is the honest figure for a host with mixed cards: the server places a job on
    any of the worker's GPUs, so every GPU must hold what the worker advertises.
    """

    count: int = 0
    model: str | None = None
    vram_mb: int = 0


@dataclass(frozen=True)
class Offer:
    """The resources part of a registration (``POST /workers/register``)."""

    cpus: int
    memory_mb: int
    gpus: int
    vram_mb: int
    gpu_model: str | None
    labels: dict[str, str] = field(default_factory=dict)

    def resources(self) -> dict[str, int]:
        return {"gpus": self.gpus, "vram_mb": self.vram_mb, "memory_mb": self.memory_mb, "cpus": self.cpus}


def detect_cpus() -> int:
    return os.cpu_count() or 1


def detect_memory_mb() -> int:
    return int(psutil.virtual_memory().total // (1024 * 1024))


def detect_gpus() -> GpuInventory:
    """Ask NVML for the host's GPUs; no NVML, no driver or any NVML error means no GPUs."""
    try:
        import pynvml  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        logger.info("no GPU sampler: NVML not available (nvidia-ml-py is not installed)")
        return GpuInventory()
    try:
        pynvml.nvmlInit()
    except Exception as error:
        logger.info(f"no GPU sampler: NVML not available ({error})")
        return GpuInventory()
    try:
        return _read_inventory(pynvml)
    except Exception as error:
        logger.warning(f"no GPU sampler: NVML failed while listing GPUs ({error})")
        return GpuInventory()
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            logger.debug("NVML shutdown failed", exc_info=True)


def _read_inventory(pynvml: Any) -> GpuInventory:
    count = int(pynvml.nvmlDeviceGetCount())
    if count == 0:
        return GpuInventory()
    models: list[str] = []
    vram: list[int] = []
    for index in range(count):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        models.append(name.decode() if isinstance(name, bytes) else str(name))
        vram.append(int(pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)))
    if len(set(models)) > 1:
        logger.warning("GPUs of different models; advertising the first", extra={"gpu_models": models})
    inventory = GpuInventory(count=count, model=models[0], vram_mb=min(vram))
    logger.info(
        "GPUs detected",
        extra={"gpus": inventory.count, "gpu_model": inventory.model, "vram_mb": inventory.vram_mb},
    )
    return inventory


def parse_labels(pairs: list[str]) -> dict[str, str]:
    """``["zone=a", "rack=3"]`` -> ``{"zone": "a", "rack": "3"}``; a pair without ``=`` is refused."""
    labels: dict[str, str] = {}
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator or not key.strip():
            raise SystemExit(f"corral worker: bad label {pair!r} (--label K=V / CORRAL_LABEL)")
        labels[key.strip()] = value.strip()
    return labels


def resolve_offer(
    cpus: int | None,
    memory_mb: int | None,
    gpus: int | None,
    vram_mb: int | None,
    gpu_model: str | None,
    labels: list[str],
) -> Offer:
    """Each figure from its flag when given, else detected. NVML is asked only if a GPU figure is
    missing and the GPU count was not set to 0."""
    inventory = GpuInventory()
    gpu_figure_missing = gpus is None or vram_mb is None or gpu_model is None
    if gpu_figure_missing and gpus != 0:
        inventory = detect_gpus()
    offered_gpus = inventory.count if gpus is None else gpus
    return Offer(
        cpus=detect_cpus() if cpus is None else cpus,
        memory_mb=detect_memory_mb() if memory_mb is None else memory_mb,
        gpus=offered_gpus,
        vram_mb=(inventory.vram_mb if vram_mb is None else vram_mb) if offered_gpus else 0,
        gpu_model=(inventory.model if gpu_model is None else gpu_model) if offered_gpus else None,
        labels=parse_labels(labels),
    )
