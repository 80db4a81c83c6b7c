"""The worker's parts on their own: the executor with real processes, report retries, resources."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.client import ApiError, ServerUnreachable
from corral.worker import resources
from corral.worker.executor import JobProcess, OutputTail, exit_code_of
from corral.worker.job_run import describe_exit
from corral.worker.main import default_address
from corral.worker.reporting import deliver
from corral.worker.workspace import visible_devices
from tests.e2e.conftest import process_gone, wait_for


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    """Log records of ``corral.worker``, whatever the ``corral`` logger's handlers are."""
    captured: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            captured.append(record)

    logger = logging.getLogger("corral.worker")
    handler = Keep(level=logging.DEBUG)
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield captured
    logger.removeHandler(handler)
    logger.setLevel(previous)


def start(command: str, tail_bytes: int = 1024, grace_s: float = 0.5) -> JobProcess:
    return JobProcess(command, dict(os.environ), tail_bytes, grace_s)


# --- executor --------------------------------------------------------------------------------


def test_exit_codes_follow_the_shell_convention():
    assert exit_code_of(3) == 3
    assert exit_code_of(-signal.SIGKILL) == 137
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(143) == "killed by signal SIGTERM"


def test_output_tail_keeps_the_last_bytes():
    tail = OutputTail(5)
    tail.append(b"abc")
    tail.append(b"defgh")
    assert tail.text() == "defgh"
    assert OutputTail(0).text() == ""


def test_a_job_writing_a_lot_never_blocks_and_keeps_its_tail():
    process = start(
        f"{sys.executable} -c \"import sys; sys.stdout.write('x' * 5_000_000); print('END')\"", 100
    )
    assert process.wait(20) == 0
    tail = process.finish()
    assert len(tail.encode()) == 100
    assert tail.endswith("END\n")


def test_one_pump_keeps_many_jobs_outputs_apart():
    """Every job's pipe is drained by the one output pump: each job gets exactly its own output,
    all of it, and its end is seen (``finish`` returns at once)."""
    processes = [start(f"for i in $(seq 200); do echo job{index}-$i; done", 1_000_000) for index in range(20)]
    for index, process in enumerate(processes):
        assert process.wait(20) == 0
        lines = process.finish().splitlines()
        assert lines == [f"job{index}-{step}" for step in range(1, 201)]


