"""The store contract: every test runs on SQLite and on PostgreSQL (the ``store`` fixture)."""

from __future__ import annotations

import threading

import pytest

from corral.core import workers as worker_rules
from corral.domain import errors
from corral.domain.records import Constraints, GpuReading, Job
from corral.domain.resources import Resources
from corral.domain.status import Status
from corral.server import changes
from corral.store import open_store
from corral.store.base import JobFilter, JobReport, LeaseRenewed
from tests.contract import protocol
from tests.helpers import NOW, POLICY, assert_history_is_legal, register, spec, submit_one

# --- submit ---------------------------------------------------------------------------------


def test_submit_single_job_is_pending_with_its_event(store):
    job = submit_one(store, name="hello", env={"A": "1"}, resources=Resources(gpus=1, cpus=2))
    stored = store.jobs.get_job(job.id)
    assert stored == job
    assert stored.status == Status.PENDING
    assert stored.spec.env == {"A": "1"}
    events = assert_history_is_legal(store, job.id)
    assert [(event.from_status, event.to_status) for event in events] == [(None, Status.PENDING)]


def test_submit_gang_creates_blocked_tasks_in_index_order(store):
    item = protocol.submit(store, [spec(gang_size=3)], NOW).items[0]
    assert item.gang_id.startswith("g-")
    tasks = store.jobs.gang_tasks(item.gang_id)
    assert [task.id for task in tasks] == [task.id for task in item.tasks]
    assert [task.gang_index for task in tasks] == [0, 1, 2]
    assert {task.status for task in tasks} == {Status.BLOCKED}


def test_batch_keeps_its_order_in_the_queue(store):
    result = protocol.submit(store, [spec(name=str(index)) for index in range(20)], NOW)
    listed = store.jobs.list_jobs(JobFilter(), 100, None)
    assert [job.id for job in listed] == [item.job.id for item in result.items]


def test_idempotency_key_replays_the_first_result(store):
    first = protocol.submit(store, [spec()], NOW, "key-1", "fingerprint")
    second = protocol.submit(store, [spec()], NOW + 1, "key-1", "fingerprint")
    assert second.replayed
    assert second.items[0].job.id == first.items[0].job.id
    assert len(store.jobs.list_jobs(JobFilter(), 100, None)) == 1
    with pytest.raises(errors.Conflict):
        protocol.submit(store, [spec(command="other")], NOW, "key-1", "another fingerprint")


# --- claim ----------------------------------------------------------------------------------


def test_claim_follows_queue_order(store):
    register(store)
    low = submit_one(store, priority=0)
    high = submit_one(store, priority=5)
    top_class = submit_one(store, preemption_class=9)
    order = [store.claims.claim("w1", NOW, POLICY).id for _ in range(3)]
    assert order == [top_class.id, high.id, low.id]
    assert store.claims.claim("w1", NOW, POLICY) is None


def test_claim_respects_capacity_and_assigns_distinct_gpus(store):
    register(store, gpus=2, vram_mb=1000)
    jobs = [submit_one(store, resources=Resources(gpus=1)) for _ in range(3)]
    first = store.claims.claim("w1", NOW, POLICY)
    second = store.claims.claim("w1", NOW, POLICY)
    assert {first.id, second.id} == {jobs[0].id, jobs[1].id}
    assert sorted(first.gpu_indices + second.gpu_indices) == [0, 1]
    assert store.claims.claim("w1", NOW, POLICY) is None
    protocol.complete(store, first.id, "w1", 1, NOW)
    third = store.claims.claim("w1", NOW, POLICY)
    assert third.id == jobs[2].id
    assert third.gpu_indices == first.gpu_indices


def test_claim_skips_jobs_that_do_not_fit_for_those_that_do(store):
    register(store, cpus=4, gpu_model=None, labels={"rack": "r1"})
    too_big = submit_one(store, resources=Resources(cpus=8))
    wrong_rack = submit_one(store, constraints=Constraints(labels={"rack": "r2"}))
    fits = submit_one(store, constraints=Constraints(labels={"rack": "r1"}))
    assert store.claims.claim("w1", NOW, POLICY).id == fits.id
    assert store.claims.claim("w1", NOW, POLICY) is None
    assert store.jobs.get_job(too_big.id).status == Status.PENDING
    assert store.jobs.get_job(wrong_rack.id).status == Status.PENDING


