"""The victim-cap fallback (``Search.fewest_victims``) decides as its plain statement does: unit by
unit, over every eligible worker's largest units, the one that adds the most tasks (lowest class
first, then the comparator), counted by ``Room.tasks_with`` over the whole set each time. The
search weighs each unit by what it adds on its own workers and reads the offers a class at a time
(a 2,000-worker cycle offers thousands of units: the plain statement took 40 s there,
``bench/admission.py``); these tests hold it to the plain statement's answers."""

from __future__ import annotations

import random

import pytest
from hypothesis import event, given

from corral.core.preemption import PreemptionSettings, Preemptor
from corral.core.preemption.rules import victim_key
from corral.core.preemption.search import Search
from corral.core.preemption.units import Unit
from corral.domain.records import Job
from corral.testing.factories import gpu_worker
from tests.helpers import examples
from tests.unit.test_preemption import NOW, Case, cases, gang_tasks, planned, running, single, waiting


def plain_fewest_victims(search, preemptor, room, shape, trigger) -> list[Unit] | None:  # type: ignore[no-untyped-def]
    """The fallback as its docstring states it, nothing kept between the steps."""
    first = preemptor.first
    request, size = first.spec.resources, len(preemptor.tasks)
    most = search.settings.max_victims
    workers = set(room)
    offered: list[Unit] = []
    for worker_id in sorted(shape.eligible):
        if worker_id in search.units.backoff:
            continue
        units = sorted(
            search.candidates(worker_id, first, trigger),
            key=lambda unit: (-unit.frees[worker_id][0].gpus, victim_key(unit)),
        )
        offered.extend(unit for unit in units[:most] if all(unit is not other for other in offered))
    chosen: list[Unit] = []
    have = search.room.tasks_with(chosen, workers, request, shape.eligible)
    while len(chosen) < most:
        best = None
        for unit in offered:
            if any(unit is other for other in chosen):
                continue
            tasks = search.room.tasks_with([*chosen, unit], workers, request, shape.eligible)
            if tasks <= have:
                continue
            rank = (unit.preemption_class, have - tasks, victim_key(unit))
            if best is None or rank < best[0]:
                best = (rank, unit, tasks)
        if best is None:
            return None
        chosen.append(best[1])
        have = best[2]
        if have >= size:
            return chosen
    return None


@examples(100)
@given(cases())
@pytest.mark.parametrize("max_victims", [1, 2, 3])
def test_the_fallback_chooses_as_its_plain_statement(max_victims: int, case: Case) -> None:
    settings = PreemptionSettings(max_victims=max_victims)
    arguments = (case.workers, case.holding, case.preemptors, settings, case.pools)
    fast = planned(*arguments)
    called: list[bool] = []

    def counted(*given_arguments):  # type: ignore[no-untyped-def]
        found = plain_fewest_victims(*given_arguments)
        called.append(found is not None)
        return found

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Search, "fewest_victims", counted)
        plain = planned(*arguments)
    event(f"fallback asked: {bool(called)}, found a set: {any(called)}")
    assert fast == plain


def busy_cluster(seed: int, workers: int = 80) -> tuple[list, list, list]:  # type: ignore[type-arg]
    """Every GPU of ``workers`` 8-GPU workers busy with single jobs of 1, 2 or 4 GPUs of classes
    0-9, a few running gangs; higher-class single jobs and gangs of 2-8 tasks waiting (the shape of
    ``bench/admission.py``'s preemption case, small)."""
    rng = random.Random(seed)
    hosts = [gpu_worker(gpus=8, worker_id=f"w{index:03d}") for index in range(workers)]
    holding: list[Job] = []
    index = 0
    while index < len(hosts):
        if index + 1 < len(hosts) and rng.random() < 0.05:
            holding.extend(gang_tasks(f"g-run-{index}", 2, 8, rng.randint(0, 9), hosts[index : index + 2]))
            index += 2
            continue
        free = list(range(8))
        while free:
            gpus = min(rng.choice([1, 2, 4]), len(free))
            taken, free = free[:gpus], free[gpus:]
            holding.append(
                running(hosts[index], taken, cls=rng.randint(0, 9), started=NOW - rng.uniform(60, 7200))
            )
        index += 1
    preemptors = [
        single(waiting(rng.choice([1, 2, 4, 8]), rng.randint(6, 10), job_id=f"j-want-{number:03d}"))
        for number in range(workers // 4)
    ]
    for number in range(workers // 10):
        size, gpus, cls = rng.randint(2, 8), rng.choice([1, 2, 4, 8]), rng.randint(6, 10)
        gang_id = f"g-want-{number:03d}"
        preemptors.append(Preemptor(gang_id, gang_tasks(gang_id, size, gpus, cls)))
    return hosts, holding, preemptors


@pytest.mark.parametrize("seed", range(4))
def test_the_fallback_chooses_as_its_plain_statement_on_a_busy_cluster(seed: int) -> None:
    hosts, holding, preemptors = busy_cluster(seed)
    fast = planned(hosts, holding, preemptors)
    found: list[bool] = []

    def counted(*given_arguments):  # type: ignore[no-untyped-def]
        chosen = plain_fewest_victims(*given_arguments)
        found.append(chosen is not None)
        return chosen

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Search, "fewest_victims", counted)
        plain = planned(hosts, holding, preemptors)
    assert any(found), "the fallback found a set in this cycle"
    assert fast == plain