def test_stop_runs_once_for_concurrent_callers(tmp_path: Path):
    marker = tmp_path / "terms"
    process = start(
        f"trap 'echo term >> {marker}; exit 143' TERM; echo up > {tmp_path}/up; while :; do sleep 0.05; done"
    )
    wait_for(lambda: (tmp_path / "up").exists(), 5, "the job to start")
    results: list[bool] = []
    callers = [threading.Thread(target=lambda: results.append(process.stop())) for _ in range(4)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(10)
    assert results == [True] * 4
    assert marker.read_text().splitlines() == ["term"]
    assert process.poll() == 143
    assert process.stopped_while_running


def test_stop_of_an_exited_job_says_it_was_not_running():
    process = start("exit 0")
    assert process.wait(5) == 0
    assert process.stop() is False
    assert not process.stopped_while_running


def test_sigterm_ignored_means_sigkill_after_the_grace(tmp_path: Path):
    process = start(f"trap '' TERM; sleep 30 & echo $! > {tmp_path}/child; wait", grace_s=0.3)
    wait_for(lambda: (tmp_path / "child").exists(), 5, "the job to start")
    assert process.stop() is True
    assert process.poll() == 128 + signal.SIGKILL
    child = int((tmp_path / "child").read_text())
    wait_for(lambda: process_gone(child), 5, "the child to be killed with its group")


def test_processes_left_behind_are_stopped_when_the_job_exits(tmp_path: Path):
    process = start(f"sleep 30 & echo $! > {tmp_path}/child; echo bye", grace_s=0.3)
    assert process.wait(5) == 0
    assert "bye" in process.finish()
    child = int((tmp_path / "child").read_text())
    wait_for(lambda: process_gone(child), 5, "the leftover child to be stopped")
    assert not process.stopped_while_running


def test_visible_devices():
    assert visible_devices([]) == ""
    assert visible_devices([2, 0]) == "2,0"


# --- reports ---------------------------------------------------------------------------------


def test_a_report_is_retried_through_an_outage():
    calls: list[int] = []
    sleeps: list[float] = []

    def send() -> dict[str, str]:
        calls.append(1)
        if len(calls) < 3:
            raise ServerUnreachable("http://x", OSError("refused"))
        return {"status": "done"}

    assert deliver(send, "done report", {"job_id": "j-1"}, sleep=sleeps.append) == {"status": "done"}
    assert len(calls) == 3
    assert sleeps == [0.5, 1.0]


def test_a_refused_report_is_dropped_at_once(records: list[logging.LogRecord]):
    calls: list[int] = []

    def send() -> dict[str, str]:
        calls.append(1)
        raise ApiError(409, "stale_attempt", "not yours")

    assert deliver(send, "fail report", {"job_id": "j-1"}, sleep=lambda _: None) is None
    assert calls == [1]
    assert any(
        getattr(record, "job_id", None) == "j-1" and "stale_attempt" in record.getMessage()
        for record in records
    )


def test_a_report_gives_up_after_its_tries():
    calls: list[int] = []

    def send() -> dict[str, str]:
        calls.append(1)
        raise ApiError(503, "unavailable", "busy")

    assert deliver(send, "done report", {}, tries=3, sleep=lambda _: None) is None
    assert len(calls) == 3


# --- resources and identity ------------------------------------------------------------------


def test_flags_win_and_nvml_is_not_asked_when_gpus_are_given(monkeypatch: pytest.MonkeyPatch):
    def refuse() -> resources.GpuInventory:
        raise AssertionError("NVML must not be asked")

    monkeypatch.setattr(resources, "detect_gpus", refuse)
    offer = resources.resolve_offer(3, 2048, 2, 16000, "A100", ["zone=a", "rack = 7"])
    assert offer.resources() == {"gpus": 2, "vram_mb": 16000, "memory_mb": 2048, "cpus": 3}
    assert offer.gpu_model == "A100"
    assert offer.labels == {"zone": "a", "rack": "7"}
    assert resources.resolve_offer(None, None, 0, None, None, []).gpus == 0


def test_no_nvml_means_no_gpus_and_one_info_line(
    monkeypatch: pytest.MonkeyPatch, records: list[logging.LogRecord]
):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    offer = resources.resolve_offer(None, None, None, None, None, [])
    assert offer.gpus == 0 and offer.vram_mb == 0 and offer.gpu_model is None
    assert offer.cpus == os.cpu_count()
    assert offer.memory_mb > 0
    lines = [record for record in records if record.getMessage().startswith("no GPU sampler")]
    assert len(lines) == 1
    assert lines[0].levelno == logging.INFO
    assert lines[0].getMessage().startswith("no GPU sampler: NVML not available (")


def test_a_broken_nvml_means_no_gpus(monkeypatch: pytest.MonkeyPatch):
    class BrokenNvml:
        @staticmethod
        def nvmlInit() -> None:
            raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", BrokenNvml)
    assert resources.detect_gpus() == resources.GpuInventory()


def test_a_bad_label_is_refused():
    with pytest.raises(SystemExit, match="bad label"):
        resources.parse_labels(["novalue"])


@pytest.mark.parametrize(
    ("server", "loopback"),
    [
        ("http://127.0.0.1:8765", True),
        ("http://localhost:8765", True),
        ("http://[::1]:8765", True),
        ("http://scheduler.example:8765", False),
        ("http://10.0.0.5:8765", False),
    ],
)
def test_default_address(server: str, loopback: bool):
    assert (default_address(server) == "127.0.0.1") is loopback


def test_nvml_inventory_counts_gpus_and_takes_the_smallest_vram(monkeypatch: pytest.MonkeyPatch):
    class Memory:
        def __init__(self, total_mb: int) -> None:
            self.total = total_mb * 1024 * 1024

    class FakeNvml:
        shut_down = False

        @staticmethod
        def nvmlInit() -> None:
            pass

        @staticmethod
        def nvmlShutdown() -> None:
            FakeNvml.shut_down = True

        @staticmethod
        def nvmlDeviceGetCount() -> int:
            return 2

        @staticmethod
        def nvmlDeviceGetHandleByIndex(index: int) -> int:
            return index

        @staticmethod
        def nvmlDeviceGetName(handle: int) -> bytes | str:
            return b"NVIDIA H100 80GB HBM3" if handle == 0 else "NVIDIA H100 80GB HBM3"

        @staticmethod
        def nvmlDeviceGetMemoryInfo(handle: int) -> Memory:
            return Memory(81559 if handle == 0 else 81000)

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml)
    offer = resources.resolve_offer(8, 1024, None, None, None, [])
    assert (offer.gpus, offer.vram_mb, offer.gpu_model) == (2, 81000, "NVIDIA H100 80GB HBM3")
    assert FakeNvml.shut_down
    # A flag still wins over what NVML saw.
    assert resources.resolve_offer(8, 1024, 1, None, None, []).gpus == 1
