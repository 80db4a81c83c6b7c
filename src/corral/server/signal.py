"""Wake long-polling claims when work may be available (a submit, or capacity freed).

In-process only: with several replicas a claim also re-checks the store every second, so a job
submitted through another replica starts within a second at worst.
"""

from __future__ import annotations

import asyncio


class WorkSignal:
    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def current(self) -> asyncio.Event:
        """The event the next ``notify`` sets: take it before looking for work, wait on it after."""
        self._loop = asyncio.get_running_loop()
        return self._event

    def notify(self) -> None:
        """Wake every waiting claim. Safe from any thread (tests drive loops from their own)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if self._loop is not None and running is not self._loop:
            self._loop.call_soon_threadsafe(self._wake)
        else:
            self._wake()

    def _wake(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()
