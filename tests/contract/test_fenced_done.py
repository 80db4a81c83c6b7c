"""A ``done`` report (``changes.done_decision``: a ``FencedReport``), on SQLite and PostgreSQL:
PostgreSQL settles one of a single running job of that attempt in one statement, without reading
the job first; it must write exactly what the core's decision writes (the row, its event, its usage
row) and answer every other report (a stale attempt, another worker, a replay of a finished job, an
unknown job, a preempting job, a gang task) exactly as the decision does on the row it reads."""

from __future__ import annotations

from functools import partial

import pytest

from corral.core import lifecycle
from corral.domain import errors
from corral.domain.status import Status
from corral.server import changes
from tests.contract import protocol
from tests.contract.test_gangs_store import run_gang, submit_gang, workers
from tests.helpers import NOW, POLICY, assert_history_is_legal, register, submit_one

EVENT_READ = (
    "SELECT seq, at, from_status, to_status, reason_code, reason_message, epoch, worker_id, attempt"
    " FROM job_events WHERE job_id = ? ORDER BY seq"
)
USAGE_READ = (
    "SELECT job_id, attempt, username, pool, worker_id, gpus, cpus, submitted_at, started_at, ended_at,"
    " wait_s, status FROM attempt_usage WHERE job_id = ? ORDER BY attempt"
)


def plain_done(worker_id, attempt, now):
    """The same decision without what the store may settle it by: always read, then decided."""
    return partial(lifecycle.report_done, worker_id=worker_id, attempt=attempt, now=now)


def written(store, job_id):
    """What a report left of a job: its row's changing fields, its last event, its usage rows (the
    wait as its difference from the job's own; each job was submitted at its own instant)."""
    row = store.jobs.get_job(job_id)
    read = store.read()
    usage = [
        (*values[1:7], values[8:10], None if wait is None else wait - (values[8] - values[7]), values[11])
        for values in read.execute(USAGE_READ, (job_id,))
        for wait in [values[10]]
    ]
    return (
        (row.status, row.finished_at, row.exit_code, row.reason, row.version, row.worker_id, row.attempts),
        tuple(read.execute(EVENT_READ, (job_id,))[-1]),
        usage,
    )


def running(store, count, **fields):
    register(store, cpus=1000)
    for _ in range(count):
        submit_one(store, **fields)
    return [store.claims.claim("w1", NOW, POLICY) for _ in range(count)]


def test_a_done_writes_what_the_decision_writes(store):
    fenced, plain = running(store, 2)
    answer = store.jobs.change(fenced.id, changes.done_decision("w1", fenced.attempts, NOW + 5))
    expected = store.jobs.change(plain.id, plain_done("w1", plain.attempts, NOW + 5))
    assert answer.job == store.jobs.get_job(fenced.id)
    assert answer.job.status is Status.DONE and answer.job.version == expected.job.version
    assert answer == lifecycle.Reported(answer.job)
    assert written(store, fenced.id) == written(store, plain.id)
    assert len(written(store, fenced.id)[2]) == 1, "the attempt's usage row"
    assert_history_is_legal(store, fenced.id)


def test_dones_of_a_group_write_what_the_decisions_write(store):
    *fenced, plain = running(store, 4)
    results = store.jobs.change_many(
        [(job.id, changes.done_decision("w1", job.attempts, NOW + 5)) for job in fenced]
        + [(plain.id, plain_done("w1", plain.attempts, NOW + 5))]
    )
    assert [result.job for result in results] == [store.jobs.get_job(job.id) for job in (*fenced, plain)]
    for job in fenced:
        assert written(store, job.id) == written(store, plain.id)


