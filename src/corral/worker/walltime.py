"""A job's ``walltime_s`` as a limit (API.md "Time limits"), as a pure state machine.

The worker ends an attempt ``walltime_s`` after it started, whatever the job is doing: unlike the
budget watchdog (seed 004: re-queued, then failed after the cap), reaching the limit is the job's
own doing, so the attempt fails with reason ``walltime_exceeded`` and is not retried (Slurm's
TIMEOUT). A job that checkpoints (``auto`` / ``manual``) is first given the checkpoint hint
``CORRAL_WALLTIME_WARNING_S`` before the limit (at once when its whole walltime is shorter), so the
next run, which its user submits, can resume: what it saves is uploaded like any attempt's.

The limit counts from the claim (when the worker had the job), not from the spawn: the server's
``deadline_at`` is the claim's time plus the limit, and the work planned around it (backfill,
reservations) must not find the job still running past it because the worker was slow to fetch
a checkpoint.

Driven like a watchdog by the attempt's thread (``JobRun._supervise``): ``start(now)``,
``next_due()``, ``tick(now)``, times monotonic; no I/O, no clock of its own.
"""

from __future__ import annotations

import enum
import math
from typing import Any

from corral.config import WorkerSettings

#: the checkpoint modes whose jobs get the hint before the limit
HINTED_MODES = frozenset({"auto", "manual"})


class Step(enum.Enum):
    WARN = "warn"  # send the checkpoint hint
    STOP = "stop"  # the limit is reached: stop the job


class WalltimeLimit:
    """One attempt's limit: a warning ``warning_s`` before it (None: no warning), then the stop."""

    def __init__(self, walltime_s: float, warning_s: float | None) -> None:
        self.walltime_s = walltime_s
        self.warning_s = warning_s
        self.deadline = math.inf
        self._warn_at = math.inf

    def start(self, now: float) -> None:
        self.deadline = now + self.walltime_s
        if self.warning_s is not None:
            self._warn_at = max(now, self.deadline - self.warning_s)

    def next_due(self) -> float:
        return min(self._warn_at, self.deadline)

    def tick(self, now: float) -> Step | None:
        """The step due at ``now``, each once: the warning first, then the stop (a late tick that
        finds both due stops at once: a hint then would only race the SIGTERM)."""
        if now >= self.deadline:
            self.deadline = self._warn_at = math.inf
            return Step.STOP
        if now >= self._warn_at:
            self._warn_at = math.inf
            return Step.WARN
        return None


def walltime_limit(settings: WorkerSettings, walltime_s: Any, checkpoint_mode: str) -> WalltimeLimit | None:
    """The limit a claimed job gets: None when its ``walltime_s`` is not a positive number (no
    limit); a warning only for a job that checkpoints, when the worker's warning is not 0."""
    if isinstance(walltime_s, bool) or not isinstance(walltime_s, int | float):
        return None
    if not math.isfinite(walltime_s) or walltime_s <= 0:
        return None
    warning = settings.walltime_warning_s
    hinted = checkpoint_mode in HINTED_MODES and warning > 0
    return WalltimeLimit(float(walltime_s), warning if hinted else None)
