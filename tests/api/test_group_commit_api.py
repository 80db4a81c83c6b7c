"""Group commit: job reports arriving in the same event-loop turn are applied by one store call
(``corral.server.grouped``, through the executor's ``grouped``), each answered with its own
outcome, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest

from corral.config import ServerSettings
from corral.domain import errors
from corral.server.routes.protocol import REPORTS
from corral.server.state import ServerState
from corral.testing.clock import FakeClock
from tests.api.conftest import assert_store_history_is_legal, register


def test_concurrent_reports_each_get_their_own_answer(api, server, store_url):
    register(api, cpus=64)
    response = api.post("/jobs/batch", json={"jobs": [{"command": "true"}] * 24})
    assert response.status_code == 201
    claimed = api.get("/jobs/next", params={"worker_id": "w1", "max": 24}).json()["items"]
    assert len(claimed) == 24
    answers: dict[tuple[str, str], int] = {}
    lock = threading.Lock()
    start = threading.Barrier(len(claimed) + 4)

    def report(job: dict[str, Any], kind: str, attempt: int) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as own:
            start.wait(10)
            answer = own.post(
                f"/jobs/{job['id']}/{kind}",
                params={"worker_id": "w1", "attempt": attempt},
                json={"exit_code": 1} if kind == "fail" else None,
            )
        with lock:
            answers[(job["id"], kind if attempt == job["attempt"] else "stale")] = answer.status_code

    threads = [
        threading.Thread(target=report, args=(job, "fail" if index % 3 == 0 else "done", job["attempt"]))
        for index, job in enumerate(claimed)
    ]
    threads += [
        threading.Thread(target=report, args=(job, "done", job["attempt"] + 1)) for job in claimed[:4]
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(answers) == 28
    assert {code for (_, kind), code in answers.items() if kind != "stale"} == {200}
    assert {code for (_, kind), code in answers.items() if kind == "stale"} == {409}
    statuses = {job["id"]: api.get(f"/jobs/{job['id']}").json()["status"] for job in claimed}
    assert [statuses[job["id"]] for job in claimed] == [
        "pending" if index % 3 == 0 else "done" for index in range(len(claimed))
    ]
    assert_store_history_is_legal(store_url)


class _CountingStore:
    """A store stand-in that records how reports reach it."""

    def __init__(self, fail_group: Exception | None = None) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail_group = fail_group
        self.jobs = self  # the jobs' port is the stand-in itself

    def run_inline(self, work: Any) -> Any:
        return work()

    def change(self, job_id: str, decide: Any) -> Any:
        self.calls.append(("change", 1))
        return decide(job_id)

    def change_many(self, group: list[tuple[str, Any]]) -> list[Any]:
        self.calls.append(("change_many", len(group)))
        if self.fail_group is not None:
            raise self.fail_group
        results: list[Any] = []
        for job_id, decide in group:
            try:
                results.append(decide(job_id))
            except Exception as error:
                results.append(error)
        return results


class _Reports:
    """Reports handed to a server's executor as the routes hand them (``REPORTS``)."""

    def __init__(self, store: _CountingStore) -> None:
        self.state = ServerState(store, ServerSettings(store_threads=0), FakeClock())  # type: ignore[arg-type]

    async def change(self, job_id: str, decide: Any) -> Any:
        return await self.state.executor.grouped(REPORTS, (job_id, decide))


def _groups(store: _CountingStore) -> _Reports:
    return _Reports(store)


def _refuse(job_id: str) -> str:
    raise errors.NotRunning(f"{job_id} is not running")


def test_reports_of_one_turn_are_one_store_call():
    store = _CountingStore()
    groups = _groups(store)

    async def main() -> list[Any]:
        reports = [groups.change(f"j-{index}", lambda job_id: f"ok {job_id}") for index in range(5)]
        reports.append(groups.change("j-x", _refuse))
        return await asyncio.gather(*reports, return_exceptions=True)

    results = asyncio.run(main())
    assert results[:5] == [f"ok j-{index}" for index in range(5)]
    assert isinstance(results[5], errors.NotRunning)
    assert store.calls == [("change_many", 6)]


def test_a_failed_group_is_applied_report_by_report():
    store = _CountingStore(fail_group=RuntimeError("a fault in the group's transaction"))
    groups = _groups(store)

    async def main() -> list[Any]:
        return await asyncio.gather(
            groups.change("j-1", lambda job_id: "one"),
            groups.change("j-2", _refuse),
            return_exceptions=True,
        )

    one, two = asyncio.run(main())
    assert one == "one"
    assert isinstance(two, errors.NotRunning)
    assert store.calls == [("change_many", 2), ("change", 1), ("change", 1)]


def test_a_busy_store_answers_every_report_of_the_group_busy():
    store = _CountingStore(fail_group=errors.StoreBusy("the write lock stayed taken"))
    store.jobs.change = lambda job_id, decide: pytest.fail("a busy store is not asked again")  # type: ignore[method-assign]
    groups = _groups(store)

    async def main() -> list[Any]:
        reports = [groups.change(f"j-{index}", lambda job_id: "ok") for index in range(3)]
        return await asyncio.gather(*reports, return_exceptions=True)

    assert all(isinstance(result, errors.StoreBusy) for result in asyncio.run(main()))
