"""The admission cycle's snapshot (``Gangs.admission_inputs``), on SQLite and PostgreSQL: records
kept from one read to the next while their rows are unchanged, never a stale value (issue 13)."""

from __future__ import annotations

import pytest

from corral.core import admission, cycle
from corral.core.admission import CycleMemo
from corral.core.claim import Claim
from corral.core.preemption import PreemptionSettings
from corral.domain.pools import PoolDefaults
from corral.domain.records import JobSpec, Reason
from corral.domain.resources import Resources
from corral.domain.status import Status
from corral.server import changes
from corral.store import Store, open_store, rows
from corral.store.base import AdmissionInputs, JobReport, WorkerRegistration
from corral.testing.factories import gpu_job
from tests.conftest import postgres_schema_url
from tests.contract import protocol

NOW = 1_800_000_000.0
POLICY = Claim()


def fleet(store: Store) -> dict[str, str]:
    """Two workers of 4 GPUs, each running two jobs of one GPU (class 0, so the pending job is
    read as a possible preemptor), a pending job and a blocked gang of 2 x 4 GPUs. Answers each
    running job's id -> its worker."""
    for index in range(2):
        store.workers.register_worker(
            WorkerRegistration(f"w{index}", "10.0.0.1", Resources(4, 1000, 8192, 8)), NOW
        )
    protocol.submit(
        store,
        [JobSpec(command="run", resources=Resources(gpus=1), preemption_class=0) for _ in range(4)],
        NOW,
    )
    running = {}
    for index in range(2):
        for job in store.claims.claim_many(f"w{index}", NOW, POLICY, 2):
            running[job.id] = f"w{index}"
    protocol.submit(store, [JobSpec(command="wait", resources=Resources(gpus=1))], NOW + 1)
    protocol.submit(store, [JobSpec(command="train", gang_size=2, resources=Resources(gpus=4))], NOW + 2)
    return running


def records(inputs: AdmissionInputs) -> dict[str, object]:
    """Every record of the snapshot by a key of its own: jobs, workers, allocations."""
    found: dict[str, object] = {f"job {job.id}": job for job in inputs.holding + inputs.pending}
    found.update((f"job {task.id}", task) for _, tasks in inputs.gangs for task in tasks)
    found.update((f"worker {worker.id}", worker) for worker in inputs.workers)
    found.update((f"allocation {allocation.job_id}", allocation) for allocation in inputs.allocations)
    return found


def same_objects(
    before: AdmissionInputs, after: AdmissionInputs, except_keys: set[str] | None = None
) -> None:
    """The same record objects in both reads, but those of ``except_keys``: new ones."""
    except_keys = except_keys or set()
    old, new = records(before), records(after)
    assert set(old) == set(new)
    reused = {key for key in new if new[key] is old[key]}
    assert reused == set(new) - except_keys
    for key in except_keys:
        assert new[key] is not old[key]


def test_an_unchanged_store_gives_the_same_records(store):
    fleet(store)
    first = store.gangs.admission_inputs()
    assert len(first.holding) == 4 and len(first.pending) == 1 and len(first.gangs) == 1
    assert len(first.allocations) == 4 and len(first.workers) == 2
    same_objects(first, store.gangs.admission_inputs())


def test_heartbeats_leave_the_records_as_they_were_and_carry_no_readings(store):
    running = fleet(store)
    first = store.gangs.admission_inputs()
    report = JobReport(progress={"step": 7}, gpu_util_pct=93.0, rss_mb=2048.0)
    for job_id, worker_id in running.items():
        store.jobs.heartbeat_job(job_id, worker_id, 1, NOW + 15, report)
    for worker_id in ("w0", "w1"):
        store.workers.worker_heartbeat(
            worker_id, NOW + 15, [{"index": 0, "util_pct": 93.0, "mem_used_mb": 100}]
        )
    second = store.gangs.admission_inputs()
    same_objects(first, second)
    for job in second.holding:
        assert (job.last_heartbeat_at, job.progress, job.gpu_util_pct, job.rss_mb) == (None, None, None, None)
    for worker in second.workers:
        assert (worker.last_heartbeat_at, worker.gpu_stats) == (None, ())
    # what the heartbeats wrote is there for every other reader
    some_job = next(iter(running))
    assert store.jobs.get_job(some_job).progress == {"step": 7}


