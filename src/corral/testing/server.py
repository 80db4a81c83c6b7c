"""A real corral server on a real socket, in a thread of the test process.

Tests talk to it over HTTP like any client; the store and clock are the test's, and the background
loops are left to the test (``server.reap()``) so time only moves when the test moves it.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from corral.config import ServerSettings
from corral.domain.clock import Clock
from corral.server.app import create_app
from corral.server.main import uvicorn_config
from corral.server.state import ServerState, state_of_app
from corral.store import Store


class ServerThread:
    def __init__(
        self,
        store: Store,
        settings: ServerSettings | None = None,
        clock: Clock | None = None,
        run_loops: bool = False,
        store_url: str | None = None,
    ) -> None:
        """``store_url``: the store's URL, for the child processes ``corral server`` runs
        (``app.create_app``); None: their work on the server's threads."""
        self.app = create_app(
            store, settings or ServerSettings(), clock, run_loops=run_loops, store_url=store_url
        )
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn_config(self.app, settings or ServerSettings(), log_level="error")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._listener]}, daemon=True
        )

    @property
    def state(self) -> ServerState:
        return state_of_app(self.app)

    def reap(self) -> None:
        """Run one reaper pass now (the loops do not run on their own in tests)."""
        self.run_loop("reaper")

    def run_loop(self, name: str) -> None:
        """Run one pass of the named background loop now; fail the test if the pass raised."""
        (runner,) = [runner for runner in self.app.state.loops.runners if runner.loop.name == name]
        assert runner.run_once(), f"a pass of {name} failed: see the log"

    def __enter__(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("test server did not start")
            time.sleep(0.005)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._listener.close()
