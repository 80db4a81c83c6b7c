"""One loop per running job that drives its watchdogs: beats in, readings in, a trip out.

Where it runs: on the attempt's own thread while it waits for the job's process
(``JobRun._supervise``), which makes no HTTP call meanwhile (the heartbeats are the agent's), so a
slow server never delays a watchdog. The job is a separate process, so nothing it does (a CUDA call that never
returns, a GIL held forever) can stop this loop.

Why it costs almost nothing: the loop sleeps until the earliest moment a watchdog needs it
(``next_due``), and wakes at least every ``beat_poll_s`` (1 s at default settings) only to
``os.stat`` the beat file: a beat is seen from the file's (mtime, size, inode) changing, the file
is never read on a tick. Readings (the psutil walk of the process tree and the GPU probe) are taken
only when a watchdog asks: every few seconds for the GPU-health watchdog of a GPU job, and
``stall_confirm_samples`` times once a stall is suspected.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from corral.config import WorkerSettings
from corral.domain.clock import to_rfc3339
from corral.worker import job_files
from corral.worker.samplers import GpuProbe, MemorySampler
from corral.worker.watchdogs import (
    BudgetWatchdog,
    GpuHealthWatchdog,
    Reading,
    StallWatchdog,
    Thresholds,
    Verdict,
    Watchdog,
)

logger = logging.getLogger("corral.worker.watch")

# Bounds on how often the loop looks at the beat file and the GPU-health watchdog reads: a tenth
# of the window each serves, never more often than every 50 ms (tests) or less than every 1 s / 5 s.
BEAT_POLL_BOUNDS_S = (0.05, 1.0)
HEALTH_SAMPLE_BOUNDS_S = (0.05, 5.0)
# After an unexpected error in a tick, the loop waits this long before trying again.
ERROR_PAUSE_S = 1.0
# The shortest sleep between two ticks, so a watchdog that is due again at once cannot spin.
MIN_WAIT_S = 0.005


def _clamp(value: float, bounds: tuple[float, float]) -> float:
    return min(bounds[1], max(bounds[0], value))


class BeatFile:
    """``CORRAL_BEAT_FILE``: any write is a beat. Seen by ``stat`` alone; read only for a report."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._signature: tuple[int, int, int] | None = None

    def changed(self) -> bool:
        try:
            status = os.stat(self.path)
        except OSError:
            return False
        signature = (status.st_mtime_ns, status.st_size, status.st_ino)
        if signature == self._signature:
            return False
        self._signature = signature
        return True

    def step(self) -> str | None:
        """What the job last wrote (its step, by convention), for the trip's detail: the first
        ``BEAT_BYTES`` of a regular file, read without waiting (``corral.worker.job_files``)."""
        raw = job_files.read_head(self.path, job_files.BEAT_BYTES)
        text = raw.decode(errors="replace").strip() if raw else ""
        return text or None

    def progress_step(self) -> int | None:
        """The step for the heartbeat's ``progress``: a plain integer any heartbeat can carry, else
        None (a job that writes anything else beats all the same, it only shows no step)."""
        return job_files.parse_step(job_files.read_value(self.path, job_files.BEAT_BYTES))


class JobProbe:
    """Reads a job: its process tree's memory (always) and, for a GPU job, its GPUs."""

    def __init__(self, root_pid: int, memory: MemorySampler, gpu: GpuProbe | None) -> None:
        self.root_pid = root_pid
        self._memory = memory
        self._gpu = gpu

    def read(self) -> Reading:
        tree = self._memory.read(self.root_pid)
        gpu = None
        if self._gpu is not None:
            gpu = self._gpu.read(tree.pids if tree is not None else {self.root_pid})
        return Reading(
            gpu_util_pct=gpu.util_pct if gpu is not None else None,
            gpu_memory_mb=gpu.memory_used_mb if gpu is not None else None,
            memory_mb=tree.memory_mb if tree is not None else None,
        )


