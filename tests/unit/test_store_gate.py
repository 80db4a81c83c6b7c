"""The store gate (``server.store_gate``): while the store is failing, a request that writes is
answered 503 at once and starts a check of the store, one at a time; reads, and requests for no
route, go on; a check that commits opens the gate again."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from corral.domain import errors
from corral.server import store_gate
from corral.server.store_gate import StoreGate, writes
from corral.server.store_health import StoreHealth
from corral.testing.clock import FakeClock


async def endpoint(request: Request) -> Response:
    return Response("unused")


ROUTES = [
    Route("/jobs/next", endpoint, methods=["GET"]),
    Route("/jobs", endpoint, methods=["POST"]),
    Route("/jobs/{job_id}", endpoint, methods=["GET"]),
    Route("/jobs/{job_id}/heartbeat", endpoint, methods=["POST"]),
    Route("/pools/{path:path}", endpoint, methods=["PUT", "DELETE"]),
]


class Checks:
    """The gate's ``check``: each call waits until the test lets it end, committing or failing."""

    def __init__(self, health: StoreHealth) -> None:
        self.health = health
        self.started = 0
        self.outcome: asyncio.Queue[bool] = asyncio.Queue()
        self.ended = asyncio.Event()

    async def __call__(self) -> None:
        self.started += 1
        commits = await self.outcome.get()
        try:
            self.health.check(lambda: None if commits else _full())
        finally:
            self.ended.set()


def _full() -> None:
    raise errors.StoreWriteFailed("database or disk is full")


class Gated:
    """A gate in front of an app that answers 200 ``passed``, and what went through it."""

    def __init__(self) -> None:
        self.health = StoreHealth(FakeClock())
        self.checks = Checks(self.health)
        self.passed: list[str] = []
        self.gate = StoreGate(self.app, self.health, self.checks, ROUTES)
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.gate), base_url="http://gate")

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.passed.append(f"{scope['method']} {scope['path']}")
        await Response("passed")(scope, receive, send)


def run_async(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """An ``async def`` test, run on an event loop of its own (no asyncio plugin here)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


@pytest.fixture
def no_interval(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Checks started as often as refusals come (the interval is wall-clock time)."""
    monkeypatch.setattr(store_gate, "CHECK_INTERVAL_S", 0.0)
    yield


def scope_of(method: str, path: str) -> Scope:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "root_path": "",
        "query_string": b"",
        "headers": [],
    }


@pytest.mark.parametrize(
    ("method", "path", "written"),
    [
        ("POST", "/jobs/j1/heartbeat", True),
        ("POST", "/jobs", True),
        ("PUT", "/pools/a/b", True),
        ("DELETE", "/pools/a", True),
        ("GET", "/jobs/next", True),  # the claim takes jobs
        ("GET", "/jobs/j1", False),
        ("HEAD", "/jobs/j1", False),
        ("POST", "/no/such/route", False),  # the router's 404
        ("POST", "/jobs/j1", False),  # the router's 405
    ],
)
def test_what_writes(method: str, path: str, written: bool):
    assert writes(scope_of(method, path), ROUTES) is written


@run_async
async def test_a_well_store_lets_every_request_through_and_checks_nothing():
    gated = Gated()
    async with gated.client:
        answer = await gated.client.post("/jobs/j1/heartbeat")
    assert answer.status_code == 200 and gated.passed == ["POST /jobs/j1/heartbeat"]
    assert gated.checks.started == 0


@run_async
async def test_a_failing_store_refuses_writes_at_once_with_the_failures_code(no_interval):
    gated = Gated()
    gated.health.failed(errors.StoreBusy("the write lock stayed taken"))
    async with gated.client:
        refused = [
            await gated.client.post("/jobs/j1/heartbeat"),
            await gated.client.get("/jobs/next", params={"worker_id": "w1"}),
            await gated.client.put("/pools/a"),
        ]
        read = await gated.client.get("/jobs/j1")
        unknown = await gated.client.post("/no/such/route")
        for answer in refused:
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["code"] == "store_busy"
            assert answer.headers["retry-after"] == str(store_gate.RETRY_AFTER_S)
        assert read.status_code == 200 and unknown.status_code == 200
        assert gated.passed == ["GET /jobs/j1", "POST /no/such/route"]
        await asyncio.sleep(0)  # the check's task starts
        # three refusals, one check: it is still in flight (waiting on the store)
        assert gated.checks.started == 1
        gated.health.failed(errors.StoreWriteFailed("database or disk is full"))
        answer = await gated.client.post("/jobs")
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "store_unavailable"
        gated.checks.outcome.put_nowait(True)
        await gated.checks.ended.wait()


async def refused_then_a_check_that_fails(gated: Gated) -> None:
    """A write refused, and the check it started fails (the store still cannot write)."""
    assert (await gated.client.post("/jobs")).status_code == 503
    gated.checks.outcome.put_nowait(False)
    await gated.checks.ended.wait()
    await asyncio.sleep(0)  # the check's task ends after its call returns


@run_async
async def test_a_check_that_fails_leaves_the_gate_shut_and_the_next_refusal_checks_again(no_interval):
    gated = Gated()
    gated.health.failed(errors.StoreBusy("locked"))
    async with gated.client:
        await refused_then_a_check_that_fails(gated)
        assert gated.health.failing
        gated.checks.ended.clear()
        assert (await gated.client.post("/jobs")).status_code == 503
        await asyncio.sleep(0)
        assert gated.checks.started == 2
        gated.checks.outcome.put_nowait(True)  # this one commits: the store's recovery
        await gated.checks.ended.wait()
        assert not gated.health.failing
        answer = await gated.client.post("/jobs")
    assert answer.status_code == 200 and gated.passed == ["POST /jobs"]


@run_async
async def test_checks_started_by_refusals_are_spaced():
    """A full disk refuses a write at once: a fleet's requests must not each start a check."""
    gated = Gated()
    gated.health.failed(errors.StoreWriteFailed("database or disk is full"))
    async with gated.client:
        await refused_then_a_check_that_fails(gated)
        # the next refusal comes well within CHECK_INTERVAL_S (0.2 s) of the first on this loop
        assert (await gated.client.post("/jobs")).status_code == 503
        await asyncio.sleep(0)
        assert gated.checks.started == 1
