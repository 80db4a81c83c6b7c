"""The samplers: the fake file, the psutil process tree, NVML present (a fake module) and absent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import types
from pathlib import Path

import psutil
import pytest

from corral.worker.samplers import MIB, DeviceReading, GpuReading, open_gpu_sampler
from corral.worker.samplers.fake import FakeGpuSampler
from corral.worker.samplers.nvml import STALE_SAMPLE_S, NvmlProbe, NvmlSampler
from corral.worker.samplers.process import ProcessTreeSampler
from tests.e2e.conftest import wait_for

# --- fake: -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"util_pct": 0, "mem_used_mb": 1000}', GpuReading(0.0, 1000.0)),
        ('{"util_pct": 87.5}', GpuReading(87.5, None)),
        ('{"util_pct": 3, "mem_used_mb": "lots"}', GpuReading(3.0, None)),
        ('{"util_pct": 40, "mem_u', None),  # caught half-written
        ('{"mem_used_mb": 10}', None),  # no utilisation: no reading
        ('{"util_pct": true}', None),
        ("[1, 2]", None),
        ("", None),
        (None, None),  # no file
    ],
)
def test_fake_sampler_reads_the_file_at_every_sample(tmp_path: Path, content, expected):
    path = tmp_path / "gpu.json"
    if content is not None:
        path.write_text(content)
    probe = FakeGpuSampler(path).probe([0, 1])
    assert probe.read({1}) == expected


def test_fake_sampler_follows_the_file_as_it_changes(tmp_path: Path):
    path = tmp_path / "gpu.json"
    sampler, message = open_gpu_sampler(f"fake:{path}")
    assert sampler is not None and sampler.name == f"fake:{path}" and "fake" in message
    probe = sampler.probe([0])
    assert probe.read(()) is None
    path.write_text(json.dumps({"util_pct": 0, "mem_used_mb": 10}))
    assert probe.read(()) == GpuReading(0, 10)
    path.write_text(json.dumps({"util_pct": 95, "mem_used_mb": 10}))
    assert probe.read(()) == GpuReading(95, 10)
    sampler.close()


def test_none_means_no_sampler():
    sampler, message = open_gpu_sampler("none")
    assert sampler is None and "no GPU sampler" in message


# --- psutil: the process tree ----------------------------------------------------------------


def test_process_tree_includes_children_and_grandchildren():
    # A shell whose child holds 40 MB and whose grandchild is a sleep.
    script = "import time; b = bytearray(40 * 1024 * 1024); time.sleep(30)"
    command = f"{sys.executable} -c '{script}' & (sleep 30 & wait) & wait"
    shell = subprocess.Popen(["/bin/sh", "-c", command], start_new_session=True)
    try:
        sampler = ProcessTreeSampler()

        def whole_tree():
            # The shell forks its subshells while we look: a reading counts once it holds every
            # descendant seen just before it (a later fork is not this reading's to hold).
            descendants = {child.pid for child in psutil.Process(shell.pid).children(recursive=True)}
            reading = sampler.read(shell.pid)
            if reading is None or len(reading.pids) < 4 or reading.memory_mb <= 40:
                return None
            return reading if shell.pid in reading.pids and descendants <= reading.pids else None

        reading = wait_for(whole_tree, 10, "a reading of every process of the job's tree")
        shell_alone = psutil.Process(shell.pid).memory_info().rss / MIB
        assert reading.memory_mb > shell_alone + 40
    finally:
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait(5)


def test_process_tree_of_a_gone_process_is_no_reading():
    finished = subprocess.Popen(["true"])
    finished.wait(5)
    assert ProcessTreeSampler().read(finished.pid) is None


# --- NVML --------------------------------------------------------------------------------------


def test_nvml_absent_is_no_sampler_with_a_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    sampler, message = open_gpu_sampler(None)
    assert sampler is None
    assert message == "no GPU sampler: NVML not available (nvidia-ml-py is not installed)"
    sampler, _ = open_gpu_sampler("nvml")
    assert sampler is None


def test_nvml_without_a_driver_is_no_sampler(monkeypatch):
    module = fake_pynvml({})

    def no_driver():
        raise module.NVMLError(9)

    module.nvmlInit = no_driver
    monkeypatch.setitem(sys.modules, "pynvml", module)
    sampler, message = open_gpu_sampler(None)
    assert sampler is None and "NVML not available" in message


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_pynvml(devices: dict[int, dict]) -> types.ModuleType:
    """A stand-in ``pynvml``: per device, ``util``/``used_mb`` (device level), ``processes``
    [(pid, used bytes)], ``samples`` [(pid, timestamp, smUtil)] or ``samples_error`` (a code)."""
    module = types.ModuleType("pynvml")
    module.NVMLError = NVMLError
    module.NVML_ERROR_NOT_FOUND = 6
    module.calls = []
    module.nvmlInit = lambda: None
    module.nvmlShutdown = lambda: module.calls.append("shutdown")

    def handle(index):
        if index not in devices:
            raise NVMLError(2)
        return index

    def processes(index):
        return [
            types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in devices[index]["processes"]
        ]

    def samples(index, last_seen):
        module.calls.append(("utilisation", index, last_seen))
        device = devices[index]
        if "samples_error" in device:
            raise NVMLError(device["samples_error"])
        found = [
            types.SimpleNamespace(pid=pid, timeStamp=stamp, smUtil=util)
            for pid, stamp, util in device["samples"]
            if stamp > last_seen
        ]
        if not found:
            raise NVMLError(6)
        return found

    module.nvmlDeviceGetHandleByIndex = handle
    module.nvmlDeviceGetComputeRunningProcesses = processes
    module.nvmlDeviceGetProcessUtilization = samples
    module.nvmlDeviceGetUtilizationRates = lambda index: types.SimpleNamespace(gpu=devices[index]["util"])
    module.nvmlDeviceGetMemoryInfo = lambda index: types.SimpleNamespace(used=devices[index]["used_mb"] * MIB)
    return module


def nvml_sampler(monkeypatch, devices: dict[int, dict]) -> tuple[NvmlSampler, types.ModuleType]:
    module = fake_pynvml(devices)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    sampler, message = open_gpu_sampler(None)
    assert isinstance(sampler, NvmlSampler) and message == "GPU sampler nvml"
    return sampler, module


def test_nvml_uses_the_jobs_processes_where_the_driver_reports_them(monkeypatch):
    devices = {
        0: {
            "util": 100,  # another tenant's figure must not be used: the job's process is listed
            "used_mb": 30_000,
            "processes": [(10, 2000 * MIB), (11, 1000 * MIB), (99, 5000 * MIB)],
            "samples": [(10, 100, 3), (11, 200, 4), (99, 300, 97)],
        }
    }
    sampler, module = nvml_sampler(monkeypatch, devices)
    now = [100.0]
    probe = NvmlProbe(module, [0], clock=lambda: now[0])
    assert probe.read({10, 11}) == GpuReading(4, 3000)
    # Only samples newer than the last seen are asked for. None newer: the driver samples each
    # process now and then, so the last figure stands for a while (a busy H200 read 0.5 s apart
    # had no new sample half of the time), then the GPU counts as idle.
    assert probe.read({10, 11}) == GpuReading(4, 3000)
    now[0] += STALE_SAMPLE_S
    assert probe.read({10, 11}) == GpuReading(0, 3000)
    assert [call for call in module.calls if call[0] == "utilisation"] == [
        ("utilisation", 0, 0),
        ("utilisation", 0, 300),
        ("utilisation", 0, 300),
    ]
    sampler.close()
    assert "shutdown" in module.calls


def test_nvml_falls_back_to_the_device_when_it_cannot_attribute(monkeypatch):
    devices = {
        0: {"util": 55, "used_mb": 7000, "processes": [(99, MIB)], "samples": []},  # not the job's pids
        1: {"util": 12, "used_mb": 1000, "processes": [(10, MIB)], "samples_error": 3},  # not supported
    }
    sampler, _ = nvml_sampler(monkeypatch, devices)
    reading = sampler.probe([0, 1]).read({10})
    assert reading == GpuReading(55, 8000)  # the busiest GPU, the memory of both


def test_nvml_no_sample_since_the_last_read_is_idle(monkeypatch):
    # pynvml raises NVMLError(NVML_SUCCESS) when the driver has no sample to size.
    devices = {0: {"util": 80, "used_mb": 100, "processes": [(10, MIB)], "samples_error": 0}}
    sampler, _ = nvml_sampler(monkeypatch, devices)
    assert sampler.probe([0]).read({10}) == GpuReading(0, 1)


def test_nvml_skips_a_failing_device_and_gives_no_reading_when_none_answers(monkeypatch):
    devices = {0: {"util": 20, "used_mb": 100, "processes": [], "samples": []}}
    sampler, _ = nvml_sampler(monkeypatch, devices)
    assert sampler.probe([0, 5]).read(set()) == GpuReading(20, 100)
    assert sampler.probe([5]).read(set()) is None


def test_each_gpu_of_the_worker_is_read_for_its_heartbeat(monkeypatch, tmp_path: Path):
    devices = {0: {"util": 91, "used_mb": 7000, "processes": [], "samples": []}}
    sampler, _ = nvml_sampler(monkeypatch, devices)
    assert sampler.read_devices([0, 1]) == [DeviceReading(0, 91, 7000)], (
        "a GPU that cannot be read is left out"
    )
    gpu_file = tmp_path / "gpu.json"
    gpu_file.write_text('{"util_pct": 40, "mem_used_mb": 10}')
    assert FakeGpuSampler(gpu_file).read_devices([0, 1]) == [
        DeviceReading(0, 40, 10),
        DeviceReading(1, 40, 10),
    ]
    gpu_file.write_text("{")
    assert FakeGpuSampler(gpu_file).read_devices([0, 1]) == []
