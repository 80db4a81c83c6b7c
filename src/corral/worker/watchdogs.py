"""The three watchdogs of a running job, as pure state machines (seed 004, semantics C.5 to C.7).

Each watchdog is driven by its job's loop (``corral.worker.job_watch``) through four calls, and
does no I/O and reads no clock of its own, so a test drives it with plain numbers:

- ``start(now)`` when the job's process has started;
- ``beat(now)`` when the job reported progress (a write to its beat file);
- ``next_due()``: the time the watchdog next needs a tick (``math.inf``: nothing scheduled), so the
  loop sleeps until then instead of polling;
- ``tick(now, read)``: act if due. ``read()`` returns a ``Reading`` of the job's GPUs and memory;
  the loop memoises it per tick, so watchdogs that sample at the same moment share one read.
  Returns a ``Verdict`` when the watchdog decided something (a trip, or a suspicion cleared),
  else None. After a trip a watchdog stays silent.

Times are monotonic seconds. Detail keys ending in ``_at`` hold such times; the loop turns them
into wall-clock timestamps before the detail leaves the worker.

"Idle and static", shared by the stall and GPU-health watchdogs (``judge``): the highest GPU
utilisation over the window is at or under ``gpu_idle_pct``, and the memory of the job's process
tree (and the GPU memory in use, where the sampler gives it) spread less than ``ram_delta_mb``
between its lowest and highest readings: a swing inside the window counts even when both ends
match. A missing memory reading counts as static (the source's choice: a wedged job that cannot
be read is still wedged). GPU readings are required by the GPU-health watchdog only: the stall
watchdog, whose suspicion already rests on the job's silence, confirms on memory alone when no
GPU figure exists (a CPU job, or no GPU sampler on the worker).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Reading:
    """One look at a job; None where the sampler had nothing to say."""

    gpu_util_pct: float | None = None
    gpu_memory_mb: float | None = None
    memory_mb: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        return {
            "gpu_util_pct": self.gpu_util_pct,
            "gpu_memory_mb": self.gpu_memory_mb,
            "memory_mb": None if self.memory_mb is None else round(self.memory_mb, 1),
        }


@dataclass(frozen=True)
class Verdict:
    """What a watchdog decided: ``tripped`` (stop the job) or a suspicion it cleared."""

    kind: str  # budget / stall / gpu_health, the names of POST /jobs/{id}/watchdog
    tripped: bool
    detail: dict[str, Any]


@dataclass(frozen=True)
class Thresholds:
    gpu_idle_pct: float = 5.0
    ram_delta_mb: float = 5120.0


@dataclass(frozen=True)
class Judgement:
    idle_and_static: bool
    gpu_util_max_pct: float | None
    memory_deviation_mb: float
    gpu_memory_deviation_mb: float
    gpu_readings: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_util_max_pct": self.gpu_util_max_pct,
            "memory_deviation_mb": round(self.memory_deviation_mb, 1),
            "gpu_memory_deviation_mb": round(self.gpu_memory_deviation_mb, 1),
            "gpu_readings": self.gpu_readings,
        }


def spread(values: Sequence[float]) -> float:
    """Highest minus lowest; 0 for no value (nothing seen moving)."""
    return max(values) - min(values) if values else 0.0


def judge(readings: Sequence[Reading], thresholds: Thresholds, gpu_required: bool) -> Judgement:
    """Idle and static over ``readings`` (see the module docstring).

    With ``gpu_required``, GPU readings must cover at least half the readings (and two of them):
    a window the sampler mostly missed proves nothing about the GPUs.
    """
    utilisations = [r.gpu_util_pct for r in readings if r.gpu_util_pct is not None]
    memory = spread([r.memory_mb for r in readings if r.memory_mb is not None])
    gpu_memory = spread([r.gpu_memory_mb for r in readings if r.gpu_memory_mb is not None])
    util_max = max(utilisations) if utilisations else None
    if gpu_required and len(utilisations) < max(2, math.ceil(len(readings) / 2)):
        gpu_idle = False
    else:
        gpu_idle = util_max is None or util_max <= thresholds.gpu_idle_pct
    static = memory < thresholds.ram_delta_mb and gpu_memory < thresholds.ram_delta_mb
    return Judgement(gpu_idle and static, util_max, memory, gpu_memory, len(utilisations))


Read = Callable[[], Reading]


class Watchdog(Protocol):
    kind: str

    def start(self, now: float) -> None: ...

    def beat(self, now: float) -> None: ...

    def next_due(self) -> float: ...

    def tick(self, now: float, read: Read) -> Verdict | None: ...


class BudgetWatchdog:
    """Trips once ``budget_s`` has passed since the start, whatever the job is doing (C.5)."""

    kind = "budget"

    def __init__(self, budget_s: float, source: str = "job") -> None:
        self.budget_s = budget_s
        self.source = source  # "job" (its budget_s) or "worker" (the worker's default)
        self._started_at: float | None = None
        self._deadline = math.inf

    def start(self, now: float) -> None:
        self._started_at = now
        self._deadline = now + self.budget_s

    def beat(self, now: float) -> None:
        """Progress does not buy time: the budget bounds the whole attempt."""

    def next_due(self) -> float:
        return self._deadline

    def tick(self, now: float, read: Read) -> Verdict | None:
        if now < self._deadline or self._started_at is None:
            return None
        self._deadline = math.inf
        detail = {
            "budget_s": self.budget_s,
            "budget_source": self.source,
            "elapsed_s": round(now - self._started_at, 3),
            "started_at": self._started_at,
            "deadline_at": self._started_at + self.budget_s,
        }
        return Verdict(self.kind, True, detail)


class StallWatchdog:
    """No progress for ``timeout_s``, confirmed idle and static, trips (C.6).

    States: inert (no beat yet: a job loading its model is never policed) -> armed (deadline =
    last beat + timeout) -> confirming (``confirm_samples`` reads, ``confirm_poll_s`` apart, from
    the deadline on) -> tripped, or armed again from the last read when the job turned out busy or
    its memory moved. A beat while confirming proves progress and re-arms from the beat.
    """

    kind = "stall"

    def __init__(
        self, timeout_s: float, confirm_samples: int, confirm_poll_s: float, thresholds: Thresholds
    ) -> None:
        self.timeout_s = timeout_s
        self.confirm_samples = max(1, confirm_samples)
        self.confirm_poll_s = confirm_poll_s
        self.thresholds = thresholds
        self.beats = 0
        self.last_beat_at: float | None = None
        self._deadline: float | None = None
        self._confirming: list[Reading] | None = None
        self._suspected_at = math.inf
        self._next_read_at = math.inf

    @property
    def state(self) -> str:
        if self._confirming is not None:
            return "confirming"
        return "inert" if self._deadline is None else "armed"

    def start(self, now: float) -> None:
        """Inert until the first beat."""

    def beat(self, now: float) -> None:
        self.beats += 1
        self.last_beat_at = now
        self._deadline = now + self.timeout_s
        self._confirming = None

    def next_due(self) -> float:
        if self._confirming is not None:
            return self._next_read_at
        return math.inf if self._deadline is None else self._deadline

    def tick(self, now: float, read: Read) -> Verdict | None:
        if self._deadline is None or now < self.next_due():
            return None
        if self._confirming is None:
            self._confirming = []
            self._suspected_at = now
        self._confirming.append(read())
        if len(self._confirming) < self.confirm_samples:
            self._next_read_at = now + self.confirm_poll_s
            return None
        readings, self._confirming = self._confirming, None
        judgement = judge(readings, self.thresholds, gpu_required=False)
        detail = {
            "stall_timeout_s": self.timeout_s,
            "last_beat_at": self.last_beat_at,
            "deadline_at": self._deadline,
            "suspected_at": self._suspected_at,
            "beats": self.beats,
            "samples": [reading.to_dict() for reading in readings],
            **judgement.to_dict(),
            "gpu_confirmation": judgement.gpu_readings > 0,
            "gpu_idle_pct": self.thresholds.gpu_idle_pct,
            "ram_delta_mb": self.thresholds.ram_delta_mb,
        }
        if judgement.idle_and_static:
            self._deadline = None
            return Verdict(self.kind, True, detail)
        self._deadline = now + self.timeout_s
        return Verdict(self.kind, False, detail)


class GpuHealthWatchdog:
    """A whole window with the job's GPUs idle and its memory static trips (C.7).

    Armed at start with a first window of ``grace_s`` (model loading), then windows of
    ``window_s``; every beat starts a fresh window. Within a window a reading is taken every
    ``sample_every_s``; at the window's end the readings are judged: idle and static trips, anything
    else opens the next window, whose first reading is the one just taken.
    """

    kind = "gpu_health"

    def __init__(
        self, window_s: float, grace_s: float, sample_every_s: float, thresholds: Thresholds
    ) -> None:
        self.window_s = window_s
        self.grace_s = grace_s
        self.sample_every_s = sample_every_s
        self.thresholds = thresholds
        self.windows_judged = 0
        self._readings: list[Reading] = []
        self._window_start = math.inf
        self._window_end = math.inf
        self._next_read_at = math.inf
        self._first_window = True

    def _open(self, now: float, length: float, readings: list[Reading]) -> None:
        self._window_start = now
        self._window_end = now + length
        self._readings = readings
        self._next_read_at = now + self.sample_every_s if readings else now

    def start(self, now: float) -> None:
        self._first_window = True
        self._open(now, self.grace_s, [])

    def beat(self, now: float) -> None:
        if self._window_end == math.inf:
            return  # not started, or tripped
        self._first_window = False
        self._open(now, self.window_s, [])

    def next_due(self) -> float:
        return min(self._next_read_at, self._window_end)

    def tick(self, now: float, read: Read) -> Verdict | None:
        if now < self.next_due():
            return None
        reading = read()
        self._readings.append(reading)
        self._next_read_at = now + self.sample_every_s
        if now < self._window_end:
            return None
        self.windows_judged += 1
        judgement = judge(self._readings, self.thresholds, gpu_required=True)
        if not judgement.idle_and_static:
            self._first_window = False
            self._open(now, self.window_s, [reading])
            return None
        detail = {
            "window_s": self.grace_s if self._first_window else self.window_s,
            "first_window": self._first_window,
            "window_started_at": self._window_start,
            "window_ended_at": now,
            "samples": len(self._readings),
            **judgement.to_dict(),
            "gpu_idle_pct": self.thresholds.gpu_idle_pct,
            "ram_delta_mb": self.thresholds.ram_delta_mb,
            "first_sample": self._readings[0].to_dict(),
            "last_sample": reading.to_dict(),
        }
        self._window_end = self._next_read_at = math.inf
        return Verdict(self.kind, True, detail)
