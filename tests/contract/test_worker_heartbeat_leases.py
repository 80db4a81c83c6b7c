"""A worker heartbeat that carries its jobs' leases (``Workers.worker_heartbeat``'s ``jobs``):
renewed with it and answered as ``Jobs.heartbeat_jobs`` answers them, or not at all when the
heartbeat itself is refused. On SQLite and PostgreSQL (the ``store`` fixture)."""

from __future__ import annotations

import threading

import pytest

from corral.domain import errors
from corral.domain.status import Status
from corral.store import open_store
from corral.store.base import JobReport, LeaseRenewed, WorkerBeat
from tests.conftest import postgres_schema_url
from tests.contract import protocol
from tests.helpers import NOW, POLICY, register, submit_one


def _three_jobs(store):
    """w1 runs ``running`` and is stopping ``stopping``; w2 runs ``elsewhere``."""
    register(store, gpus=2)
    register(store, "w2")
    running, stopping, elsewhere = (submit_one(store) for _ in range(3))
    store.claims.claim("w1", NOW, POLICY)
    store.claims.claim("w1", NOW, POLICY)
    store.claims.claim("w2", NOW, POLICY)
    protocol.cancel(store, stopping.id, NOW + 1)
    return running, stopping, elsewhere


@pytest.mark.parametrize("unhealthy", [None, [1]], ids=["one-statement", "locked"])
def test_leases_renewed_with_the_heartbeat_are_answered_as_alone(store, unhealthy):
    running, stopping, elsewhere = _three_jobs(store)
    untouched = store.jobs.get_job(elsewhere.id)
    jobs = [
        (running.id, 1, JobReport(progress={"step": 3}, gpu_util_pct=50.0)),
        (stopping.id, 1, JobReport()),
        (elsewhere.id, 1, JobReport(progress={"step": 9})),
        ("j-missing", 1, JobReport()),
    ]
    readings = [{"index": 0, "util_pct": 90.0, "mem_used_mb": 1.0}]

    beat = store.workers.worker_heartbeat(
        "w1", NOW + 5, readings, unhealthy, running=[job_id for job_id, _, _ in jobs], jobs=jobs
    )

    assert beat.worker.last_heartbeat_at == NOW + 5
    assert beat.renewed[0] == LeaseRenewed(running.id)
    renewed = store.jobs.get_job(running.id)
    assert (renewed.last_heartbeat_at, renewed.progress, renewed.gpu_util_pct) == (NOW + 5, {"step": 3}, 50.0)
    assert beat.renewed[1] == store.jobs.get_job(stopping.id)
    assert (beat.renewed[1].status, beat.renewed[1].last_heartbeat_at) == (Status.PREEMPTING, NOW + 5)
    assert beat.renewed[2] == untouched == store.jobs.get_job(elsewhere.id)
    assert beat.renewed[3] is None
    assert len(beat.renewed) == 4


def test_a_heartbeat_without_leases_renews_none(store):
    running, _, _ = _three_jobs(store)

    assert store.workers.worker_heartbeat("w1", NOW + 5, None).renewed == ()
    assert store.jobs.get_job(running.id).last_heartbeat_at != NOW + 5


@pytest.mark.parametrize(
    ("worker_id", "reading_index", "refusal"),
    [("w1", 2, errors.InvalidRequest), ("w-unknown", 0, errors.NotFound)],
    ids=["unregistered-gpu", "unknown-worker"],
)
def test_a_refused_heartbeat_renews_no_lease(store, worker_id, reading_index, refusal):
    running, _, _ = _three_jobs(store)
    before = store.jobs.get_job(running.id)
    readings = [{"index": reading_index, "util_pct": 90.0, "mem_used_mb": 1.0}]

    with pytest.raises(refusal):
        store.workers.worker_heartbeat(
            worker_id, NOW + 5, readings, running=[running.id], jobs=[(running.id, 1, JobReport())]
        )

    assert store.jobs.get_job(running.id) == before


@pytest.fixture
def postgres_url():
    """A fresh PostgreSQL schema's URL (a second connection of the test's own takes locks in it)."""
    yield from postgres_schema_url()


@pytest.mark.postgres
def test_a_heartbeat_renewing_a_victims_lease_does_not_deadlock_with_its_preemption(postgres_url):
    """A preemption locks its victims' job rows, then their worker's row (``SqlGangs.preempt``).
    A heartbeat of that worker carrying those leases must not hold the worker's row while it
    waits for them: the two would deadlock, and PostgreSQL would abort one of them."""
    import psycopg

    store = open_store(postgres_url)
    beats: list[WorkerBeat] = []

    def heartbeat(job_id: str) -> None:
        lease = (job_id, 1, JobReport())
        beats.append(store.workers.worker_heartbeat("w1", NOW + 5, None, running=[job_id], jobs=[lease]))

    try:
        register(store, gpus=1)
        job = submit_one(store)
        store.claims.claim("w1", NOW, POLICY)
        with psycopg.connect(postgres_url) as preemption:
            preemption.execute("SET deadlock_timeout = '100ms'")
            preemption.execute("SELECT id FROM jobs WHERE id = %s FOR UPDATE", (job.id,))
            beating = threading.Thread(target=heartbeat, args=(job.id,))
            beating.start()
            _wait_for_a_lock_wait(preemption, beating)
            # the worker's row: free (the heartbeat committed it before renewing), not a deadlock
            preemption.execute("SELECT id FROM workers WHERE id = 'w1' FOR UPDATE")
            preemption.commit()
            beating.join(timeout=30)
        assert beats, "the heartbeat did not finish"
        assert beats[0].renewed == (LeaseRenewed(job.id),)
    finally:
        store.close()


def _wait_for_a_lock_wait(connection, thread: threading.Thread) -> None:
    """Until a session waits on a lock ``connection`` holds (the heartbeat, on the job's row; read
    from ``pg_locks``, which is live, where ``pg_stat_activity`` would be this transaction's
    snapshot), or the heartbeat has finished (it then never waited: the assertions say whether it
    renewed)."""
    for _ in range(3000):
        waiting = connection.execute(
            "SELECT count(*) FROM pg_locks"
            " WHERE NOT granted AND pg_backend_pid() = ANY(pg_blocking_pids(pid))"
        ).fetchone()
        if (waiting and waiting[0]) or not thread.is_alive():
            return
        thread.join(timeout=0.01)
    raise AssertionError("the heartbeat neither waited on a lock nor finished")
