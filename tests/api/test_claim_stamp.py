"""A claim is stamped with the time it saw the worker's capacity, not the time its request arrived.

With store calls on threads (issue 13), a claim can wait between its request and its transaction
(every store thread busy, its connection reconnecting after a PostgreSQL restart) while a report on
another thread frees capacity on the same worker. Stamped with the request's arrival time, the
claim's ``running`` event came before the ``done`` whose capacity it used, and the history checker
saw the worker over capacity for an instant (the chaos scenario
``test_postgres_restarted_under_load`` found ``(0, 0, 5) > (0, 4096, 4)`` CPUs once). The claim
now reads the clock inside its transaction, after the worker's allocations.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from functools import partial
from typing import Any

import httpx
import pytest

from corral.config import ServerSettings
from corral.domain import errors
from corral.store import Store, on_loop, open_store
from corral.testing.clock import FakeClock
from corral.testing.server import ServerThread

from .conftest import assert_store_history_is_legal, claim, register, submit


class _HeldClaims:
    """Holds each claim before its transaction, until ``release``: on its store thread, or (where
    PostgreSQL's short work runs on the event loop, ``store.on_loop``) in its session, waiting on a
    thread as it would for a reconnect, while the loop serves the other requests."""

    def __init__(self, store: Store) -> None:
        self._claim = store.claims.claim
        self.entered = threading.Event()
        self._go = threading.Event()
        self.holding = False

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        on_store_thread = threading.current_thread().name.startswith("corral-store")
        if self.holding and not on_store_thread and on_loop.session() is None:
            # Tried inline on the event loop (SQLite): busy, as when a lock is in the way, so that
            # the claim goes to a store thread, to be held there.
            raise errors.StoreBusy("held by the test")
        if self.holding:
            self.entered.set()
            assert on_loop.off_loop(partial(self._go.wait, 30)), "the test never released the claim"
        return self._claim(*args, **kwargs)

    def release(self) -> None:
        self._go.set()


@pytest.fixture
def held(
    store_url: str, clock: FakeClock, settings: ServerSettings
) -> Iterator[tuple[ServerThread, _HeldClaims]]:
    server_store = open_store(store_url)
    gate = _HeldClaims(server_store)
    server_store.claims.claim = gate.claim  # type: ignore[method-assign]
    with ServerThread(server_store, settings, clock) as running:
        yield running, gate
    gate.release()
    server_store.close()


def test_a_claim_held_up_before_its_transaction_is_stamped_after_the_release_it_used(
    held: tuple[ServerThread, _HeldClaims], clock: FakeClock, store_url: str
) -> None:
    server, gate = held
    with httpx.Client(base_url=server.url, timeout=30) as api:
        register(api, "w1", cpus=1)
        submitted = {submit(api, resources={"cpus": 1})["id"] for _ in range(2)}
        running = claim(api, "w1")
        (second,) = submitted - {running["id"]}
        gate.holding = True
        answers: list[httpx.Response] = []
        waiting = threading.Thread(
            target=lambda: answers.append(api.get("/jobs/next", params={"worker_id": "w1"}))
        )
        waiting.start()
        assert gate.entered.wait(30)
        # The worker is full: the held claim can only start the second job on the capacity the
        # first job's ``done`` frees, later on the clock.
        clock.advance(10)
        done = api.post(
            f"/jobs/{running['id']}/done", params={"worker_id": "w1", "attempt": running["attempt"]}
        )
        assert done.status_code == 200, done.text
        gate.release()
        waiting.join(30)
    assert answers and answers[0].status_code == 200, answers
    assert answers[0].json()["id"] == second
    assert_store_history_is_legal(store_url)
