"""The one runner every background loop goes through.

A loop is a named ``tick()`` (synchronous: load, decide, apply), run on a thread of its own (the
executor's lanes, ``executor.Lanes``, with the short switch interval) so a long pass (the admission
cycle over a large cluster) never holds up the event loop. The runner calls it every
``interval_s`` with a little jitter (so replicas do not tick in lockstep), times it into
``corral_scheduling_cycle_seconds{loop}``, logs a failing pass without dying, and counts it (a
pass the store failed is told to the server's ``StoreHealth`` too). A loop that stops for any other
reason (a bug in the runner itself) is fatal: ``LoopGroup.wait`` raises and the server exits
non-zero rather than run on without its reaper.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from corral.domain import errors
from corral.observability.metrics import Metrics
from corral.server.executor import Lanes

logger = logging.getLogger("corral.server.loops")

_WAKE_DEBOUNCE_S = 0.02


@dataclass
class Loop:
    name: str
    interval_s: float
    tick: Callable[[], None]
    jitter: float = 0.1
    #: whether this replica runs the loop now (PostgreSQL: an advisory lock per loop); None: always
    lead: Callable[[], bool] | None = None


#: told of a pass that failed because the store did (``store_health.StoreHealth.failed``)
StoreFailed = Callable[[errors.StoreUnavailable], None]


def _ignore(error: errors.StoreUnavailable) -> None:
    pass


class LoopRunner:
    def __init__(
        self, loop: Loop, metrics: Metrics, lanes: Lanes | None = None, store_failed: StoreFailed = _ignore
    ) -> None:
        self.loop = loop
        self.metrics = metrics
        self.store_failed = store_failed
        self.passes = 0
        self._woken: asyncio.Event | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None
        #: where the passes run (the server's executor's; a runner made alone, in a test: its own)
        self.lanes = lanes or Lanes(switch_interval_s=None)

    def wake(self) -> None:
        """Run the next pass soon instead of at the next interval (after a submit or a release).
        Safe from any thread: a pass or a store thread hands the wake-up to the event loop."""
        woken, event_loop = self._woken, self._event_loop
        if woken is None or event_loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is event_loop:
            woken.set()
        elif not event_loop.is_closed():
            event_loop.call_soon_threadsafe(woken.set)

    def leads(self) -> bool:
        leading = True
        if self.loop.lead is not None:
            try:
                leading = self.loop.lead()
            except Exception:
                logger.exception("loop leadership check failed", extra={"loop": self.loop.name})
                leading = False
        self.metrics.loop_leader.labels(loop=self.loop.name).set(1 if leading else 0)
        return leading

    def run_once(self) -> bool:
        """One pass where this replica leads the loop; True when it succeeded or was not ours to
        run. Never raises for a failing tick."""
        if not self.leads():
            return True
        started = time.perf_counter()
        try:
            self.loop.tick()
        except Exception as error:
            if isinstance(error, errors.StoreUnavailable):
                self.store_failed(error)
            self.metrics.loop_errors.labels(loop=self.loop.name).inc()
            logger.exception("loop pass failed", extra={"loop": self.loop.name})
            return False
        finally:
            self.passes += 1
            self.metrics.cycle_seconds.labels(loop=self.loop.name).observe(time.perf_counter() - started)
        return True

    async def run_forever(self) -> None:
        rng = random.Random()  # noqa: S311 (jitter of a loop's interval, not a secret)
        self._woken = asyncio.Event()
        self._event_loop = asyncio.get_running_loop()
        while True:
            jitter = self.loop.interval_s * self.loop.jitter * rng.random()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), self.loop.interval_s + jitter)
            if self._woken.is_set():
                # Debounce: a burst of submits makes one pass, not one each.
                await asyncio.sleep(_WAKE_DEBOUNCE_S)
                self._woken.clear()
            await self.lanes.run(self.loop.name, self.run_once)


class LoopGroup:
    """Starts every loop as a task; ``stop`` cancels them; a loop that ends by itself is fatal."""

    def __init__(
        self,
        loops: list[Loop],
        metrics: Metrics,
        lanes: Lanes | None = None,
        store_failed: StoreFailed = _ignore,
    ) -> None:
        """``lanes``: the threads the passes run on (``StoreExecutor.lanes``); None: threads of the
        group's own, the switch interval left as it is. ``store_failed``: told of each pass that
        failed because the store did."""
        self.lanes = lanes or Lanes(switch_interval_s=None)
        self.runners = [LoopRunner(loop, metrics, self.lanes, store_failed) for loop in loops]
        self.tasks: list[asyncio.Task[None]] = []
        self._on_death: Callable[[str, BaseException | None], None] | None = None

    def start(self, on_death: Callable[[str, BaseException | None], None]) -> None:
        self._on_death = on_death
        for runner in self.runners:
            task = asyncio.create_task(runner.run_forever(), name=f"loop:{runner.loop.name}")
            task.add_done_callback(partial(self._ended, runner.loop.name))
            self.tasks.append(task)

    def _ended(self, name: str, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        logger.critical("loop died", extra={"loop": name, "error": repr(error)})
        if self._on_death is not None:
            self._on_death(name, error)

    def wake(self, name: str) -> None:
        for runner in self.runners:
            if runner.loop.name == name:
                runner.wake()

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.tasks.clear()
        # A pass already running finishes before the store is closed under it.
        await self.lanes.close()
