"""Pool modes (issue 9 item 6): how the planner orders a pool's waiting jobs. A ``fair_share`` pool
serves the user holding the fewest of its GPUs first; a ``fifo`` pool serves by submission."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from corral.core.preemption import PlanInputs, Preemptor, plan
from corral.domain.records import Job, JobSpec
from corral.domain.resources import Resources
from corral.domain.status import Status
from corral.testing.factories import gpu_worker

NOW = 10_000.0


@dataclass(frozen=True)
class Pool:
    mode: str
    kind: str = "batch"
    guarantee: Resources = field(default_factory=Resources)


def job(job_id: str, user: str, cls: int, submitted: float, **fields: object) -> Job:
    spec = JobSpec(command="true", resources=Resources(gpus=1), preemption_class=cls, pool="lab", user=user)
    fields.setdefault("status", Status.PENDING)
    return Job(id=job_id, spec=spec, submitted_at=submitted, **fields)  # type: ignore[arg-type]


def running(job_id: str, user: str, cls: int, gpu: int, started_at: float) -> Job:
    return job(
        job_id,
        user,
        cls,
        0.0,
        status=Status.RUNNING,
        worker_id="w1",
        gpu_indices=(gpu,),
        started_at=started_at,
    )


@pytest.mark.parametrize(("mode", "first"), [("fair_share", "j-bob"), ("fifo", "j-alice")])
def test_the_one_gpu_a_preemption_frees_goes_to_the_modes_first_job(mode: str, first: str) -> None:
    worker = gpu_worker(gpus=3, worker_id="w1")
    # alice already holds two of the pool's GPUs, bob none; alice's waiting job is older
    holding = (
        running("j-alice-1", "alice", 5, 0, started_at=1.0),
        running("j-alice-2", "alice", 5, 1, started_at=1.0),
        running("j-low", "carol", 1, 2, started_at=NOW - 60),
    )
    waiting = (job("j-alice", "alice", 5, NOW - 50), job("j-bob", "bob", 5, NOW - 10))
    planned = plan(
        PlanInputs(
            now=NOW,
            workers=(worker,),
            holding=holding,
            preemptors=tuple(Preemptor(pending.id, (pending,)) for pending in waiting),
            pools={"lab": Pool(mode)},
        )
    )
    assert [found.preemptor for found in planned.preemptions] == [first]
    assert planned.preemptions[0].victims[0].key == "j-low"
