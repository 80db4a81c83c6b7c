"""Reservations (backfill as Slurm does it): when each waiting gang or job could start, and the room
kept for it until then.

Each usable worker has a timeline (``WorkerLine``): its free capacity now, the room its allocations
give back when they reach their deadlines (an allocation without a deadline never gives its room
back here), and the reservations already booked on it. ``book`` finds the earliest time at which a
gang's ``size`` tasks (a single job: one) fit together on the workers for the whole of their own
walltime (forever when they declare none), and books that room. A gang or job whose room depends
on work without a deadline finds no time: it gets no reservation and no estimated start.

A reservation is stored as ``Hold`` rows: per worker, its start (``expected_at``) and the room it
takes there when it starts. A claim sets that room aside from the worker's free capacity now
(``placement.without_holds``) unless the work it starts ends before the reservation starts
(``placement.holds_in_way``); room the reservations do not take is free for any work. The whole
room is held, not only the part free now: room that comes back before the start (a job ending
early, between two cycles) is then kept for the reservation too, not taken by the next claim.

Pure: values in, values out, no clock.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush

from corral.domain.resources import Resources

__all__ = ["Ask", "Booking", "Planned", "Timelines", "WorkerLine", "book"]

#: (GPUs, CPUs, memory MB): the quantities a timeline counts
Need = tuple[int, int, int]

#: above any room: ``(at, _TOP)`` sorts after every step at ``at``
_TOP = (1 << 62, 1 << 62, 1 << 62)

#: candidate start times tried past the first estimate before a gang is given up on
MAX_TRIES = 32


@dataclass(frozen=True, slots=True)
class Booking:
    """Room kept on a worker for ``key`` (a gang or job id) from ``start`` to ``end`` (None: its
    work declares no walltime, so the room is kept for good once it starts)."""

    key: str
    start: float
    end: float | None
    need: Need


@dataclass(slots=True)
class WorkerLine:
    """One worker's timeline. ``releases``: (deadline, room, job id) of the allocations with a
    deadline, soonest first; the room of those without one never comes back. A caller that changes
    ``free`` or ``releases`` calls ``changed``."""

    worker_id: str
    order: int
    empty: Need
    free: Need
    releases: list[tuple[float, Need, str]]
    bookings: list[Booking] = field(default_factory=list)
    #: (time, free room from then on counting the releases alone), soonest first; built on use
    _steps: list[tuple[float, Need]] | None = None
    #: the times room may come back (``times``), for the ``now`` they were listed at
    _times: tuple[float, list[float]] | None = None

    def changed(self) -> None:
        self._steps = None
        self._times = None

    def add(self, booking: Booking) -> None:
        self.bookings.append(booking)
        self._times = None

    def steps(self) -> list[tuple[float, Need]]:
        steps = self._steps
        if steps is None:
            gpus, cpus, memory = self.free
            steps = [(float("-inf"), (min(gpus, self.empty[0]), cpus, memory))]
            for end, room, _ in self.releases:
                gpus, cpus, memory = gpus + room[0], cpus + room[1], memory + room[2]
                entry = (min(gpus, self.empty[0]), cpus, memory)
                if steps[-1][0] == end:
                    steps[-1] = (end, entry)
                else:
                    steps.append((end, entry))
            self._steps = steps
        return steps

    def free_at(self, at: float) -> Need:
        """Free room at ``at``: now's, plus what has been given back by then, minus what the
        bookings active then keep."""
        steps = self.steps()
        gpus, cpus, memory = steps[bisect_right(steps, (at, _TOP)) - 1][1]
        for booking in self.bookings:
            if booking.start <= at and (booking.end is None or at < booking.end):
                need = booking.need
                gpus, cpus, memory = gpus - need[0], cpus - need[1], memory - need[2]
        return gpus, cpus, memory

    def fits(self, need: Need, start: float, end: float | None) -> bool:
        """Whether ``need`` fits from ``start`` to ``end`` (None: for good): the room only shrinks
        when a booking starts, so it is checked at ``start`` and at every booking start inside."""
        if not _covers(self.free_at(start), need):
            return False
        return all(
            _covers(self.free_at(booking.start), need)
            for booking in self.bookings
            if start < booking.start and (end is None or booking.start < end)
        )

    def times(self, now: float) -> list[float]:
        """The times room may come back: now, the deadlines, the bookings' ends."""
        found = {now}
        found.update(at for at, _ in self.steps() if at > now)
        found.update(
            booking.end for booking in self.bookings if booking.end is not None and booking.end > now
        )
        return sorted(found)

    def earliest(self, need: Need, duration: float | None, now: float) -> float | None:
        """The earliest time ``need`` fits for ``duration`` (None: for good); None when never."""
        if need[0] > self.empty[0] or need[1] > self.empty[1] or need[2] > self.empty[2]:
            return None
        if not self.bookings:  # the room only grows: the first time it covers ``need``
            for at, room in self.steps():
                if room[0] >= need[0] and room[1] >= need[1] and room[2] >= need[2]:
                    return now if at < now else at
            return None
        for at in self.times(now):
            if self.fits(need, at, None if duration is None else at + duration):
                return at
        return None

    def count(self, request: Need, at: float, duration: float | None, most: int) -> int:
        """How many tasks of ``request`` fit together from ``at`` for ``duration``, at most ``most``."""
        found = 0
        end = None if duration is None else at + duration
        while found < most and self.fits(_times(request, found + 1), at, end):
            found += 1
        return found

    def ending_by(self, at: float) -> list[str]:
        """The jobs whose deadlines give back room by ``at``."""
        return [job_id for end, _, job_id in self.releases if end <= at]


