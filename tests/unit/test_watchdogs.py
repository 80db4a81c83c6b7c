"""The watchdogs as pure units: a fake clock (plain numbers) and scripted readings, no processes."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import pytest

from corral.config import WorkerSettings
from corral.worker.job_watch import BeatFile, JobProbe, JobWatch, build_watch
from corral.worker.samplers import GpuReading, TreeReading
from corral.worker.watchdogs import (
    BudgetWatchdog,
    GpuHealthWatchdog,
    Reading,
    StallWatchdog,
    Thresholds,
    judge,
)

THRESHOLDS = Thresholds(gpu_idle_pct=5, ram_delta_mb=5120)
IDLE = Reading(gpu_util_pct=0, memory_mb=8000)
BUSY = Reading(gpu_util_pct=90, memory_mb=8000)


class Script:
    """Readings handed out in order (the last one repeats); counts how many were taken."""

    def __init__(self, readings: Iterable[Reading]) -> None:
        self.readings = list(readings)
        self.taken = 0

    def __call__(self) -> Reading:
        reading = self.readings[min(self.taken, len(self.readings) - 1)]
        self.taken += 1
        return reading


def always(reading: Reading) -> Script:
    return Script([reading])


def stall(timeout_s: float = 120, samples: int = 3, poll_s: float = 1) -> StallWatchdog:
    watchdog = StallWatchdog(timeout_s, samples, poll_s, THRESHOLDS)
    watchdog.start(0)
    return watchdog


def run_until(watchdog, read, start: float, end: float, step: float = 0.5):
    """Tick every ``step`` from ``start`` to ``end``; the first verdict and when it came."""
    now = start
    while now <= end + 1e-9:
        verdict = watchdog.tick(now, read)
        if verdict is not None:
            return now, verdict
        now = round(now + step, 6)
    return None, None


# --- idle and static -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("readings", "gpu_required", "expected"),
    [
        ([IDLE, IDLE, IDLE], False, True),
        ([IDLE, Reading(gpu_util_pct=6, memory_mb=8000), IDLE], False, False),  # busy once
        ([IDLE, Reading(gpu_util_pct=5, memory_mb=8000), IDLE], False, True),  # at the threshold
        ([IDLE, Reading(gpu_util_pct=0, memory_mb=14000), IDLE], False, False),  # spike in the middle
        ([IDLE, Reading(gpu_util_pct=0, memory_mb=2000), IDLE], False, False),  # dip in the middle
        ([IDLE, Reading(gpu_util_pct=0, memory_mb=13000), IDLE], False, True),  # moved < delta
        ([IDLE, IDLE, Reading(gpu_util_pct=0, memory_mb=8000, gpu_memory_mb=9000)], False, True),
        ([Reading(0, 0, 8000), Reading(0, 9000, 8000)], False, False),  # GPU memory moving
        ([Reading(memory_mb=1), Reading(memory_mb=2)], False, True),  # no GPU figure: memory alone
        ([Reading(memory_mb=1), Reading(memory_mb=2)], True, False),  # ... unless GPUs are required
        ([Reading(), Reading()], False, True),  # nothing readable counts as static (the source's choice)
        ([IDLE, Reading(memory_mb=8000), Reading(memory_mb=8000)], True, False),  # GPU mostly unread
        ([IDLE, IDLE, Reading(memory_mb=8000)], True, True),
    ],
)
def test_idle_and_static(readings, gpu_required, expected):
    assert judge(readings, THRESHOLDS, gpu_required).idle_and_static is expected


# --- budget ----------------------------------------------------------------------------------


def test_budget_trips_at_the_budget_and_not_before():
    watchdog = BudgetWatchdog(30, "job")
    watchdog.start(100)
    read = always(IDLE)
    assert watchdog.next_due() == 130
    watchdog.beat(120)  # progress buys no time
    assert watchdog.tick(129.99, read) is None
    verdict = watchdog.tick(130, read)
    assert verdict is not None and verdict.tripped and verdict.kind == "budget"
    assert verdict.detail["budget_s"] == 30 and verdict.detail["elapsed_s"] == 30
    assert verdict.detail["budget_source"] == "job"
    assert read.taken == 0  # the budget never samples
    assert watchdog.tick(200, read) is None  # a trip is said once


@pytest.mark.parametrize(
    ("claim_budget", "setting", "gpus", "expected", "source"),
    [
        (None, None, [0], 8100, "worker"),
        (None, None, [], 2100, "worker"),
        (None, 600, [0], 600, "worker"),
        (45, 600, [], 45, "job"),
    ],
)
def test_budget_comes_from_the_job_else_the_worker_default(
    tmp_path: Path, claim_budget, setting, gpus, expected, source
):
    settings = WorkerSettings(budget_s=setting)
    probe = JobProbe(1, NoMemory(), None)
    watch = build_watch(settings, {"budget_s": claim_budget}, gpus, tmp_path / "beat", probe, "fake", {})
    budget = watch.watchdogs[0]
    assert isinstance(budget, BudgetWatchdog)
    assert (budget.budget_s, budget.source) == (expected, source)


# --- stall -----------------------------------------------------------------------------------


def test_stall_is_inert_before_the_first_beat():
    watchdog = stall(timeout_s=10)
    read = always(IDLE)
    assert watchdog.state == "inert" and watchdog.next_due() == math.inf
    assert run_until(watchdog, read, 0, 10_000, step=5) == (None, None)
    assert read.taken == 0


def test_stall_trips_when_silent_idle_and_static():
    watchdog = stall(timeout_s=120, samples=3, poll_s=1)
    watchdog.beat(10)
    read = always(IDLE)
    assert watchdog.next_due() == 130
    assert watchdog.tick(129.5, read) is None and read.taken == 0
    assert watchdog.tick(130, read) is None and watchdog.state == "confirming"
    assert watchdog.next_due() == 131
    assert watchdog.tick(130.5, read) is None and read.taken == 1  # not due: no read
    assert watchdog.tick(131, read) is None
    verdict = watchdog.tick(132, read)
    assert verdict is not None and verdict.tripped and verdict.kind == "stall"
    assert read.taken == 3
    detail = verdict.detail
    assert detail["last_beat_at"] == 10 and detail["deadline_at"] == 130 and detail["suspected_at"] == 130
    assert detail["gpu_util_max_pct"] == 0 and detail["memory_deviation_mb"] == 0
    assert len(detail["samples"]) == 3 and detail["gpu_confirmation"] is True
    assert watchdog.state == "inert" and watchdog.tick(500, read) is None


@pytest.mark.parametrize(
    ("name", "readings"),
    [
        ("GPU busy", [IDLE, BUSY, IDLE]),
        ("memory climbing", [Reading(0, None, 1000), Reading(0, None, 4000), Reading(0, None, 7000)]),
        ("memory spike, both ends equal", [IDLE, Reading(0, None, 20_000), IDLE]),
    ],
)
def test_stall_rearms_from_now_when_the_job_is_busy_or_moving(name, readings):
    watchdog = stall(timeout_s=120, samples=3, poll_s=1)
    watchdog.beat(0)
    read = Script(readings)
    when, verdict = run_until(watchdog, read, 0, 200, step=1)
    assert when == 122, name
    assert verdict is not None and not verdict.tripped
    assert watchdog.state == "armed" and watchdog.next_due() == 122 + 120
    # Idle and static from then on: the next suspicion is confirmed.
    when, verdict = run_until(watchdog, always(IDLE), 123, 400, step=1)
    assert (when, verdict.tripped) == (244, True)


def test_stall_without_gpu_figures_confirms_on_memory_alone():
    watchdog = stall(timeout_s=5, samples=2, poll_s=1)
    watchdog.beat(0)
    when, verdict = run_until(watchdog, always(Reading(memory_mb=300)), 0, 20, step=1)
    assert (when, verdict.tripped) == (6, True)
    assert verdict.detail["gpu_confirmation"] is False
    assert verdict.detail["gpu_util_max_pct"] is None


def test_each_beat_pushes_the_stall_deadline_and_a_beat_ends_a_confirmation():
    watchdog = stall(timeout_s=10, samples=3, poll_s=1)
    read = always(IDLE)
    for beat_at in (0, 8, 16, 24):
        watchdog.beat(beat_at)
        assert watchdog.tick(beat_at + 7, read) is None
    assert watchdog.next_due() == 34
    assert watchdog.tick(34, read) is None and watchdog.state == "confirming"
    watchdog.beat(34.5)
    assert watchdog.state == "armed" and watchdog.next_due() == 44.5
    assert watchdog.tick(35, read) is None


def test_one_confirmation_sample_decides_at_the_deadline():
    watchdog = stall(timeout_s=3, samples=1, poll_s=1)
    watchdog.beat(0)
    verdict = watchdog.tick(3, always(IDLE))
    assert verdict is not None and verdict.tripped


# --- GPU health ------------------------------------------------------------------------------


def health(window_s: float = 300, grace_s: float = 1200, sample_s: float = 5) -> GpuHealthWatchdog:
    watchdog = GpuHealthWatchdog(window_s, grace_s, sample_s, THRESHOLDS)
    watchdog.start(0)
    return watchdog


def test_gpu_health_has_a_grace_before_its_first_window():
    watchdog = health(window_s=300, grace_s=1200, sample_s=5)
    read = always(IDLE)
    when, verdict = run_until(watchdog, read, 0, 2000, step=5)
    assert when == 1200
    assert verdict.tripped and verdict.kind == "gpu_health"
    assert verdict.detail["first_window"] is True and verdict.detail["window_s"] == 1200
    assert verdict.detail["samples"] == 1200 / 5 + 1
    assert read.taken == 1200 / 5 + 1


def test_gpu_health_busy_then_idle_trips_one_window_later():
    watchdog = health(window_s=300, grace_s=60, sample_s=5)
    busy_until = 100

    def read() -> Reading:
        return BUSY if now < busy_until else IDLE

    verdict = None
    now = 0.0
    while verdict is None and now < 1000:
        verdict = watchdog.tick(now, read)
        now += 5
    # grace [0, 60] busy; window [60, 360] busy until 100; window [360, 660] idle: trips at 660
    assert verdict is not None and verdict.tripped
    assert now - 5 == 660
    assert verdict.detail["first_window"] is False and verdict.detail["window_s"] == 300


def test_a_beat_resets_the_gpu_health_window():
    watchdog = health(window_s=300, grace_s=60, sample_s=5)
    read = always(IDLE)
    assert run_until(watchdog, read, 0, 55, step=5) == (None, None)
    watchdog.beat(55)  # the load is done: a first full window starts now, not at 60
    assert watchdog.next_due() == 55
    assert run_until(watchdog, read, 55, 350, step=5) == (None, None)
    watchdog.beat(350)
    when, verdict = run_until(watchdog, read, 350, 1000, step=5)
    assert when == 650 and verdict.tripped
    assert verdict.detail["first_window"] is False


def test_gpu_health_memory_moving_opens_a_new_window():
    watchdog = health(window_s=100, grace_s=100, sample_s=10)
    moving = Script([IDLE] * 5 + [Reading(0, None, 15_000)] + [IDLE] * 100)
    when, verdict = run_until(watchdog, moving, 0, 1000, step=10)
    # the grace window [0, 100] saw a spike; [100, 200] is idle and static
    assert when == 200 and verdict.tripped


def test_gpu_health_does_not_trip_without_gpu_readings():
    watchdog = health(window_s=10, grace_s=10, sample_s=1)
    assert run_until(watchdog, always(Reading(memory_mb=100)), 0, 100, step=1) == (None, None)


# --- the job's loop --------------------------------------------------------------------------


class NoMemory:
    def read(self, root_pid: int) -> TreeReading | None:
        return None


class FixedGpu:
    def __init__(self, util: float) -> None:
        self.util = util
        self.pids_seen: list[frozenset[int]] = []

    def read(self, pids) -> GpuReading | None:
        self.pids_seen.append(frozenset(pids))
        return GpuReading(self.util, 1000)


class Tree:
    def read(self, root_pid: int) -> TreeReading | None:
        return TreeReading(500.0, frozenset({root_pid, root_pid + 1}))


def make_watch(tmp_path: Path, gpu_util: float | None, claim: dict | None = None, gpus=(0,), **settings):
    values = {"stall_timeout_s": 10, "stall_confirm_samples": 3, "stall_confirm_poll_s": 1}
    values |= {"gpu_health_window_s": 50, "gpu_health_grace_s": 100, **settings}
    gpu = FixedGpu(gpu_util) if gpu_util is not None else None
    probe = JobProbe(4242, Tree(), gpu)
    watch = build_watch(
        WorkerSettings(**values),
        claim or {},
        list(gpus),
        tmp_path / "beat",
        probe,
        "fake" if gpu else None,
        {"job_id": "j-1"},
    )
    return watch, gpu


def drive(watch: JobWatch, start: float, end: float):
    """Tick at every moment the watch asks for, like its thread; the trip and when it came."""
    now = start
    while now <= end:
        verdict = watch.tick(now)
        if verdict is not None:
            return now, verdict
        now = max(now + 0.001, watch.next_due())
    return None, None


def test_the_loop_sees_beats_by_stat_and_trips_a_silent_idle_job(tmp_path: Path):
    watch, gpu = make_watch(tmp_path, gpu_util=0)
    assert [w.kind for w in watch.watchdogs] == ["budget", "stall", "gpu_health"]
    assert watch.beat_poll_s == 1.0
    watch.start(0)
    assert drive(watch, 0, 5) == (None, None)
    (tmp_path / "beat").write_text("7\n")
    when, verdict = drive(watch, 5, 60)
    # the beat is seen at the next look (6, one beat poll after 5), deadline 16, confirmed 16..18
    assert when == 18 and verdict.kind == "stall"
    assert verdict.detail["last_step"] == "7"
    assert verdict.detail["gpu_sampler"] == "fake" and verdict.detail["gpu_indices"] == [0]
    assert verdict.detail["last_beat_at"].endswith("Z")
    assert gpu.pids_seen[-1] == {4242, 4243}  # the GPU probe is told the tree's processes
    assert watch.tick(100) is None  # once tripped, the loop says nothing more


def test_the_loop_never_stall_trips_a_job_that_never_beats(tmp_path: Path):
    watch, _ = make_watch(tmp_path, gpu_util=None, gpus=())
    assert [w.kind for w in watch.watchdogs] == ["budget", "stall"]
    watch.start(0)
    when, verdict = drive(watch, 0, 5000)
    assert (when, verdict.kind) == (2100, "budget")  # the CPU job's default budget, nothing before


def test_the_loop_keeps_a_busy_job_alive(tmp_path: Path):
    watch, _ = make_watch(tmp_path, gpu_util=80, claim={"budget_s": 10_000})
    watch.start(0)
    beat = tmp_path / "beat"
    beat.write_text("1")
    assert drive(watch, 0, 1000) == (None, None)


def test_the_jobs_own_stall_timeout_wins(tmp_path: Path):
    watch, _ = make_watch(tmp_path, gpu_util=0, claim={"stall_timeout_s": 2})
    assert watch.watchdogs[1].timeout_s == 2
    assert watch.beat_poll_s == pytest.approx(0.2)


def test_no_gpu_sampler_means_no_gpu_health_watchdog(tmp_path: Path):
    watch, _ = make_watch(tmp_path, gpu_util=None, gpus=(0, 1))
    assert [w.kind for w in watch.watchdogs] == ["budget", "stall"]


def test_beat_file_changes_are_seen_by_stat(tmp_path: Path):
    beat = BeatFile(tmp_path / "beat")
    assert not beat.changed() and beat.step() is None
    beat.path.write_text("1\n")
    assert beat.changed() and not beat.changed()
    beat.path.write_text("22\n")  # another size
    assert beat.changed()
    assert beat.step() == "22"


# --- settings --------------------------------------------------------------------------------


def test_worker_watchdog_settings_have_the_seed_defaults():
    settings = WorkerSettings()
    assert settings.budget_s is None
    assert (settings.default_budget_s(holds_gpus=True), settings.default_budget_s(holds_gpus=False)) == (
        8100,
        2100,
    )
    assert (settings.stall_timeout_s, settings.stall_confirm_samples, settings.stall_confirm_poll_s) == (
        120,
        3,
        1,
    )
    assert (settings.gpu_idle_pct, settings.ram_delta_mb) == (5, 5120)
    assert (settings.gpu_health_window_s, settings.gpu_health_grace_s) == (300, 1200)
    assert settings.gpu_sampler is None  # nvml where NVML loads, else none


@pytest.mark.parametrize("value", ["nvml", "none", "fake:/tmp/gpu.json"])
def test_gpu_sampler_setting_accepts_the_documented_values(value):
    assert WorkerSettings(gpu_sampler=value).gpu_sampler == value


@pytest.mark.parametrize("value", ["fake:", "rocm", ""])
def test_gpu_sampler_setting_refuses_anything_else(value):
    with pytest.raises(ValueError, match="nvml, none or fake"):
        WorkerSettings(gpu_sampler=value)
