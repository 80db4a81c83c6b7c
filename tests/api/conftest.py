from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from corral.store import open_store
from corral.testing import history


@pytest.fixture
def api(server) -> Iterator[httpx.Client]:
    """Raw HTTP to the live test server: the tests check status codes and bodies byte for byte."""
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


def error_code(response: httpx.Response) -> str:
    assert response.headers["content-type"].startswith("application/json")
    return response.json()["error"]["code"]


def register(api: httpx.Client, worker_id: str = "w1", **resources) -> dict:
    body = {"id": worker_id, "address": "127.0.0.1", "resources": {"cpus": 8, "memory_mb": 8192, **resources}}
    response = api.post("/workers/register", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def submit(api: httpx.Client, **fields) -> dict:
    response = api.post("/jobs", json={"command": "true", **fields})
    assert response.status_code == 201, response.text
    return response.json()


def claim(api: httpx.Client, worker_id: str = "w1") -> dict:
    response = api.get("/jobs/next", params={"worker_id": worker_id})
    assert response.status_code == 200, response.text
    return response.json()


def assert_store_history_is_legal(store_url: str) -> None:
    """Every job's history in the store at ``store_url`` checked (``corral.testing.history``): no
    worker over capacity, no illegal transition, on a connection of its own."""
    checked = open_store(store_url)
    try:
        verdict = history.check_store(checked)
    finally:
        checked.close()
    assert verdict.ok, verdict.summary()