@pytest.mark.parametrize("group", [False, True], ids=["alone", "in a group"])
def test_every_refusal_is_the_decisions_own(store, group):
    """Each refused ``done`` raises what the decision raises on the row as it is, and writes
    nothing (a group's running job beside them is still settled)."""
    stale, other_worker, replayed, beside = running(store, 4)
    protocol.complete(store, replayed.id, "w1", replayed.attempts, NOW + 1)
    asks = [
        (stale.id, "w1", stale.attempts + 1),
        (other_worker.id, "w2", other_worker.attempts),
        (replayed.id, "w1", replayed.attempts),
        ("j-unknown", "w1", 1),
    ]
    before = {job_id: written(store, job_id) for job_id, _, _ in asks if job_id != "j-unknown"}
    if group:
        results = store.jobs.change_many(
            [(job_id, changes.done_decision(worker, attempt, NOW + 2)) for job_id, worker, attempt in asks]
            + [(beside.id, changes.done_decision("w1", beside.attempts, NOW + 2))]
        )
        refusals, settled = results[:-1], results[-1]
        assert settled.job.status is Status.DONE
    else:
        refusals = []
        for job_id, worker, attempt in asks:
            with pytest.raises(errors.CorralError) as refused:
                store.jobs.change(job_id, changes.done_decision(worker, attempt, NOW + 2))
            refusals.append(refused.value)
    expected = []
    for job_id, worker, attempt in asks:
        with pytest.raises(errors.CorralError) as refused:
            store.jobs.change(job_id, plain_done(worker, attempt, NOW + 2))
        expected.append(refused.value)
    assert [(type(error), str(error)) for error in refusals] == [
        (type(error), str(error)) for error in expected
    ]
    assert [type(error) for error in refusals] == [
        errors.StaleAttempt,
        errors.StaleAttempt,
        errors.NotRunning,
        errors.NotFound,
    ]
    assert {job_id: written(store, job_id) for job_id in before} == before


def test_a_preempting_jobs_done_is_accepted_as_before(store):
    """Only a running job is settled by the one statement; a preempting one (cancelled: it finished
    before it was stopped) is decided on its row, and keeps its result."""
    fenced, plain = running(store, 2)
    for job in (fenced, plain):
        protocol.cancel(store, job.id, NOW + 1)
        assert store.jobs.get_job(job.id).status is Status.PREEMPTING
    answer = store.jobs.change(fenced.id, changes.done_decision("w1", fenced.attempts, NOW + 5))
    store.jobs.change(plain.id, plain_done("w1", plain.attempts, NOW + 5))
    assert answer.job.status is Status.DONE
    assert written(store, fenced.id) == written(store, plain.id)


def test_a_gang_tasks_done_is_decided_with_its_gang(store):
    workers(store, 2)
    gang_id, task_ids = submit_gang(store, 2)
    run_gang(store, gang_id, task_ids)
    first, second = (store.jobs.get_job(task_id) for task_id in task_ids)
    assert first.status is Status.RUNNING
    with pytest.raises(errors.StaleAttempt):
        store.jobs.change(first.id, changes.done_decision(second.worker_id, first.attempts, NOW + 5))
    one = store.jobs.change(first.id, changes.done_decision(first.worker_id, first.attempts, NOW + 5))
    both = store.jobs.change(second.id, changes.done_decision(second.worker_id, second.attempts, NOW + 6))
    assert (one.job.status, both.job.status) == (Status.DONE, Status.DONE)
    for task_id in task_ids:
        assert_history_is_legal(store, task_id)


def test_postgres_settles_a_running_jobs_done_in_one_statement(postgres_store, monkeypatch):
    """No read of the job before the write: one statement alone, one round trip for a group."""
    store = postgres_store
    jobs = running(store, 3)
    sent = []
    autocommit = store.autocommit
    for name in ("execute", "together"):
        method = getattr(autocommit, name)
        monkeypatch.setattr(
            autocommit,
            name,
            lambda *arguments, _method=method, _name=name, **keywords: (
                sent.append(_name),
                _method(*arguments, **keywords),
            )[1],
        )
    store.jobs.change(jobs[0].id, changes.done_decision("w1", jobs[0].attempts, NOW + 5))
    assert sent == ["execute"]
    sent.clear()
    store.jobs.change_many([(job.id, changes.done_decision("w1", job.attempts, NOW + 5)) for job in jobs[1:]])
    assert sent == ["together"]
    assert all(store.jobs.get_job(job.id).status is Status.DONE for job in jobs)