@dataclass(frozen=True, slots=True)
class Ask:
    """A gang (``size`` tasks of ``request``) or a single job (size 1) that cannot start now.
    ``eligible``: per worker order, whether the worker matches its constraints (None: all do)."""

    key: str
    request: Resources
    size: int
    walltime_s: float | None
    eligible: Sequence[bool] | None = None


@dataclass(frozen=True, slots=True)
class Planned:
    """Where and when an ask starts: (worker order, tasks) in worker order, and the start."""

    key: str
    start: float
    tasks: tuple[tuple[int, int], ...]


Offer = tuple[float, int, int, int, int, int]


class Timelines:
    """Every usable worker's timeline (``lines[i].order == i``), booked ask after ask. Each ask
    reads every worker's first offer; a worker without a booking offers the same for the same
    request until its room changes, so those offers are kept per request and constraints and
    only the workers changed since (``changed``, a booking) are read again: a cycle books up to
    ``CORRAL_BACKFILL_DEPTH`` asks over thousands of workers."""

    def __init__(self, lines: Sequence[WorkerLine]) -> None:
        self.lines = lines
        self._touched: list[int] = []  # worker orders in the order they changed
        self._booked: set[int] = set()
        # Keyed by the constraints' identity; each entry keeps its ``eligible`` alive, so an id is
        # never reused by another list while its offers are kept.
        self._kept: dict[tuple[Need, int], tuple[list[Offer], int, Sequence[bool] | None]] = {}

    def changed(self, order: int) -> None:
        """The worker's free room or releases changed (a placement now)."""
        self.lines[order].changed()
        self._touched.append(order)

    def _firsts(
        self, request: Need, eligible: Sequence[bool] | None, duration: float | None, now: float
    ) -> list[Offer]:
        """Every eligible worker's offer for one task (see ``book``)."""
        key = (request, id(eligible))
        kept = self._kept.get(key)
        if kept is None:
            orders: Iterable[int] = range(len(self.lines))
            base: list[Offer] = []
        else:
            touched = set(self._touched[kept[1] :])
            base = [offer for offer in kept[0] if offer[4] not in touched] if touched else list(kept[0])
            orders = sorted(touched)
        for order in orders:
            if order in self._booked or (eligible is not None and not eligible[order]):
                continue
            offer = _first_offer(self.lines[order], request, now)
            if offer is not None:
                base.append(offer)
        self._kept[key] = (base, len(self._touched), eligible)
        offers = list(base)
        for order in sorted(self._booked):
            if eligible is None or eligible[order]:
                offer = _offer(self.lines[order], request, 1, duration, now)
                if offer is not None:
                    offers.append(offer)
        return offers

    def book(self, ask: Ask, now: float) -> Planned | None:
        """Plan ``ask`` at its earliest start and book its room there; None when it has no known
        start (its room depends on work without a deadline, or it never fits).

        Each worker offers its k-th task at the earliest time k tasks fit together
        (``WorkerLine.earliest``); the ``size`` soonest offers (then the best fit on the idle
        worker, then worker order) bound the start from below. The start is the first candidate
        time from there at which the workers hold every task together for the ask's walltime."""
        request = _need(ask.request)
        duration = ask.walltime_s
        lines = self.lines
        offers = self._firsts(request, ask.eligible, duration, now)
        heapify(offers)
        counts: dict[int, int] = {}
        start = now
        for _ in range(ask.size):
            if not offers:
                return None
            at, *_, order, count = heappop(offers)
            counts[order] = count
            start = max(start, at)
            if request != (0, 0, 0):
                offer = _offer(lines[order], request, count + 1, duration, now)
                if offer is not None:
                    heappush(offers, offer)
        end = None if duration is None else start + duration
        if not all(lines[order].fits(_times(request, count), start, end) for order, count in counts.items()):
            eligible = ask.eligible
            candidates = [line for line in lines if eligible is None or eligible[line.order]]
            found = _search(candidates, request, ask.size, duration, start, now)
            if found is None:
                return None
            start, counts = found
        planned = Planned(ask.key, start, tuple(sorted(counts.items())))
        end = None if duration is None else start + duration
        for order, count in planned.tasks:
            self.add(order, Booking(ask.key, start, end, _times(request, count)))
        return planned

    def add(self, order: int, booking: Booking) -> None:
        """Book ``booking`` on the worker of ``order``."""
        self.lines[order].add(booking)
        self._booked.add(order)
        self._touched.append(order)


