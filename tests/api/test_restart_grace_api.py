"""A server that has just started gives workers a lease's grace before reaping (issue 12: a
restarted server re-queued at once three finished jobs whose leases lapsed while it was down)."""

from __future__ import annotations

import httpx

from corral.config import ServerSettings
from corral.store import open_store
from corral.testing.server import ServerThread
from tests.api.conftest import claim, register, submit


def test_a_restarted_server_waits_a_lease_before_reaping(store_url, clock):
    settings = ServerSettings(heartbeat_timeout_s=30)
    first_store = open_store(store_url)
    with ServerThread(first_store, settings, clock) as first, httpx.Client(base_url=first.url) as api:
        register(api)
        job = submit(api)
        claimed = claim(api)
    first_store.close()
    clock.advance(60)  # the server was down for two leases; the worker held on
    second_store = open_store(store_url)
    with ServerThread(second_store, settings, clock) as second, httpx.Client(base_url=second.url) as api:
        second.reap()
        second.run_loop("dead_worker_sweep")
        assert api.get(f"/jobs/{job['id']}").json()["status"] == "running"
        assert api.get("/workers/w1").json()["status"] == "active"
        params = {"worker_id": "w1", "attempt": claimed["attempt"]}
        clock.advance(5)  # the worker's retried report lands within the grace
        assert api.post(f"/jobs/{job['id']}/done", params=params).json()["status"] == "done"
        other = submit(api)
        claim(api)
        clock.advance(31)  # grace over: a lease that lapses now is reaped as always
        second.reap()
        assert api.get(f"/jobs/{other['id']}").json()["status"] == "pending"
    second_store.close()
