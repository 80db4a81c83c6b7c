"""GPU readings from NVML (``nvidia-ml-py``, module ``pynvml``), per job.

Why per process first: a job owns its GPUs, but the figure that proves *this job* is alive is what
the driver attributes to the job's processes. On each of the job's GPUs:

1. list the compute processes on the device (``nvmlDeviceGetComputeRunningProcesses``) and keep
   those of the job's process tree;
2. when some are there, the device's figures are the job's: utilisation is the highest ``smUtil``
   of the job's processes among the samples taken since this probe's previous read
   (``nvmlDeviceGetProcessUtilization`` with the last timestamp seen), and memory is the sum of
   their ``usedGpuMemory``. The driver does not sample every process at every moment: on an H200
   at 100% it answered "no sample since" to about half the reads made 0.5 s apart. So "no sample
   since" repeats the last figure while it is younger than ``STALE_SAMPLE_S``, and only then means
   an idle GPU; read as idle at once, a busy job looked idle to the stall watchdog's confirmation;
3. otherwise (no CUDA context yet, a driver that does not report processes, or PIDs from another
   PID namespace, as in a container, where NVML reports host PIDs) fall back to the device:
   ``nvmlDeviceGetUtilizationRates().gpu`` and ``nvmlDeviceGetMemoryInfo().used``. The GPUs are
   the job's alone, so the device figure is still about the job.

The probe's reading is the busiest GPU's utilisation and the memory summed over the job's GPUs. A
device that errors is left out; no device answering is "no reading".

``pynvml`` is imported here only, lazily: a host without the package or the driver gets "no GPU
sampler" and a sentence saying why, never an exception. GPU indices are NVML's, the ones the
worker counted when it registered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from corral.worker.samplers import MIB, DeviceReading, GpuReading

logger = logging.getLogger("corral.worker.samplers.nvml")

# How long a process-utilisation figure stands in for the reads that get no new sample.
STALE_SAMPLE_S = 3.0
# pynvml.NVML_ERROR_NOT_FOUND: "no sample newer than the timestamp" for process utilisation.
_NOT_FOUND = 6
# pynvml's wrapper raises NVMLError(NVML_SUCCESS) when the driver answers the size query with
# success, which it does when there is no sample to size: the same "nothing since" answer.
_SUCCESS = 0


def open_nvml() -> tuple[NvmlSampler | None, str]:
    """An initialised NVML sampler, or None and why not (no package, no driver, no GPU)."""
    try:
        import pynvml  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None, "no GPU sampler: NVML not available (nvidia-ml-py is not installed)"
    try:
        pynvml.nvmlInit()
    except Exception as error:
        return None, f"no GPU sampler: NVML not available ({error})"
    return NvmlSampler(pynvml), "GPU sampler nvml"


class NvmlSampler:
    name = "nvml"

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml

    def probe(self, gpu_indices: Sequence[int]) -> NvmlProbe:
        return NvmlProbe(self._nvml, gpu_indices)

    def read_devices(self, gpu_indices: Sequence[int]) -> list[DeviceReading]:
        readings = []
        for index in gpu_indices:
            try:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
                rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception as error:
                logger.debug("NVML read failed", extra={"gpu_index": index, "error": str(error)})
                continue
            readings.append(DeviceReading(index, float(rates.gpu), memory.used / MIB))
        return readings

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            logger.debug("NVML shutdown failed", exc_info=True)


class NvmlProbe:
    def __init__(
        self, nvml: Any, gpu_indices: Sequence[int], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._nvml = nvml
        self._indices = list(gpu_indices)
        self._handles: dict[int, Any] = {}
        self._clock = clock
        # Per device: the newest process-utilisation sample already seen (microseconds).
        self._last_seen: dict[int, int] = {}
        # Per device: the last figure a new sample gave, and when (``clock``).
        self._last_figure: dict[int, tuple[float, float]] = {}

    def read(self, pids: Collection[int]) -> GpuReading | None:
        utilisations: list[float] = []
        memories: list[float] = []
        for index in self._indices:
            try:
                utilisation, memory = self._read_device(index, set(pids))
            except Exception as error:
                logger.debug("NVML read failed", extra={"gpu_index": index, "error": str(error)})
                continue
            utilisations.append(utilisation)
            if memory is not None:
                memories.append(memory)
        if not utilisations:
            return None
        return GpuReading(max(utilisations), sum(memories) if memories else None)

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self._nvml.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    def _read_device(self, index: int, pids: set[int]) -> tuple[float, float | None]:
        handle = self._handle(index)
        owned = self._job_processes(handle, pids)
        if owned:
            utilisation = self._process_utilisation(index, handle, {pid for pid, _ in owned})
            if utilisation is not None:
                used = [memory for _, memory in owned if memory is not None]
                return utilisation, (sum(used) / MIB if used else None)
        rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
        memory_info = self._nvml.nvmlDeviceGetMemoryInfo(handle)
        return float(rates.gpu), memory_info.used / MIB

    def _job_processes(self, handle: Any, pids: set[int]) -> list[tuple[int, int | None]]:
        try:
            processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:
            return []
        return [
            (int(process.pid), process.usedGpuMemory) for process in processes if int(process.pid) in pids
        ]

    def _process_utilisation(self, index: int, handle: Any, pids: set[int]) -> float | None:
        """Highest ``smUtil`` of the job's processes since the last read (the last figure, while
        recent, when the driver has no new sample); None: not supported."""
        try:
            samples = self._nvml.nvmlDeviceGetProcessUtilization(handle, self._last_seen.get(index, 0))
        except self._nvml.NVMLError as error:
            nothing_since = (getattr(self._nvml, "NVML_ERROR_NOT_FOUND", _NOT_FOUND), _SUCCESS)
            if getattr(error, "value", None) in nothing_since:
                return self._recent_figure(index)
            return None
        if not samples:
            return self._recent_figure(index)
        self._last_seen[index] = max(int(sample.timeStamp) for sample in samples)
        figure = float(max((sample.smUtil for sample in samples if int(sample.pid) in pids), default=0))
        self._last_figure[index] = (figure, self._clock())
        return figure

    def _recent_figure(self, index: int) -> float:
        """No new sample: the last figure while it is younger than ``STALE_SAMPLE_S``, else idle."""
        figure, at = self._last_figure.get(index, (0.0, -float("inf")))
        return figure if self._clock() - at < STALE_SAMPLE_S else 0.0
