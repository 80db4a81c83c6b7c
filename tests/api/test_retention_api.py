"""Retention (issue 12 item 4): finished jobs, their events and checkpoints, and idempotency keys go
after ``CORRAL_RETENTION_DAYS``; live jobs and gangs with a live task stay; the store's size and
its oldest kept job are metrics."""

from __future__ import annotations

import re

from corral.core import retention
from tests.api.conftest import claim, register, submit

DAY = 86400


def finish(api, job_id: str, worker_id: str = "w1") -> None:
    claimed = claim(api, worker_id)
    assert claimed["id"] == job_id
    params = {"worker_id": worker_id, "attempt": claimed["attempt"]}
    api.post(f"/jobs/{job_id}/checkpoint", params=params, content=b"state").raise_for_status()
    api.post(f"/jobs/{job_id}/done", params=params).raise_for_status()


def metric(api, name: str) -> float | None:
    match = re.search(rf"^{name} (\S+)$", api.get("/metrics").text, re.MULTILINE)
    return float(match.group(1)) if match else None


def test_finished_work_goes_after_the_retention_days(api, server, clock, settings):
    settings.retention_days = 14
    register(api, cpus=8)
    old = api.post("/jobs", json={"command": "true"}, headers={"Idempotency-Key": "k1"}).json()
    finish(api, old["id"])
    clock.advance(1)
    live = submit(api, command="sleep 1")
    gang = api.post("/jobs", json={"command": "true", "gang_size": 2}).json()
    assert metric(api, "corral_store_size_bytes") > 0
    oldest_before = metric(api, "corral_oldest_job_submitted_timestamp_seconds")
    clock.advance(13 * DAY)
    server.run_loop("retention")
    assert api.get(f"/jobs/{old['id']}").status_code == 200, "not yet 14 days"
    clock.advance(2 * DAY)
    server.run_loop("retention")
    assert api.get(f"/jobs/{old['id']}").status_code == 404
    assert api.get(f"/jobs/{old['id']}/events").status_code == 404
    assert api.get(f"/jobs/{old['id']}/checkpoint").status_code in (204, 404)
    assert api.get(f"/jobs/{live['id']}").json()["status"] == "pending", "a live job is kept"
    assert api.get(f"/gangs/{gang['gang_id']}").status_code == 200, "a live gang is kept"
    again = api.post("/jobs", json={"command": "true"}, headers={"Idempotency-Key": "k1"}).json()
    assert again["id"] != old["id"], "the expired key made a new job"
    assert metric(api, "corral_oldest_job_submitted_timestamp_seconds") == oldest_before + 1
    assert metric(api, 'corral_retention_removed_total{kind="jobs"}') == 1.0
    assert metric(api, 'corral_retention_removed_total{kind="idempotency_keys"}') == 1.0


def test_a_backlog_is_removed_in_batches(store, clock):
    from corral.core import lifecycle
    from corral.domain.records import JobSpec

    now = clock.now()
    specs = [JobSpec(command="true")] * (retention.BATCH + 20)
    result = store.jobs.submit(lifecycle.submitted(specs, now), now, None, "")
    ids = [item.job.id for item in result.items]
    with store._transaction() as tx:  # finished long ago, without walking each through a worker
        marks = ", ".join("?" for _ in ids)
        tx.execute(f"UPDATE jobs SET status = 'done', finished_at = ? WHERE id IN ({marks})", [now, *ids])
    cutoff = retention.cutoff(now + 15 * DAY, 14)
    first = store.retention.purge_finished(cutoff, retention.BATCH)
    assert first.jobs == retention.BATCH
    assert retention.another_batch(first.jobs, first.keys, 1)
    second = store.retention.purge_finished(cutoff, retention.BATCH)
    assert second.jobs == 20
    assert not retention.another_batch(second.jobs, second.keys, 2)
    assert store.retention.oldest_job_submitted_at() is None
