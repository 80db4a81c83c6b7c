"""The admission cycle counts the tasks a gang's search would place (``_Cluster.count``) instead of
placing and giving them back; the count must be what the search places, on every kind of worker
(held for the head of the queue or not, short of one resource, overcommitted, ineligible)."""

from __future__ import annotations

import random

import pytest

from corral.core import admission
from corral.core.placement import Capacity
from corral.domain.records import Worker
from corral.domain.resources import Resources


def _worker(index: int, gpus: int) -> Worker:
    return Worker(f"w{index:03d}", "", Resources(gpus, 80_000, 512_000, 64), None, {}, "active", 0.0, None)


def _cluster(generator: random.Random) -> admission._Cluster:
    slots = []
    for order in range(generator.randint(1, 24)):
        worker = _worker(order, generator.choice((4, 8)))
        empty = worker.resources
        free = Resources(
            generator.randint(-2, empty.gpus),
            empty.vram_mb,
            generator.randint(-1000, empty.memory_mb),
            generator.randint(-4, empty.cpus),
        )
        indices = tuple(range(max(0, free.gpus)))
        slots.append(admission._Slot(order, worker, Capacity(free, indices), empty, []))
    cluster = admission._Cluster(slots)
    for slot in generator.sample(slots, generator.randint(0, len(slots))):
        cluster.hold(slot, Resources(generator.randint(0, 8), 0, generator.randint(0, 100_000), 8))
    return cluster


def _searched(
    cluster: admission._Cluster, request: Resources, eligible: list[bool] | None, backfill: bool
) -> int:
    """Tasks the search places when asked for more than can ever fit (then given back)."""
    _, room = cluster.attempt(request, 10_000, eligible, backfill)
    return room.tasks


@pytest.mark.parametrize("seed", range(60))
def test_the_count_is_what_the_search_places(seed: int) -> None:
    generator = random.Random(seed)
    cluster = _cluster(generator)
    for _ in range(6):
        request = Resources(
            generator.choice((0, 1, 2, 4, 8)),
            0,
            generator.choice((0, 0, 16_000, 200_000)),
            generator.choice((0, 4, 16)),
        )
        if not admission._countable(request):
            continue
        eligible = None if generator.random() < 0.5 else [generator.random() < 0.7 for _ in cluster.slots]
        backfill = generator.random() < 0.5
        counted = cluster.count(request, eligible, backfill, 10_000)
        cluster.room_bound = lambda request, backfill: None  # type: ignore[method-assign]  # search always
        assert counted == _searched(cluster, request, eligible, backfill)
        assert min(3, cluster.count(request, eligible, backfill, 3)) == min(3, counted), "it stops at enough"
        size = generator.randint(1, 12)
        assert cluster.fits(request, size, eligible, backfill) == (counted >= size)
        del cluster.room_bound
