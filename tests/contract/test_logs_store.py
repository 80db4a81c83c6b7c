"""Job logs in the store (migration 8), on SQLite and PostgreSQL: appends idempotent by offset,
fenced like every report, trimmed to the per-attempt cap, kept per attempt, purged with retention."""

from __future__ import annotations

import pytest

from corral.core.claim import Claim
from corral.domain import errors
from corral.domain.records import JobSpec
from corral.domain.resources import Resources
from corral.domain.status import Status
from corral.store.base import WorkerRegistration
from tests.contract import protocol

NOW = 1_800_000_000.0
POLICY = Claim()


def running_job(store, max_retries=3):
    store.workers.register_worker(WorkerRegistration("w1", "127.0.0.1", Resources(0, 0, 8192, 8)), NOW)
    job = protocol.submit(store, [JobSpec(command="true", max_retries=max_retries)], NOW).items[0].job
    claimed = store.claims.claim("w1", NOW, POLICY)
    assert claimed is not None and claimed.id == job.id
    return job


def test_appends_build_the_stream_and_reads_slice_it(store):
    job = running_job(store)
    first = protocol.append_log(store, job.id, "w1", 1, 0, b"hello ", NOW)
    assert (first.attempt, first.size, first.accepted, first.dropped) == (1, 6, 6, 0)
    second = protocol.append_log(store, job.id, "w1", 1, 6, b"world\n", NOW)
    assert (second.size, second.accepted) == (12, 6)
    whole = store.logs.read_log(job.id, None, 0, 1 << 20)
    assert (whole.attempt, whole.start, whole.size, whole.data) == (1, 0, 12, b"hello world\n")
    part = store.logs.read_log(job.id, 1, 3, 5)
    assert (part.start, part.data) == (3, b"lo wo")
    assert store.logs.read_log(job.id, 1, 12, 100).data == b""
    assert store.logs.read_log(job.id, 1, 99, 100).start == 12
    assert store.logs.log_sizes(job.id) == {1: (12, 0)}


def test_a_retried_chunk_is_stored_once_and_an_overlap_only_adds_its_new_part(store):
    job = running_job(store)
    protocol.append_log(store, job.id, "w1", 1, 0, b"abcdef", NOW)
    retry = protocol.append_log(store, job.id, "w1", 1, 0, b"abcdef", NOW)
    assert (retry.size, retry.accepted) == (6, 0)
    overlap = protocol.append_log(store, job.id, "w1", 1, 4, b"efgh", NOW)
    assert (overlap.size, overlap.accepted) == (8, 2)
    assert store.logs.read_log(job.id, None, 0, 100).data == b"abcdefgh"


def test_a_chunk_past_the_end_is_refused(store):
    job = running_job(store)
    protocol.append_log(store, job.id, "w1", 1, 0, b"abc", NOW)
    with pytest.raises(errors.Conflict, match="send from 3"):
        protocol.append_log(store, job.id, "w1", 1, 10, b"xyz", NOW)
    assert store.logs.read_log(job.id, None, 0, 100).data == b"abc"


def test_a_stale_worker_or_attempt_writes_nothing(store):
    job = running_job(store)
    for worker_id, attempt in (("w2", 1), ("w1", 2)):
        with pytest.raises(errors.StaleAttempt):
            protocol.append_log(store, job.id, worker_id, attempt, 0, b"x", NOW)
    assert store.logs.log_sizes(job.id) == {}
    with pytest.raises(errors.NotFound):
        protocol.append_log(store, "j-missing", "w1", 1, 0, b"x", NOW)
    with pytest.raises(errors.NotFound):
        store.logs.read_log("j-missing", None, 0, 10)


def test_past_the_cap_the_oldest_bytes_go_and_reads_start_after_them(store):
    job = running_job(store)
    protocol.append_log(store, job.id, "w1", 1, 0, b"0123456789", NOW, cap=16)
    answer = protocol.append_log(store, job.id, "w1", 1, 10, b"abcdefghij", NOW, cap=16)
    assert (answer.size, answer.dropped, answer.trimmed) == (20, 4, 4)
    read = store.logs.read_log(job.id, None, 0, 100)
    assert (read.start, read.dropped, read.data) == (4, 4, b"456789abcdefghij")
    # a chunk larger than the cap keeps its own last bytes
    big = protocol.append_log(store, job.id, "w1", 1, 20, b"X" * 40 + b"tail", NOW, cap=16)
    assert (big.size, big.dropped) == (64, 48)
    assert store.logs.read_log(job.id, None, 50, 100).data == b"X" * 10 + b"tail"
    assert store.logs.read_log(job.id, None, 0, 100).data == b"X" * 12 + b"tail"


def test_each_attempt_has_its_own_log(store):
    job = running_job(store)
    protocol.append_log(store, job.id, "w1", 1, 0, b"first\n", NOW)
    assert protocol.fail(store, job.id, "w1", 1, NOW + 1, 1).status == Status.PENDING
    store.claims.claim("w1", NOW + 2, POLICY)
    protocol.append_log(store, job.id, "w1", 2, 0, b"second\n", NOW + 3)
    assert store.logs.read_log(job.id, None, 0, 100).data == b"second\n"
    assert store.logs.read_log(job.id, 1, 0, 100).data == b"first\n"
    assert store.logs.read_log(job.id, 7, 0, 100).data == b""
    assert store.logs.log_sizes(job.id) == {1: (6, 0), 2: (7, 0)}


def test_retention_purges_the_logs_of_jobs_that_ended_before_it(store):
    job = running_job(store)
    protocol.append_log(store, job.id, "w1", 1, 0, b"bye\n", NOW)
    protocol.complete(store, job.id, "w1", 1, NOW + 10)
    assert store.logs.purge_logs(NOW + 5) == 0
    assert store.logs.purge_logs(NOW + 11) == 1
    assert store.logs.log_sizes(job.id) == {}
    assert store.logs.read_log(job.id, None, 0, 100).data == b""