class JobWatch:
    """The watchdogs of one attempt, their beat source and their probe; ``tick`` is the loop body.

    ``tick(now)`` is synchronous and takes the time as an argument, so a test drives a whole job's
    watch with a fake clock; ``JobRun._supervise`` runs it on the real clock.
    """

    def __init__(
        self,
        watchdogs: Sequence[Watchdog],
        beat_file: BeatFile,
        read: Callable[[], Reading],
        beat_poll_s: float,
        fields: Mapping[str, Any],
        extra_detail: Mapping[str, Any] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.watchdogs = list(watchdogs)
        self.beat_file = beat_file
        self.beat_poll_s = beat_poll_s
        self.fields = dict(fields)
        self.tripped: Verdict | None = None
        self._read = read
        self._extra_detail = dict(extra_detail or {})
        self._wall_clock = wall_clock
        self._started_at = 0.0
        self._next_beat_check = math.inf
        self._stop = threading.Event()

    # --- the pure part -----------------------------------------------------------------------

    def start(self, now: float) -> None:
        self._started_at = now
        self._next_beat_check = now
        for watchdog in self.watchdogs:
            watchdog.start(now)

    def next_due(self) -> float:
        return min([self._next_beat_check, *(watchdog.next_due() for watchdog in self.watchdogs)])

    def tick(self, now: float) -> Verdict | None:
        """Look for a beat when due, then let every due watchdog act; the trip, if one tripped."""
        if self.tripped is not None:
            return None
        if now >= self._next_beat_check:
            self._next_beat_check = now + self.beat_poll_s
            if self.beat_file.changed():
                for watchdog in self.watchdogs:
                    watchdog.beat(now)
        taken: list[Reading] = []

        def read_once() -> Reading:
            if not taken:
                taken.append(self._read())
            return taken[0]

        for watchdog in self.watchdogs:
            verdict = watchdog.tick(now, read_once)
            if verdict is None:
                continue
            detail = self._wall_times(verdict.detail, now)
            if verdict.tripped:
                self.tripped = Verdict(verdict.kind, True, self._complete(detail, now))
                return self.tripped
            logger.info(
                "stall suspected but the job is busy or its memory moved; re-armed",
                extra={**self.fields, "watchdog": verdict.kind, "detail": detail},
            )
        return None

    def _wall_times(self, detail: Mapping[str, Any], now: float) -> dict[str, Any]:
        """Monotonic ``*_at`` values as RFC 3339 times: what a person reading the event needs."""
        wall_now = self._wall_clock()
        return {
            key: to_rfc3339(wall_now - (now - value))
            if key.endswith("_at") and isinstance(value, int | float) and math.isfinite(value)
            else value
            for key, value in detail.items()
        }

    def _complete(self, detail: dict[str, Any], now: float) -> dict[str, Any]:
        return {
            **detail,
            "elapsed_s": round(now - self._started_at, 3),
            "last_step": self.beat_file.step(),
            **self._extra_detail,
        }

    # --- stopping ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop looking (the job ended or is being stopped); returns at once."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()


def _positive_seconds(value: Any) -> float | None:
    """A claim's duration when it is a finite positive number; None (the worker's default) else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    seconds = float(value)
    return seconds if math.isfinite(seconds) and seconds > 0 else None


class ClaimFields(Protocol):
    """What ``build_watch`` reads of a claim (a ``ClaimAnswer``, or a plain mapping in tests)."""

    def get(self, name: str, default: Any = None) -> Any: ...


def build_watch(
    settings: WorkerSettings,
    claim: ClaimFields,
    gpu_indices: Sequence[int],
    beat_path: Path,
    probe: JobProbe,
    gpu_sampler_name: str | None,
    fields: Mapping[str, Any],
) -> JobWatch:
    """The watchdogs a claimed job gets (C.4, with corral's choices):

    - every job: the budget (the job's ``budget_s``, else the worker's default for its kind) and
      the stall watchdog (the job's ``stall_timeout_s``, else the worker's), inert until a beat;
    - a job holding GPUs, on a worker with a GPU sampler: the GPU-health watchdog. Without a
      sampler it is left out: judged on memory alone it would kill a healthy job that neither
      beats nor moves its memory, which a busy GPU job may well do.
    """
    thresholds = Thresholds(settings.gpu_idle_pct, settings.ram_delta_mb)
    holds_gpus = bool(gpu_indices)
    job_budget = _positive_seconds(claim.get("budget_s"))
    budget = (
        BudgetWatchdog(job_budget, "job")
        if job_budget is not None
        else BudgetWatchdog(settings.default_budget_s(holds_gpus), "worker")
    )
    stall_timeout_s = _positive_seconds(claim.get("stall_timeout_s")) or settings.stall_timeout_s
    stall = StallWatchdog(
        stall_timeout_s, settings.stall_confirm_samples, settings.stall_confirm_poll_s, thresholds
    )
    watchdogs: list[Watchdog] = [budget, stall]
    beat_poll_s = _clamp(stall_timeout_s / 10, BEAT_POLL_BOUNDS_S)
    if holds_gpus and gpu_sampler_name is not None:
        window_s = settings.gpu_health_window_s
        sample_every_s = _clamp(window_s / 10, HEALTH_SAMPLE_BOUNDS_S)
        watchdogs.append(GpuHealthWatchdog(window_s, settings.gpu_health_grace_s, sample_every_s, thresholds))
        beat_poll_s = min(beat_poll_s, _clamp(window_s / 10, BEAT_POLL_BOUNDS_S))
    extra = {"gpu_sampler": gpu_sampler_name if holds_gpus else None, "gpu_indices": list(gpu_indices)}
    return JobWatch(watchdogs, BeatFile(beat_path), probe.read, beat_poll_s, fields, extra)
