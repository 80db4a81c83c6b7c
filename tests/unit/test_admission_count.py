"""The admission cycle counts the tasks a gang's search would place (``_Cluster.count``) instead of
placing and giving them back; the count must be what the search places, on every kind of worker
(held for the head of the queue or not, short of one resource, overcommitted, ineligible)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from corral.core import admission
from corral.core.placement import Capacity
from corral.domain.records import Worker
from corral.domain.resources import Resources
from tests.helpers import Drawn, examples, missing_shapes, shapes_drawn


def _worker(index: int, gpus: int) -> Worker:
    return Worker(f"w{index:03d}", "", Resources(gpus, 80_000, 512_000, 64), None, {}, "active", 0.0, None)


def _cluster(generator: Drawn) -> admission._Cluster:
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


@st.composite
def asks(draw: st.DrawFn) -> tuple[admission._Cluster, list[Ask]]:
    """A cluster of 1-24 workers (some short of a resource or overcommitted, some held for the
    head of the queue) and six asks: a request (GPUs, memory, CPUs), eligible workers (all, or
    most), backfill or not, a gang size."""
    generator = Drawn(draw)
    cluster = _cluster(generator)
    found = []
    for _ in range(6):
        request = Resources(
            generator.choice((0, 1, 2, 4, 8)),
            0,
            generator.choice((0, 0, 16_000, 200_000)),
            generator.choice((0, 4, 16)),
        )
        eligible = None if generator.random() < 0.5 else [generator.random() < 0.7 for _ in cluster.slots]
        found.append(Ask(request, eligible, generator.random() < 0.5, generator.randint(1, 12)))
    return cluster, found


@dataclass(frozen=True)
class Ask:
    request: Resources
    eligible: list[bool] | None
    backfill: bool
    size: int


def shapes_of_asks(case: tuple[admission._Cluster, list[Ask]]) -> list[str]:
    cluster, found = case
    shapes = []
    if any(slot.gpus < 0 or slot.cpus < 0 or slot.memory < 0 for slot in cluster.slots):
        shapes.append("an overcommitted worker")
    if cluster.held_slots:
        shapes.append("a worker held for the head of the queue")
    if len(cluster.slots) >= 8:
        shapes.append("eight workers or more")
    countable = [ask for ask in found if admission._countable(ask.request)]
    if countable:
        shapes.append("a countable request")
    if any(ask.eligible is not None for ask in countable):
        shapes.append("some workers ineligible")
    if any(ask.backfill for ask in countable):
        shapes.append("backfill")
    counts = [cluster.count(ask.request, ask.eligible, ask.backfill, 10_000) for ask in countable]
    if any(count == 0 for count in counts):
        shapes.append("no room")
    if any(count >= 2 for count in counts):
        shapes.append("room for several tasks")
    if any(ask.size > count for ask, count in zip(countable, counts, strict=True)):
        shapes.append("a gang that does not fit")
    if any(ask.size <= count for ask, count in zip(countable, counts, strict=True)):
        shapes.append("a gang that fits")
    return shapes


def test_the_clusters_and_asks_have_every_shape_the_property_claims() -> None:
    claimed = [
        "an overcommitted worker",
        "a worker held for the head of the queue",
        "eight workers or more",
        "a countable request",
        "some workers ineligible",
        "backfill",
        "no room",
        "room for several tasks",
        "a gang that does not fit",
        "a gang that fits",
    ]
    seen = shapes_drawn(asks(), shapes_of_asks, 30)
    assert not missing_shapes(seen, claimed), (missing_shapes(seen, claimed), seen)


@examples(30)
@given(asks())
def test_the_count_is_what_the_search_places(case: tuple[admission._Cluster, list[Ask]]) -> None:
    cluster, found = case
    for ask in found:
        request, eligible, backfill = ask.request, ask.eligible, ask.backfill
        if not admission._countable(request):
            continue
        counted = cluster.count(request, eligible, backfill, 10_000)
        cluster.room_bound = lambda request, backfill: None  # type: ignore[method-assign]  # search always
        assert counted == _searched(cluster, request, eligible, backfill)
        assert min(3, cluster.count(request, eligible, backfill, 3)) == min(3, counted), "it stops at enough"
        assert cluster.fits(request, ask.size, eligible, backfill) == (counted >= ask.size)
        del cluster.room_bound