def book(lines: Sequence[WorkerLine], ask: Ask, now: float) -> Planned | None:
    """``Timelines.book`` once, over ``lines`` (``lines[i].order == i``)."""
    return Timelines(lines).book(ask, now)


def _first_offer(line: WorkerLine, request: Need, now: float) -> Offer | None:
    """``_offer`` for one task on a line without a booking (its room only grows), inlined."""
    gpus, cpus, memory = request
    empty = line.empty
    if gpus > empty[0] or cpus > empty[1] or memory > empty[2]:
        return None
    for at, room in line.steps():
        if room[0] >= gpus and room[1] >= cpus and room[2] >= memory:
            return (
                now if at < now else at,
                empty[0] - gpus,
                empty[1] - cpus,
                empty[2] - memory,
                line.order,
                1,
            )
    return None


def _search(
    lines: Sequence[WorkerLine], request: Need, size: int, duration: float | None, after: float, now: float
) -> tuple[float, dict[int, int]] | None:
    """The first candidate time from ``after`` at which ``size`` tasks fit together (bookings
    can make a worker's room shrink again later: the offers' bound is not always a start)."""
    times = sorted({at for line in lines for at in line.times(now) if at >= after} | {after})
    for at in times[:MAX_TRIES]:
        counts: dict[int, int] = {}
        total = 0
        for line in lines:
            found = line.count(request, at, duration, size - total)
            if found:
                counts[line.order] = found
                total += found
                if total >= size:
                    return at, counts
    return None


def _offer(line: WorkerLine, request: Need, count: int, duration: float | None, now: float) -> Offer | None:
    at = line.earliest(_times(request, count), duration, now)
    if at is None:
        return None
    need = _times(request, count)
    empty = line.empty
    return (at, empty[0] - need[0], empty[1] - need[1], empty[2] - need[2], line.order, count)


def _covers(have: Need, need: Need) -> bool:
    return have[0] >= need[0] and have[1] >= need[1] and have[2] >= need[2]


def _need(resources: Resources) -> Need:
    return resources.gpus, resources.cpus, resources.memory_mb


def _times(request: Need, count: int) -> Need:
    return request[0] * count, request[1] * count, request[2] * count
