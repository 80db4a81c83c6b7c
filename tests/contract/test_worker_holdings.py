"""What workers hold, as ``GET /workers`` (``list_workers``) and the cluster gauges of ``/metrics``
(``cluster_counts``) read it, summed by the store without a record per allocation: the same figures
as summing the ``Allocation`` records, on SQLite and PostgreSQL."""

from __future__ import annotations

from corral.domain.records import JobSpec
from corral.domain.resources import Resources
from corral.domain.status import Status
from tests.contract import protocol
from tests.helpers import NOW, POLICY, register, submit_one


def _cluster(store):
    """Three workers: w1 running two jobs and holding a reserved gang task, w2 running one job and
    holding the other reserved task, w3 draining and idle; jobs ended and pending beside them."""
    register(store, "w1", gpus=4, vram_mb=1000, memory_mb=8192, cpus=8)
    register(store, "w2", gpus=2, vram_mb=2000, memory_mb=4096, cpus=4)
    register(store, "w3", gpus=2, vram_mb=1000, cpus=4)
    store.workers.drain_worker("w3")
    small = submit_one(store, resources=Resources(gpus=1, vram_mb=500, memory_mb=1024, cpus=2))
    large = submit_one(store, resources=Resources(gpus=1, vram_mb=900, memory_mb=2048, cpus=1))
    ended = submit_one(store, resources=Resources(cpus=1))
    assert [job.id for job in store.claims.claim_many("w1", NOW, POLICY, 3)] == [small.id, large.id, ended.id]
    protocol.complete(store, ended.id, "w1", 1, NOW + 1)
    (on_w2,) = store.claims.claim_many("w2", NOW, POLICY, 1, None) or [None]
    assert on_w2 is None, "nothing pending fits w2 yet"
    other = submit_one(store, resources=Resources(gpus=1, vram_mb=1500, memory_mb=512, cpus=1))
    assert [job.id for job in store.claims.claim_many("w2", NOW + 2, POLICY, 1)] == [other.id]
    gang = protocol.submit(
        store, [JobSpec(command="train", gang_size=2, resources=Resources(gpus=1))], NOW + 3
    )
    gang_id, tasks = gang.items[0].gang_id, [task.id for task in gang.items[0].tasks]
    placements = [(tasks[0], "w1", (2,)), (tasks[1], "w2", (1,))]
    assert protocol.reserve_gang(store, gang_id, placements, NOW + 3) is not None
    submit_one(store, resources=Resources(gpus=8))  # pending: holds nothing
    return small, large, other, tasks


def test_list_workers_sums_what_each_worker_holds(store):
    small, large, other, tasks = _cluster(store)
    views = {view.worker.id: view for view in store.workers.list_workers()}
    assert list(views) == ["w1", "w2", "w3"], "in registration order"
    assert views["w1"].running == tuple(sorted([small.id, large.id, tasks[0]]))
    assert views["w1"].used.gpus == 3 and views["w1"].used.vram_mb == 900, "VRAM per GPU: the largest"
    assert views["w2"].running == tuple(sorted([other.id, tasks[1]]))
    assert views["w3"].used == Resources() and views["w3"].running == ()
    # the same figures as the allocation records give
    by_worker: dict[str, list] = {}
    for allocation in store.workers.allocations():
        by_worker.setdefault(allocation.worker_id, []).append(allocation)
    for worker_id, view in views.items():
        held = by_worker.get(worker_id, [])
        used = Resources()
        for allocation in held:
            used = used + allocation.resources
        assert (view.used, view.running) == (used, tuple(allocation.job_id for allocation in held))
        single = store.workers.get_worker(worker_id)
        assert (single.worker, single.used, sorted(single.running)) == (
            view.worker,
            view.used,
            list(view.running),
        )


def test_cluster_counts_count_workers_and_the_gpus_held_on_active_ones(store):
    _, _, _, tasks = _cluster(store)
    counts = store.jobs.cluster_counts()
    assert counts.workers_by_status == {"active": 2, "draining": 1}
    assert counts.active_gpus == 6
    assert counts.held_gpus_by_status == {Status.RUNNING: 3, Status.RESERVED: 2}
    assert store.jobs.get_job(tasks[0]).status == Status.RESERVED