def test_claim_by_unknown_or_draining_worker(store):
    submit_one(store)
    with pytest.raises(errors.NotFound):
        store.claims.claim("ghost", NOW, POLICY)
    register(store)
    store.workers.drain_worker("w1")
    assert store.claims.claim("w1", NOW, POLICY) is None


def test_claim_sets_attempt_worker_and_lease(store):
    register(store)
    job = submit_one(store)
    claimed = store.claims.claim("w1", NOW + 5, POLICY)
    assert (claimed.id, claimed.status, claimed.attempts, claimed.worker_id) == (
        job.id,
        Status.RUNNING,
        1,
        "w1",
    )
    assert claimed.started_at == claimed.last_heartbeat_at == NOW + 5


def test_concurrent_claims_never_hand_out_a_job_twice(store_url, store):
    protocol.submit(store, [spec() for _ in range(120)], NOW)
    for index in range(4):
        register(store, f"w{index}", cpus=1000)
    claimed: list[str] = []
    lock = threading.Lock()

    def claim_all(worker_id):
        own = open_store(store_url, migrate=False)
        try:
            while (job := own.claims.claim(worker_id, NOW, POLICY)) is not None:
                with lock:
                    claimed.append(job.id)
        finally:
            own.close()

    threads = [threading.Thread(target=claim_all, args=(f"w{index}",)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(claimed) == 120
    assert len(set(claimed)) == 120


def test_concurrent_claims_for_one_worker_never_overfill_it(store):
    """The server's store threads share one store: claims for one worker from several threads at
    once (a worker's retried claim beside its first) take turns on the worker row, and each sees
    the others' jobs, so the worker never holds more than it offers."""
    protocol.submit(store, [spec(resources=Resources(cpus=1)) for _ in range(20)], NOW)
    register(store, "w1", cpus=3)
    start = threading.Barrier(8)
    claimed: list[str] = []
    lock = threading.Lock()

    def claim_some() -> None:
        start.wait(10)
        for _ in range(3):
            job = store.claims.claim("w1", NOW, POLICY)
            if job is not None:
                with lock:
                    claimed.append(job.id)

    threads = [threading.Thread(target=claim_some) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(claimed) == len(set(claimed)) == 3
    assert len(store.jobs.list_jobs(JobFilter(status=("running",)), 100, None)) == 3


# --- fenced reports -------------------------------------------------------------------------


def test_reports_from_a_stale_attempt_or_worker_change_nothing(store):
    register(store)
    register(store, "w2")
    job = submit_one(store)
    store.claims.claim("w1", NOW, POLICY)
    for worker_id, attempt in (("w1", 2), ("w2", 1)):
        with pytest.raises(errors.StaleAttempt):
            protocol.heartbeat_job(store, job.id, worker_id, attempt, NOW, None)
        with pytest.raises(errors.StaleAttempt):
            protocol.complete(store, job.id, worker_id, attempt, NOW)
        with pytest.raises(errors.StaleAttempt):
            protocol.fail(store, job.id, worker_id, attempt, NOW, 1, None, None)
    assert store.jobs.get_job(job.id).status == Status.RUNNING
    assert len(store.jobs.job_events(job.id)) == 2


def test_done_then_done_again_is_not_running(store):
    register(store)
    job = submit_one(store)
    store.claims.claim("w1", NOW, POLICY)
    assert protocol.complete(store, job.id, "w1", 1, NOW + 3).status == Status.DONE
    with pytest.raises(errors.NotRunning):
        protocol.complete(store, job.id, "w1", 1, NOW + 4)
    with pytest.raises(errors.NotRunning):
        protocol.heartbeat_job(store, job.id, "w1", 1, NOW, None)
    with pytest.raises(errors.NotFound):
        protocol.complete(store, "j-missing", "w1", 1, NOW)
    finished = store.jobs.get_job(job.id)
    assert (finished.finished_at, finished.exit_code) == (NOW + 3, 0)
    assert_history_is_legal(store, job.id)


def test_heartbeat_renews_the_lease_and_records_progress(store):
    register(store)
    job = submit_one(store)
    store.claims.claim("w1", NOW, POLICY)
    beat = protocol.heartbeat_job(store, job.id, "w1", 1, NOW + 7, {"step": 12})
    assert (beat.last_heartbeat_at, beat.progress) == (NOW + 7, {"step": 12})


def test_a_batch_of_heartbeats_reads_back_only_what_each_answer_needs(store):
    """``heartbeat_jobs`` (issue 13): a running job's lease is renewed with its report and comes back
    as ``LeaseRenewed`` alone; a job being stopped as its renewed row (its checkpoint phase); a
    stale attempt as its untouched row (the refusal); an unknown job as None."""
    register(store)
    register(store, "w2")
    running, stopping, elsewhere = (submit_one(store) for _ in range(3))
    store.claims.claim("w1", NOW, POLICY)
    store.claims.claim("w1", NOW, POLICY)
    store.claims.claim("w2", NOW, POLICY)
    protocol.cancel(store, stopping.id, NOW + 1)
    untouched = store.jobs.get_job(elsewhere.id)
    found = store.jobs.heartbeat_jobs(
        "w1",
        NOW + 5,
        [
            (running.id, 1, JobReport(progress={"step": 3}, gpu_util_pct=50.0, rss_mb=100.0)),
            (stopping.id, 1, JobReport()),
            (elsewhere.id, 1, JobReport(progress={"step": 9})),
            ("j-missing", 1, JobReport()),
        ],
    )
    assert found[0] == LeaseRenewed(running.id)
    renewed = store.jobs.get_job(running.id)
    assert (renewed.last_heartbeat_at, renewed.progress, renewed.gpu_util_pct, renewed.rss_mb) == (
        NOW + 5,
        {"step": 3},
        50.0,
        100.0,
    )
    assert found[1] == store.jobs.get_job(stopping.id)
    assert isinstance(found[1], Job)
    assert (found[1].status, found[1].last_heartbeat_at) == (Status.PREEMPTING, NOW + 5)
    assert found[2] == untouched == store.jobs.get_job(elsewhere.id)
    assert found[3] is None
    # a heartbeat that reports nothing renews the lease and keeps what was reported before
    assert store.jobs.heartbeat_jobs("w1", NOW + 6, [(running.id, 1, JobReport())]) == [
        LeaseRenewed(running.id)
    ]
    assert (store.jobs.get_job(running.id).last_heartbeat_at, store.jobs.get_job(running.id).progress) == (
        NOW + 6,
        {"step": 3},
    )
    # a job named twice is renewed twice, in order: the later report is the one kept
    twice = [
        (running.id, 1, JobReport(progress={"step": 4})),
        (running.id, 1, JobReport(progress={"step": 5})),
    ]
    assert store.jobs.heartbeat_jobs("w1", NOW + 7, twice) == [LeaseRenewed(running.id)] * 2
    assert store.jobs.get_job(running.id).progress == {"step": 5}
    # any attempt the protocol allows is refused by the row, not by the store's arrays (Schemathesis)
    assert store.jobs.heartbeat_jobs("w1", NOW + 8, [(running.id, 2**63 - 1, JobReport())]) == [
        store.jobs.get_job(running.id)
    ]


def test_a_worker_heartbeat_returns_the_held_jobs_its_running_list_leaves_out(store):
    register(store)
    listed, left_out, stopping, finished = (submit_one(store) for _ in range(4))
    for _ in range(4):
        store.claims.claim("w1", NOW, POLICY)
    protocol.cancel(store, stopping.id, NOW + 1)
    protocol.complete(store, finished.id, "w1", 1, NOW + 1)
    beat = store.workers.worker_heartbeat("w1", NOW + 2, None, running=[listed.id])
    assert beat.unlisted == tuple(
        sorted((store.jobs.get_job(left_out.id), store.jobs.get_job(stopping.id)), key=lambda job: job.id)
    )
    assert (
        store.workers.worker_heartbeat(
            "w1", NOW + 3, None, running=[listed.id, left_out.id, stopping.id]
        ).unlisted
        == ()
    )
    assert store.workers.worker_heartbeat("w1", NOW + 4, None).unlisted == ()  # no list: nothing to judge


@pytest.mark.parametrize("max_retries", [0, 1, 3])
def test_fail_retries_while_attempts_remain(store, max_retries):
    register(store)
    job = submit_one(store, max_retries=max_retries)
    statuses = []
    for attempt in range(1, max(max_retries, 1) + 1):
        assert store.claims.claim("w1", NOW, POLICY).attempts == attempt
        statuses.append(protocol.fail(store, job.id, "w1", attempt, NOW, 2, "exit 2", "tail").status)
    assert statuses == [Status.PENDING] * (max(max_retries, 1) - 1) + [Status.FAILED]
    failed = store.jobs.get_job(job.id)
    assert (failed.exit_code, failed.output_tail, failed.reason.code) == (2, "tail", "failed")
    assert store.claims.claim("w1", NOW, POLICY) is None
    assert_history_is_legal(store, job.id)


# --- cancel ---------------------------------------------------------------------------------


def test_cancel_pending_is_immediate_and_terminal_is_refused(store):
    job = submit_one(store)
    assert [changed.status for changed in protocol.cancel(store, job.id, NOW)] == [Status.CANCELLED]
    with pytest.raises(errors.AlreadyTerminal):
        protocol.cancel(store, job.id, NOW)
    with pytest.raises(errors.NotFound):
        protocol.cancel(store, "j-missing", NOW)


def test_cancel_running_stops_through_the_worker(store):
    register(store)
    job = submit_one(store)
    store.claims.claim("w1", NOW, POLICY)
    (stopping,) = protocol.cancel(store, job.id, NOW + 1)
    assert (stopping.status, stopping.preemption_epoch, stopping.cancel_requested) == (
        Status.PREEMPTING,
        1,
        True,
    )
    assert protocol.heartbeat_job(store, job.id, "w1", 1, NOW + 2, None).status == Status.PREEMPTING
    with pytest.raises(errors.StaleEpoch):
        protocol.ack_preempted(store, job.id, "w1", 1, 7, NOW + 3)
    with pytest.raises(errors.StaleAttempt):
        protocol.ack_preempted(store, job.id, "w1", 2, 1, NOW + 3)
    assert protocol.ack_preempted(store, job.id, "w1", 1, 1, NOW + 3).status == Status.CANCELLED
    with pytest.raises(errors.NotPreempting):
        protocol.ack_preempted(store, job.id, "w1", 1, 1, NOW + 4)
    assert_history_is_legal(store, job.id)


def test_a_job_that_finishes_while_being_cancelled_keeps_its_result(store):
    register(store)
    job = submit_one(store)
    store.claims.claim("w1", NOW, POLICY)
    protocol.cancel(store, job.id, NOW)
    assert protocol.complete(store, job.id, "w1", 1, NOW).status == Status.DONE
    other = submit_one(store)
    store.claims.claim("w1", NOW, POLICY)
    protocol.cancel(store, other.id, NOW)
    assert protocol.fail(store, other.id, "w1", 1, NOW, 143, "terminated", None).status == Status.CANCELLED


def test_cancelling_a_gang_task_cancels_the_gang(store):
    item = protocol.submit(store, [spec(gang_size=2)], NOW).items[0]
    changed = protocol.cancel(store, item.tasks[1].id, NOW)
    assert changed[0].id == item.tasks[1].id
    assert {task.status for task in store.jobs.gang_tasks(item.gang_id)} == {Status.CANCELLED}


# --- reaper ---------------------------------------------------------------------------------


def test_reaper_requeues_then_fails_expired_leases(store):
    register(store)
    job = submit_one(store, max_retries=2)
    store.claims.claim("w1", NOW, POLICY)
    assert protocol.reap(store, NOW + 29, 30, 45, 600).requeued == ()
    report = protocol.reap(store, NOW + 31, 30, 45, 600)
    assert [requeued.id for requeued in report.requeued] == [job.id]
    assert store.jobs.get_job(job.id).reason.code == "lease_expired"
    assert protocol.reap(store, NOW + 31, 30, 45, 600).requeued == ()  # idempotent
    store.claims.claim("w1", NOW + 40, POLICY)
    protocol.heartbeat_job(store, job.id, "w1", 2, NOW + 60, None)
    assert protocol.reap(store, NOW + 80, 30, 45, 600).failed == ()
    report = protocol.reap(store, NOW + 91, 30, 45, 600)
    assert [failed.id for failed in report.failed] == [job.id]
    assert store.jobs.get_job(job.id).status == Status.FAILED
    assert_history_is_legal(store, job.id)


def test_reaper_force_drains_a_stop_nobody_acked(store):
    register(store)
    job = submit_one(store)
    store.claims.claim("w1", NOW, POLICY)
    protocol.cancel(store, job.id, NOW)
    assert protocol.reap(store, NOW + 44, 1000, 45, 600).force_drained == ()
    (drained,) = protocol.reap(store, NOW + 46, 1000, 45, 600).force_drained
    assert drained.status == Status.CANCELLED


def test_workers_go_offline_and_come_back(store):
    register(store, gpus=1)
    assert protocol.reap(store, NOW + 61, 30, 45, 60).offline_workers == ("w1",)
    assert store.workers.get_worker("w1").worker.status == "offline"
    beat = store.workers.worker_heartbeat("w1", NOW + 62, [{"index": 0, "util_pct": 5.0}])
    assert beat.worker.status == "active"
    assert beat.worker.gpu_stats == (GpuReading(0, 5.0, None),)
    register(store)  # re-register keeps registered_at
    assert store.workers.get_worker("w1").worker.registered_at == NOW
    with pytest.raises(errors.NotFound):
        store.workers.worker_heartbeat("ghost", NOW, None)


def test_worker_view_counts_what_it_holds(store):
    register(store, gpus=4, vram_mb=100)
    job = submit_one(store, resources=Resources(gpus=3, cpus=2))
    store.claims.claim("w1", NOW, POLICY)
    view = store.workers.get_worker("w1")
    assert view.used == Resources(gpus=3, vram_mb=0, memory_mb=0, cpus=2)
    assert view.running == (job.id,)


# --- listing --------------------------------------------------------------------------------


def test_list_filters_and_cursor(store):
    register(store)
    jobs = [submit_one(store, pool="team/a" if index % 2 else "default") for index in range(7)]
    store.claims.claim("w1", NOW, POLICY)
    page_one = store.jobs.list_jobs(JobFilter(), 3, None)
    page_two = store.jobs.list_jobs(JobFilter(), 3, (page_one[-1].submitted_at, page_one[-1].id))
    page_three = store.jobs.list_jobs(JobFilter(), 3, (page_two[-1].submitted_at, page_two[-1].id))
    assert [job.id for job in page_one + page_two + page_three] == [job.id for job in jobs]
    assert {job.spec.pool for job in store.jobs.list_jobs(JobFilter(pool="team/a"), 100, None)} == {"team/a"}
    running = store.jobs.list_jobs(JobFilter(status=("running",), worker_id="w1"), 100, None)
    assert [job.id for job in running] == [jobs[0].id]
    assert store.jobs.count_jobs_by_status() == {"pending": 6, "running": 1}


def test_list_newest_first_walks_the_cursor_backwards(store):
    jobs = [submit_one(store, pool="team/a" if index % 2 else "default") for index in range(7)]
    newest = JobFilter(newest=True)
    page_one = store.jobs.list_jobs(newest, 3, None)
    page_two = store.jobs.list_jobs(newest, 3, (page_one[-1].submitted_at, page_one[-1].id))
    page_three = store.jobs.list_jobs(newest, 3, (page_two[-1].submitted_at, page_two[-1].id))
    assert [job.id for job in page_one + page_two + page_three] == [job.id for job in reversed(jobs)]
    in_pool = store.jobs.list_jobs(JobFilter(pool="team/a", newest=True), 2, None)
    assert [job.id for job in in_pool] == [jobs[5].id, jobs[3].id]


def test_list_by_user_either_way(store):
    mine = [submit_one(store, user="alice") for _ in range(3)]
    submit_one(store, user="bob")
    submit_one(store)
    assert [job.id for job in store.jobs.list_jobs(JobFilter(user="alice"), 100, None)] == [
        job.id for job in mine
    ]
    newest = store.jobs.list_jobs(JobFilter(user="alice", newest=True), 2, None)
    assert [job.id for job in newest] == [mine[2].id, mine[1].id]
    after = (newest[-1].submitted_at, newest[-1].id)
    assert [job.id for job in store.jobs.list_jobs(JobFilter(user="alice", newest=True), 2, after)] == [
        mine[0].id
    ]
    assert store.jobs.list_jobs(JobFilter(user="carol"), 100, None) == []


def test_a_worker_that_leaves_is_offline_and_only_then_removable(store):
    register(store, "w1")
    register(store, "w2")
    with pytest.raises(errors.Conflict, match="only an offline worker"):
        store.workers.remove_worker("w1", worker_rules.removal_refused)
    store.workers.change_worker("w1", worker_rules.leaves)
    assert store.workers.get_worker("w1").worker.status == "offline"
    assert store.workers.change_worker("w1", worker_rules.leaves) is None  # already offline
    store.workers.remove_worker("w1", worker_rules.removal_refused)
    assert store.workers.get_worker("w1") is None
    assert [worker.id for worker in store.workers.workers()] == ["w2"]
    with pytest.raises(errors.NotFound):
        store.workers.remove_worker("w1", worker_rules.removal_refused)


def test_an_offline_worker_that_still_holds_a_job_is_not_removed(store):
    register(store, "w1")
    job = submit_one(store)
    store.claims.claim("w1", NOW, POLICY)
    store.workers.change_worker("w1", worker_rules.leaves)
    with pytest.raises(errors.Conflict, match="still holds 1 job"):
        store.workers.remove_worker("w1", worker_rules.removal_refused)
    assert store.workers.get_worker("w1").running == (job.id,)


@pytest.mark.postgres
def test_postgres_store_reconnects_after_losing_its_connection(postgres_store):
    import psycopg

    store = postgres_store
    job = submit_one(store)
    backend = store.connection().info.backend_pid
    with psycopg.connect(store.url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
    with pytest.raises(errors.StoreUnavailable):
        store.jobs.get_job(job.id)
    assert store.jobs.get_job(job.id) == job
    store.ping(1.0)


# --- watchdogs ------------------------------------------------------------------------------


def test_watchdog_trip_requeues_at_the_front_then_fails(store):
    register(store)
    job = submit_one(store)
    submit_one(store)
    store.claims.claim("w1", NOW, POLICY)
    first = protocol.watchdog_trip(store, job.id, "w1", 1, NOW, "budget", "ran 3600s of 3600s", max_retries=1)
    assert (first.status, first.watchdog_retries, first.queue_front) == (Status.PENDING, 1, True)
    again = store.claims.claim("w1", NOW, POLICY)
    assert (again.id, again.queue_front) == (job.id, False)
    with pytest.raises(errors.StaleAttempt):
        protocol.watchdog_trip(store, job.id, "w1", 1, NOW, "budget", "late", max_retries=1)
    second = protocol.watchdog_trip(
        store, job.id, "w1", 2, NOW, "budget", "ran 3600s of 3600s", max_retries=1
    )
    assert (second.status, second.reason.code) == (Status.FAILED, "watchdog_budget")
    assert_history_is_legal(store, job.id)


def test_dead_workers_are_flagged_once_until_a_heartbeat(store):
    register(store, "busy")
    register(store, "idle")
    submit_one(store)
    store.claims.claim("busy", NOW, POLICY)
    flagged = changes.flag_dead_workers(store.workers, NOW + 31, 30)
    assert [(worker.id, running) for worker, running in flagged] == [("busy", 1)]
    assert changes.flag_dead_workers(store.workers, NOW + 40, 30) == []
    store.workers.worker_heartbeat("busy", NOW + 41, None)
    assert store.workers.get_worker("busy").worker.flagged_dead_at is None
    assert [worker.id for worker, _ in changes.flag_dead_workers(store.workers, NOW + 80, 30)] == ["busy"]


def test_a_released_job_goes_back_without_spending_its_attempt(store):
    register(store)
    job = submit_one(store, max_retries=1)
    store.claims.claim("w1", NOW, POLICY)
    released = protocol.fail(store, job.id, "w1", 1, NOW, 143, "worker shut down", None, release=True)
    assert (released.status, released.attempts_used, released.reason.code) == (Status.PENDING, 0, "released")
    again = store.claims.claim("w1", NOW, POLICY)
    assert again.attempts == 2, "the fence still grows"
    assert protocol.fail(store, job.id, "w1", 2, NOW, 1, None, None).status == Status.FAILED


def test_claims_follow_the_core_queue_order(store):
    """The claim's ORDER BY and the core's sort key come from one declaration
    (``corral.domain.queue_order``): a claim always takes the job the core puts first."""
    from random import Random

    from corral.core.ordering import in_queue_order

    rng = Random(3)
    register(store, cpus=1000)
    specs = [spec(preemption_class=rng.randint(0, 10), priority=rng.randint(-2, 2)) for _ in range(60)]
    ids = [item.job.id for item in protocol.submit(store, specs, NOW).items]
    tripped = [store.claims.claim("w1", NOW, POLICY) for _ in range(6)]
    for claimed in tripped:  # re-queued at the front of their class and priority by a watchdog trip
        protocol.watchdog_trip(store, claimed.id, "w1", claimed.attempts, NOW, "stall", "", max_retries=3)
    expected = [job.id for job in in_queue_order([store.jobs.get_job(job_id) for job_id in ids])]
    assert [store.claims.claim("w1", NOW, POLICY).id for _ in ids] == expected


def test_a_worker_heartbeat_keeps_a_drain_and_answers_the_contact_before_it(store):
    """PostgreSQL writes the common heartbeat as one statement (the row locked, updated, returned
    with its contact before): the same answers as the locked read-then-write."""
    register(store, gpus=2, vram_mb=100)
    store.workers.drain_worker("w1")
    beat = store.workers.worker_heartbeat("w1", NOW + 5, [{"index": 0, "util_pct": 1.0}], running=[])
    assert (beat.worker.status, beat.worker.last_heartbeat_at, beat.previous_contact) == (
        "draining",
        NOW + 5,
        NOW,
    )
    assert beat.unlisted == ()
    beat = store.workers.worker_heartbeat("w1", NOW + 9, None)  # no readings: the last ones are kept
    assert (beat.previous_contact, beat.worker.gpu_stats) == (NOW + 5, (GpuReading(0, 1.0, None),))
    assert store.workers.worker_heartbeat("w1", NOW + 10, None, unhealthy_gpus=[1]).previous_unhealthy == ()
    beat = store.workers.worker_heartbeat("w1", NOW + 11, None)
    assert (beat.previous_unhealthy, beat.worker.unhealthy_gpus, beat.previous_contact) == (
        (1,),
        (1,),
        NOW + 10,
    )
    assert store.workers.get_worker("w1").worker == beat.worker


def _beat_at_once(stores, times):
    """A heartbeat of worker w1 on each store at once; the contact each answered was the last."""
    previous: list[float | None] = [None] * len(stores)

    def beat(index: int) -> None:
        previous[index] = stores[index].workers.worker_heartbeat("w1", times[index], None).previous_contact

    threads = [threading.Thread(target=beat, args=(index,)) for index in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return previous


def test_concurrent_heartbeats_of_one_worker_each_answer_the_contact_before_their_own(store_url):
    """Two heartbeats of one worker at once: the first answers the contact before both, the second
    the first's (the row is locked before it is read: never both the same contact)."""
    stores = [open_store(store_url) for _ in range(2)]
    try:
        register(stores[0])
        contact = NOW
        for round_number in range(20):
            times = (NOW + 10 * round_number + 1, NOW + 10 * round_number + 2)
            previous = _beat_at_once(stores, times)
            view = stores[0].workers.get_worker("w1")
            assert view is not None
            last = view.worker.last_heartbeat_at
            first = times[0] if last == times[1] else times[1]
            assert sorted(previous) == sorted([contact, first]), (round_number, previous, last)
            contact = last
    finally:
        for opened in stores:
            opened.close()