def test_a_checkpoint_time_a_heartbeat_brings_is_seen(store):
    running = fleet(store)
    first = store.gangs.admission_inputs()
    job_id, worker_id = next(iter(running.items()))
    store.jobs.heartbeat_job(job_id, worker_id, 1, NOW + 15, JobReport(checkpoint_at=NOW + 14))
    second = store.gangs.admission_inputs()
    # the allocation is made again with its job's record, equal to the one before
    same_objects(first, second, {f"job {job_id}", f"allocation {job_id}"})
    assert records(first)[f"allocation {job_id}"] == records(second)[f"allocation {job_id}"]
    assert next(job for job in second.holding if job.id == job_id).last_checkpoint_at == NOW + 14


def test_changed_rows_are_read_again_and_the_others_kept(store):
    running = fleet(store)
    first = store.gangs.admission_inputs()
    pending_id = first.pending[0].id
    changes.note_single_waiting(store.jobs, pending_id, Reason("no_fit", "nothing fits"), NOW + 11)
    finished_id, worker_id = next(iter(running.items()))
    protocol.complete(store, finished_id, worker_id, 1, NOW + 12)
    store.workers.drain_worker("w1")
    second = store.gangs.admission_inputs()
    old, new = records(first), records(second)
    assert set(old) - set(new) == {f"job {finished_id}", f"allocation {finished_id}"}
    changed = {f"job {pending_id}", "worker w1"}
    assert {key for key in new if new[key] is not old[key]} == changed
    assert second.pending[0].reason == Reason("no_fit", "nothing fits")
    assert next(worker for worker in second.workers if worker.id == "w1").status == "draining"
    assert all(job.id != finished_id for job in second.holding)


def test_a_replica_sees_what_another_wrote(store_url):
    # Each replica keeps its own records; a row another one changed is read again all the same.
    first_replica, second_replica = open_store(store_url), open_store(store_url)
    try:
        running = fleet(first_replica)
        before = first_replica.gangs.admission_inputs()
        second_replica.gangs.admission_inputs()
        job_id, worker_id = next(iter(running.items()))
        protocol.complete(second_replica, job_id, worker_id, 1, NOW + 12)
        after = first_replica.gangs.admission_inputs()
        assert [job.id for job in after.holding] == [job.id for job in before.holding if job.id != job_id]
        reread = second_replica.jobs.get_job(job_id)
        assert reread is not None and reread.status == Status.DONE
    finally:
        first_replica.close()
        second_replica.close()


def test_the_cycle_memo_over_kept_records_decides_as_a_count_from_scratch(store):
    # The server passes its ``CycleMemo`` with the records the store kept: round after round, with
    # rows changing in between, the decisions are those made without it.
    running = fleet(store)
    protocol.submit(
        store, [JobSpec(command="urgent", resources=Resources(gpus=3), preemption_class=5)], NOW + 3
    )
    memo = CycleMemo()
    job_ids = list(running)
    steps = [
        lambda: None,
        lambda: store.jobs.heartbeat_job(
            job_ids[0], running[job_ids[0]], 1, NOW + 20, JobReport(checkpoint_at=NOW + 19)
        ),
        lambda: store.jobs.heartbeat_job(
            job_ids[1], running[job_ids[1]], 1, NOW + 21, JobReport(progress={"step": 1})
        ),
        lambda: protocol.complete(store, job_ids[2], running[job_ids[2]], 1, NOW + 22),
        lambda: store.workers.register_worker(
            WorkerRegistration("w2", "10.0.0.2", Resources(1, 1000, 8192, 8)), NOW + 23
        ),
        lambda: store.workers.drain_worker("w0"),
    ]
    planned = 0
    for round_, step in enumerate(steps):
        step()
        now = NOW + 30 + round_
        inputs = store.gangs.admission_inputs()
        reading = cycle.CycleReading(
            inputs.workers, inputs.allocations, inputs.gangs, inputs.holding, inputs.pending
        )
        pools = cycle.PoolsReading({}, {}, {}, PoolDefaults())
        snapshot = cycle.snapshot_of(reading, now, pools, lambda paths: (), {}, fair_share=False)
        with_memo = admission.decide(snapshot, 30.0, PreemptionSettings(), memo)
        assert with_memo == admission.decide(snapshot, 30.0, PreemptionSettings(), None)
        planned += len(with_memo.preemptions)
    assert planned, "the rounds exercise the planner"


def test_no_transition_writes_a_column_the_admission_read_compares_without():
    # The admission read compares kept records on the columns that may change after the submit;
    # a transition that wrote a spec column would leave a kept record stale.
    job = gpu_job()
    for field_name, columns_of in rows._COLUMNS_OF_FIELD.items():
        assert not set(columns_of(job)) & rows.JOB_SPEC_COLUMNS, field_name


