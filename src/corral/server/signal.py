"""Wake long-polling claims when work may be available (a submit, or capacity freed).

In-process only: with several replicas a claim also re-checks the store every second, so a job
submitted through another replica starts within a second at worst.
"""

from __future__ import annotations

import asyncio


class WorkSignal:
    def __init__(self) -> None:
        self._event = asyncio.Event()

    def current(self) -> asyncio.Event:
        """The event the next ``notify`` sets: take it before looking for work, wait on it after."""
        return self._event

    def notify(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()