@pytest.mark.parametrize("fault", [errors.StoreUnavailable, RuntimeError], ids=["store gone", "a fault"])
def test_a_group_whose_read_fails_after_its_dones_were_written_answers_them(
    postgres_store, monkeypatch, fault
):
    """The group's dones are committed by their one statement before the rest of the group is read:
    where that read then fails, the written dones are still answered as written (a group that raised
    would be answered 503 whole, or each report applied again alone: a committed done then refused
    409 ``not_running``, its completion never counted), the rest with the failure."""
    store = postgres_store
    done, failed = running(store, 2)
    autocommit = store.autocommit
    execute = autocommit.execute

    def read_fails(sql, *arguments, **keywords):
        if sql == type(store.jobs)._VERSIONED_JOBS:
            raise fault("the read failed")
        return execute(sql, *arguments, **keywords)

    monkeypatch.setattr(autocommit, "execute", read_fails)
    results = store.jobs.change_many(
        [
            (done.id, changes.done_decision("w1", done.attempts, NOW + 5)),
            (failed.id, changes.failure_decision("w1", failed.attempts, NOW + 5, exit_code=1)),
        ]
    )
    monkeypatch.undo()
    assert store.jobs.get_job(done.id).status is Status.DONE
    assert results[0] == lifecycle.Reported(store.jobs.get_job(done.id))
    if fault is errors.StoreUnavailable:  # the rest answered by it (503: the worker sends it again)
        assert isinstance(results[1], errors.StoreUnavailable)
        assert store.jobs.get_job(failed.id).status is Status.RUNNING
    else:  # the rest each alone, as the group commit does with a group that raised
        assert results[1] == lifecycle.Reported(store.jobs.get_job(failed.id))
        assert results[1].job.status is Status.PENDING


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped first", "done first"])
def test_a_done_racing_the_reaper_on_another_connection_has_one_winner(postgres_store, reaped):
    """The reaper holds the job's row locked while it decides; the done's one statement waits for
    it, then sees the row the reaper left: a lapsed lease re-queued the job (the done refused as the
    decision refuses it, nothing of it written), a fresh one left it running (the done settles it)."""
    import threading

    import psycopg

    from corral.store import open_store
    from corral.store.jobs import SqlJobs

    store = postgres_store
    (job,) = running(store, 1)
    reaper = open_store(store.url, migrate=False)
    outcome: list[object] = []
    backend: list[int] = []

    def report() -> None:
        backend.append(store.connection().info.backend_pid)
        try:
            outcome.append(store.jobs.change(job.id, changes.done_decision("w1", job.attempts, NOW + 50)))
        except errors.CorralError as error:
            outcome.append(error)

    reporter = threading.Thread(target=report)

    def decide(current, gang):
        reporter.start()
        with psycopg.connect(store.url, autocommit=True) as watcher:
            waiting = "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'"
            while not backend or not watcher.execute(waiting, (backend[0],)).fetchall():
                reporter.join(0.01)
                assert reporter.is_alive(), outcome
        return lifecycle.lease_expired(current, gang, NOW + (100 if reaped else 5), timeout_s=30)

    try:
        SqlJobs.change(reaper.jobs, job.id, decide)
    finally:
        reaper.close()
    reporter.join()
    stored = store.jobs.get_job(job.id)
    history = assert_history_is_legal(store, job.id)
    if reaped:
        assert isinstance(outcome[0], errors.StaleAttempt), outcome
        assert stored.status is Status.PENDING and stored.worker_id is None
        assert [event.to_status for event in history][-1] is Status.PENDING
    else:
        assert outcome[0] == lifecycle.Reported(stored) and stored.status is Status.DONE
    usage = store.read().execute(USAGE_READ, (job.id,))
    assert [(row[1], row[11]) for row in usage] == [
        (job.attempts, stored.status.value if not reaped else "pending")
    ]


@pytest.mark.parametrize("attempt", [2**31, 2**62, -(2**40)])
def test_a_done_of_an_attempt_past_the_column_is_a_stale_attempt(store, attempt):
    """The fence takes any 64-bit attempt; the column holds 32 bits: the one statement must compare
    them, not fail on the parameter (500, its connection dropped), and the decision refuse it."""
    (job,) = running(store, 1)
    with pytest.raises(errors.StaleAttempt):
        store.jobs.change(job.id, changes.done_decision("w1", attempt, NOW + 5))
    (refused,) = store.jobs.change_many([(job.id, changes.done_decision("w1", attempt, NOW + 5))])
    assert isinstance(refused, errors.StaleAttempt), refused
    assert store.jobs.get_job(job.id).status is Status.RUNNING