def test_spec_columns_stay_as_submitted_through_a_jobs_life(store):
    running = fleet(store)
    spec_columns = sorted(rows.JOB_SPEC_COLUMNS)

    def specs():
        selected = store._read().execute(f"SELECT id, {', '.join(spec_columns)} FROM jobs ORDER BY id")
        return {row[0]: row[1:] for row in selected}

    submitted = specs()
    job_ids = list(running)
    full = JobReport(progress={"step": 3}, gpu_util_pct=90.0, rss_mb=512.0, checkpoint_at=NOW + 4)
    store.jobs.heartbeat_job(job_ids[0], running[job_ids[0]], 1, NOW + 5, full)
    store.jobs.heartbeat_jobs(running[job_ids[1]], NOW + 5, [(job_ids[1], 1, full)])
    protocol.complete(store, job_ids[2], running[job_ids[2]], 1, NOW + 6)
    protocol.fail(store, job_ids[3], running[job_ids[3]], 1, NOW + 7, exit_code=1)
    changes.note_single_waiting(
        store.jobs, store.gangs.admission_inputs().pending[0].id, Reason("x", "y"), NOW + 8
    )
    assert specs() == submitted


def test_preemptors_ahead_counts_the_cycles_read_by_class_in_its_own_order(store: Store) -> None:
    """``why``'s second search cap: for each pending job the read by class takes, the count of
    those ahead of it is its place in the read (the same queue order: class, priority, front,
    submission time, id); capped at ``limit``; None for a job of a class below every running one
    (the read by class never takes it) and while nothing runs."""
    store.workers.register_worker(WorkerRegistration("w0", "10.0.0.1", Resources(1, 1000, 8192, 8)), NOW)
    runs = JobSpec(command="run", resources=Resources(gpus=1), preemption_class=2)
    first = protocol.submit(store, [runs], NOW)
    assert store.gangs.preemptors_ahead(first.items[0].job) is None, "nothing runs yet"
    assert store.claims.claim("w0", NOW, POLICY) is not None
    waiting = [
        JobSpec(command="late", resources=Resources(gpus=1), preemption_class=3),
        JobSpec(command="important", resources=Resources(gpus=1), preemption_class=3, priority=5),
        JobSpec(command="high", resources=Resources(gpus=1), preemption_class=6),
        JobSpec(command="low", resources=Resources(gpus=1), preemption_class=1),
        JobSpec(command="same", resources=Resources(gpus=1), preemption_class=3),
    ]
    jobs = [item.job for item in protocol.submit(store, waiting, NOW + 1).items]
    read = store.gangs.admission_inputs().pending
    assert [job.spec.command for job in read] == ["high", "important", "late", "same"]
    for place, job in enumerate(read):
        assert store.gangs.preemptors_ahead(job) == place, job.spec.command
        assert store.gangs.preemptors_ahead(job, limit=2) == min(place, 2)
    low = next(job for job in jobs if job.spec.command == "low")
    assert store.gangs.preemptors_ahead(low) is None, "class 1 is below the lowest running class, 2"


def test_a_time_moved_by_a_microsecond_is_seen(store):
    # PostgreSQL compares each row's changeable columns as one text (``Dialect.row_text``): a float
    # in it keeps every digit, so the smallest change of a time still gives a new record.
    running = fleet(store)
    job_id = next(iter(running))
    first = store.gangs.admission_inputs()
    started = next(job for job in first.holding if job.id == job_id).started_at
    assert started is not None
    moved = started + 1e-6
    assert moved != started
    with store.gangs.db.transaction() as tx:
        tx.execute("UPDATE jobs SET started_at = ? WHERE id = ?", (moved, job_id))
    second = store.gangs.admission_inputs()
    same_objects(first, second, {f"job {job_id}", f"allocation {job_id}"})
    assert next(job for job in second.holding if job.id == job_id).started_at == moved


@pytest.mark.postgres
def test_a_time_moved_by_a_microsecond_is_seen_where_the_server_rounds_floats():
    # A server (or role) configured with extra_float_digits 0 writes floats to 15 digits: the row
    # text would then be equal for two times a microsecond apart. The store pins 1 per session.
    for url in postgres_schema_url():
        rounded = url.replace("options=-csearch_path", "options=-cextra_float_digits%3D0%20-csearch_path")
        assert rounded != url
        opened = open_store(rounded)
        try:
            test_a_time_moved_by_a_microsecond_is_seen(opened)
        finally:
            opened.close()
