"""The cluster's history in the store (``store.history``, migration 19) on SQLite and PostgreSQL:
one sample a minute whoever writes it (the first stays: replicas and a new leader do not write a
minute twice), a window read oldest first, the oldest removed in batches; and the samples loop's
pass over a real store (``core.history``: what a sample counts)."""

from __future__ import annotations

from corral.core import history
from corral.domain.history import ClusterSample, sample_slot
from corral.domain.resources import Resources
from tests.contract import protocol
from tests.helpers import NOW, POLICY, register, spec

MINUTE = sample_slot(NOW)


def test_a_minute_is_sampled_once_whoever_writes_it(store):
    first = ClusterSample(MINUTE, 3, 1, 8, 2)
    assert store.history.record_sample(first) is True
    assert store.history.record_sample(ClusterSample(MINUTE, 9, 9, 9, 9)) is False, "a replica's same minute"
    assert store.history.samples(MINUTE - 60, MINUTE + 60) == [first]


def test_a_window_is_read_oldest_first_and_bounded(store):
    for minute in (3, 1, 2, 0):
        store.history.record_sample(ClusterSample(MINUTE + 60 * minute, minute, 0, 4, minute))
    window = store.history.samples(MINUTE + 60, MINUTE + 120)
    assert [sample.at for sample in window] == [MINUTE + 60, MINUTE + 120]
    assert [sample.queued_jobs for sample in store.history.samples(MINUTE, MINUTE + 600)] == [0, 1, 2, 3]
    assert store.history.samples(MINUTE + 600, MINUTE + 900) == []


def test_the_oldest_samples_are_removed_in_batches(store):
    for minute in range(5):
        store.history.record_sample(ClusterSample(MINUTE + 60 * minute, 0, 0, 0, 0))
    cutoff = MINUTE + 60 * 3
    assert store.history.purge_samples(cutoff, 2) == 2
    assert store.history.purge_samples(cutoff, 2) == 1
    assert store.history.purge_samples(cutoff, 2) == 0
    assert [sample.at for sample in store.history.samples(0, MINUTE * 2)] == [cutoff, cutoff + 60]


def test_a_sample_counts_the_queue_and_the_gpus_held(store):
    register(store, "w1", gpus=4)
    register(store, "w2", gpus=2)
    protocol.submit(store, [spec(resources=Resources(gpus=3)), spec(resources=Resources(gpus=1))], NOW)
    protocol.submit(store, [spec(resources=Resources(gpus=8))], NOW)  # never fits: queued still
    store.claims.claim("w1", NOW + 1, POLICY)
    taken = history.sample(NOW + 75, store.jobs.count_jobs_by_status(), store.history.gpus_by_worker_status())
    assert taken.at == sample_slot(NOW + 75)
    assert (taken.queued_jobs, taken.gpus_total) == (2, 6)
    assert taken.gpus_allocated == 3, "the 3-GPU job claimed on w1; the 1-GPU one waits its turn"


def test_the_gpu_sums_match_the_workers_and_allocations_they_stand_for(store):
    """The store sums what the records would give: per worker status, its workers' GPUs and the
    GPU indices its holding jobs were given (a draining worker's counted under ``draining``)."""
    register(store, "w1", gpus=8)
    register(store, "w2", gpus=4)
    register(store, "w3", gpus=2)
    register(store, "cpu-only", gpus=0)
    gpus_asked = [3, 1, 2, 4, 1, 0, 2]
    protocol.submit(store, [spec(resources=Resources(gpus=gpus)) for gpus in gpus_asked], NOW)
    for worker_id in ("w1", "w2", "w3", "cpu-only", "w1"):
        store.claims.claim(worker_id, NOW + 1, POLICY)
    store.workers.drain_worker("w2")
    from_records: dict[str, list[int]] = {}
    workers = {worker.id: worker for worker in store.workers.workers()}
    for worker in workers.values():
        from_records.setdefault(str(worker.status), [0, 0])[0] += worker.resources.gpus
    for allocation in store.workers.allocations():
        from_records[str(workers[allocation.worker_id].status)][1] += len(allocation.gpu_indices)
    sums = store.history.gpus_by_worker_status()
    assert sums == {status: tuple(pair) for status, pair in from_records.items()}
    assert sums["draining"][0] == 4 and sums["active"][1] >= 4, "claims held GPUs on w1 and w3"
