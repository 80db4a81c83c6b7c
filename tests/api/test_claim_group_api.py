"""Group commit of claims: the claims arriving in the same event-loop turn start their jobs in one
store transaction (``routes.protocol.CLAIMS``), each answered with its own jobs, on SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx

from corral.config import ServerSettings
from corral.domain import errors
from corral.server.routes.protocol import CLAIMS, ClaimRequest
from corral.server.state import ServerState
from corral.testing.clock import FakeClock
from tests.api.conftest import assert_store_history_is_legal, register
from tests.helpers import register as register_in_store
from tests.helpers import submit_one


class _CountedStore:
    """The real store, with the calls of its claims port counted (``store.claims`` is this)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.calls: list[tuple[str, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    @property
    def claims(self) -> _CountedStore:
        return self

    def claim_group(self, asks: Any, *args: Any) -> Any:
        self.calls.append(("claim_group", len(asks)))
        return self._store.claims.claim_group(asks, *args)

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(("claim", 1))
        return self._store.claims.claim(*args, **kwargs)

    def claim_many(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(("claim_many", 1))
        return self._store.claims.claim_many(*args, **kwargs)


def _claims(store: _CountedStore, asks: list[ClaimRequest]) -> list[Any]:
    state = ServerState(store, ServerSettings(store_threads=0), FakeClock())  # type: ignore[arg-type]

    async def main() -> list[Any]:
        return await asyncio.gather(
            *(state.executor.grouped(CLAIMS, ask) for ask in asks), return_exceptions=True
        )

    return asyncio.run(main())


def _ask(worker_id: str, limit: int | None = None) -> ClaimRequest:
    return ClaimRequest(worker_id, limit, None, "http://corral.test")


def test_the_claims_of_one_turn_are_one_store_call(store):
    for worker_id in ("w1", "w2", "w3"):
        register_in_store(store, worker_id, cpus=2)
    jobs = [submit_one(store) for _ in range(5)]
    counted = _CountedStore(store)
    first, second, third = _claims(counted, [_ask("w1"), _ask("w2", 2), _ask("w3")])
    assert counted.calls == [("claim_group", 3)]
    assert [job.id for job, _ in first] == [jobs[0].id]
    assert [job.id for job, _ in second] == [jobs[1].id, jobs[2].id]
    assert [job.id for job, _ in third] == [jobs[3].id]
    body = first[0][1]
    assert (body["id"], body["attempt"], body["env"]["CORRAL_JOB_ID"]) == (jobs[0].id, 1, jobs[0].id)


def test_a_failed_group_is_applied_claim_by_claim(store):
    register_in_store(store, "w1", cpus=2)
    job = submit_one(store)
    counted = _CountedStore(store)
    claimed, unknown = _claims(counted, [_ask("w1"), _ask("w9-unknown", 3)])
    assert counted.calls == [("claim_group", 2), ("claim", 1), ("claim_many", 1)]
    assert [started.id for started, _ in claimed] == [job.id], "one claim's fault is not another's answer"
    assert isinstance(unknown, errors.NotFound)


def test_concurrent_claims_over_http_each_start_their_own_jobs(api, server, store_url):
    workers = [f"w{index}" for index in range(8)]
    for worker_id in workers:
        register(api, worker_id, cpus=4)
    response = api.post("/jobs/batch", json={"jobs": [{"command": "true"}] * 40})
    assert response.status_code == 201
    answers: dict[str, list[str]] = {}
    lock = threading.Lock()
    start = threading.Barrier(len(workers))

    def claim(worker_id: str, index: int) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as own:
            start.wait(10)
            params: dict[str, Any] = {"worker_id": worker_id}
            if index % 2:
                params["max"] = 3
            answer = own.get("/jobs/next", params=params)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        with lock:
            answers[worker_id] = [item["id"] for item in body["items"]] if index % 2 else [body["id"]]

    threads = [threading.Thread(target=claim, args=(worker_id, i)) for i, worker_id in enumerate(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    started = [job_id for ids in answers.values() for job_id in ids]
    assert len(answers) == 8 and len(started) == 4 * 1 + 4 * 3
    assert len(set(started)) == len(started), "no job was handed out twice"
    for worker_id, ids in answers.items():
        for job_id in ids:
            stored = api.get(f"/jobs/{job_id}").json()
            assert (stored["status"], stored["worker_id"]) == ("running", worker_id)
    assert_store_history_is_legal(store_url)
