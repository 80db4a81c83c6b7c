"""The engine's planner shortcut (``corral.sim.shortcuts``) changes no decision.

``Engine(verify_shortcuts=True)`` runs the planner even where the shortcut skips it and fails on
any difference in what the engine applies; these workloads make both branches happen: classes
that preempt by priority, pools below their guarantee that reclaim, gangs, and long stretches
where nothing may be taken.
"""

from __future__ import annotations

import random

import pytest

from corral.domain.pools import PoolSettings
from corral.domain.resources import Resources
from corral.sim import engine, shortcuts
from corral.sim.policy import CORRAL
from corral.sim.readers import uniform_cluster
from corral.sim.workload import Scenario, SimSettings, Workload, WorkloadJob

POOLS = {
    "light": PoolSettings(guarantee=Resources(gpus=8)),
    "heavy": PoolSettings(guarantee=Resources(gpus=4)),
    "other": PoolSettings(),
}


def mixed(seed: int, jobs: int = 160, classes: tuple[int, ...] = (2, 5, 8)) -> Scenario:
    """A loaded little cluster: singles and gangs, several classes, pools with guarantees."""
    generator = random.Random(seed)
    workload = []
    for index in range(jobs):
        gang = generator.random() < 0.1
        workload.append(
            WorkloadJob(
                f"j{index:04d}",
                submit_time=round(index * generator.uniform(0.5, 4.0), 1),
                duration=generator.choice((20.0, 60.0, 300.0)),
                gpus=2 if gang else generator.choice((1, 2, 4)),
                gang_size=generator.choice((2, 3)) if gang else 1,
                pool=generator.choice(("light", "heavy", "heavy", "other")),
                preemption_class=generator.choice(classes),
                checkpoint=generator.choice(("none", "auto")),
                checkpoint_every_s=generator.choice((None, 30.0)),
            )
        )
    settings = SimSettings(heartbeat_s=5.0, checkpoint_save_s=10.0, stop_s=1.0)
    return Scenario(Workload(tuple(workload)), uniform_cluster(4, 4), POOLS, settings)


@pytest.mark.parametrize(("seed", "classes"), [(1, (2, 5, 8)), (2, (5,)), (3, (3, 5))])
def test_the_shortcut_skips_the_planner_only_where_it_decides_nothing(
    seed: int, classes: tuple[int, ...]
) -> None:
    run = engine.Engine(mixed(seed, classes=classes), CORRAL, verify_shortcuts=True)
    record = run.run()
    assert record.plans_skipped > 0, "the shortcut was taken"
    assert record.cycles > record.plans_skipped, "and the planner ran too"
    assert record.preemptions, "the planner did preempt"


def test_the_verification_catches_a_shortcut_that_would_change_a_decision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shortcuts, "planner_may_preempt", lambda snapshot: False)
    with pytest.raises(AssertionError, match="planner shortcut"):
        engine.Engine(mixed(1), CORRAL, verify_shortcuts=True).run()


def test_runs_with_and_without_the_verification_decide_the_same() -> None:
    plain = engine.run(mixed(4), CORRAL, record_decisions=True)
    checked = engine.Engine(mixed(4), CORRAL, record_decisions=True, verify_shortcuts=True).run()
    assert plain.decisions == checked.decisions
