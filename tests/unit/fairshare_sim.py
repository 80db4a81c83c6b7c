"""A small cluster for fair-share planner tests: jobs, pools, starvation timers; one ``cycle()`` is
what the admission loop does with fair share (shares and timers from the jobs, the planner, its
decisions applied: victims re-queued, preemptors and work that fits started), and time moves on
past the per-worker backoff."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from corral.core import fairshare
from corral.core.preemption import PlanInputs, PreemptionPlan, PreemptionSettings, Preemptor, plan
from corral.domain.pools import Pool, PoolUsage, StarvationState
from corral.domain.records import Job, JobSpec, Worker
from corral.domain.resources import Resources
from corral.domain.status import Status
from corral.testing.factories import gpu_worker

NOW = 10_000.0
HELD = (Status.RUNNING, Status.RESERVED, Status.PREEMPTING)


def job(
    job_id: str,
    pool: str,
    gpus: int = 1,
    cls: int = 5,
    worker: Worker | None = None,
    indices: Iterable[int] = (),
    started: float | None = None,
    cpus: int = 0,
    **fields: Any,
) -> Job:
    """A running job when ``worker`` is given, else a pending one."""
    spec = JobSpec(
        command="true",
        resources=Resources(gpus=gpus, cpus=cpus),
        preemption_class=cls,
        pool=pool,
        **fields,
    )
    if worker is None:
        return Job(id=job_id, spec=spec, status=Status.PENDING, submitted_at=NOW - 50)
    return Job(
        id=job_id,
        spec=spec,
        status=Status.RUNNING,
        submitted_at=0.0,
        worker_id=worker.id,
        gpu_indices=tuple(indices),
        started_at=NOW - 1000 if started is None else started,
        attempts=1,
    )


def fill(
    worker: Worker,
    pool: str,
    sizes: Iterable[int],
    prefix: str,
    start: float = NOW - 1000,
    first: int = 0,
    **fields: Any,
) -> list[Job]:
    """Jobs of ``sizes`` GPUs side by side on ``worker`` from GPU 0, named ``prefix`` + a number
    from ``first``, each started 10 s after the last."""
    jobs, index = [], 0
    for number, gpus in enumerate(sizes, start=first):
        at = start + 10 * (number - first)
        jobs.append(
            job(
                f"{prefix}{number}",
                pool,
                gpus,
                worker=worker,
                indices=range(index, index + gpus),
                started=at,
                **fields,
            )
        )
        index += gpus
    return jobs


def own_usage(jobs: Iterable[Job]) -> dict[str, PoolUsage]:
    usage: dict[str, PoolUsage] = {}
    for one in jobs:
        if one.status in HELD:
            add = PoolUsage(held=one.spec.resources, jobs=1)
        else:
            add = PoolUsage(demand=one.spec.resources, jobs=1)
        usage[one.spec.pool] = usage.get(one.spec.pool, PoolUsage()) + add
    return usage


def total_of(workers: Iterable[Worker]) -> Resources:
    total = Resources()
    for worker in workers:
        total = total + worker.resources
    return total


@dataclass
class Cycle:
    """One cycle: the fair-share state the planner saw, its plan, the jobs before and after."""

    fair: fairshare.FairShareState
    plan: PreemptionPlan
    before: dict[str, Job]
    after: dict[str, Job]
    now: float

    def fair_share_victims(self) -> list[tuple[str, str, str]]:
        """(victim job id, victim pool, preemptor pool) of every fair-share victim."""
        return [
            (job_id, self.before[job_id].spec.pool, self.before[preemption.job_ids[0]].spec.pool)
            for preemption in self.plan.preemptions
            for victim in preemption.victims
            if victim.reason == "fair_share"
            for job_id in victim.job_ids
        ]


@dataclass
class Cluster:
    workers: list[Worker]
    pools: dict[str, Pool]
    jobs: dict[str, Job]
    starvation: dict[str, StarvationState] = field(default_factory=dict)
    now: float = NOW
    settings: PreemptionSettings = field(default_factory=PreemptionSettings)
    last_preemptive: dict[str, float] = field(default_factory=dict)
    #: cycles a victim takes to stop (0: it has left by the next cycle); meanwhile it is
    #: ``preempting`` (its pool still counts it) and its preemptor ``reserved`` on its room
    stop_cycles: int = 0
    #: victim id -> when it has left; preemptor id -> the victims it waits for
    leaving: dict[str, float] = field(default_factory=dict)
    waiting_for: dict[str, set[str]] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        workers: Iterable[Worker],
        pools: Mapping[str, Pool],
        jobs: Iterable[Job],
        starvation: Mapping[str, StarvationState] | None = None,
        **fields: Any,
    ) -> Cluster:
        return cls(
            list(workers), dict(pools), {one.id: one for one in jobs}, dict(starvation or {}), **fields
        )

    @property
    def total(self) -> Resources:
        return total_of(self.workers)

    def fair_state(self, starvation: Mapping[str, StarvationState] | None = None) -> fairshare.FairShareState:
        """This cycle's shares, with the timers moved on from ``self.starvation`` (or, given
        ``starvation``, exactly those states)."""
        usage = own_usage(self.jobs.values())
        if starvation is not None:
            shares = fairshare.compute(self.pools, usage, self.total)
            return fairshare.FairShareState(shares, dict(starvation), self.pools)
        return fairshare.cycle_state(self.pools, usage, self.total, self.starvation, self.now)

    def plan(self, fair: fairshare.FairShareState | None) -> PreemptionPlan:
        holding = tuple(one for one in self.jobs.values() if one.status in HELD)
        pending = sorted(
            (one for one in self.jobs.values() if one.status == Status.PENDING), key=lambda j: j.id
        )
        return plan(
            PlanInputs(
                now=self.now,
                workers=tuple(self.workers),
                holding=holding,
                preemptors=tuple(Preemptor(one.id, (one,)) for one in pending),
                settings=self.settings,
                pools=self.pools,
                last_preemptive=dict(self.last_preemptive),
                fair=fair,
            )
        )

    def cycle(self, starvation: Mapping[str, StarvationState] | None = None) -> Cycle:
        """Plan with fair share and apply it; the clock moves past the backoff."""
        self._victims_leave()
        fair = self.fair_state(starvation)
        found = self.plan(fair)
        before = dict(self.jobs)
        for preemption in found.preemptions:
            victim_ids = {job_id for victim in preemption.victims for job_id in victim.job_ids}
            for job_id in victim_ids:
                if self.stop_cycles:
                    self.jobs[job_id] = replace(
                        self.jobs[job_id],
                        status=Status.PREEMPTING,
                        preempted_for=preemption.preemptor,
                        drain_started_at=self.now,
                    )
                    self.leaving[job_id] = self.now + self.stop_cycles * (self.settings.backoff_s + 1)
                else:
                    self.jobs[job_id] = requeued(self.jobs[job_id])
            for place in preemption.placements:
                self.jobs[place.job_id] = started(
                    self.jobs[place.job_id], place.worker_id, place.gpu_indices, self.now
                )
                if self.stop_cycles:
                    self.jobs[place.job_id] = replace(
                        self.jobs[place.job_id],
                        status=Status.RESERVED,
                        started_at=None,
                        reserved_at=self.now,
                        victims_deadline=self.now + 1000,
                    )
                    self.waiting_for[place.job_id] = set(victim_ids)
            for worker_id in preemption.worker_ids:
                self.last_preemptive[worker_id] = self.now
        for _, placements in found.fitting:
            for place in placements:
                self.jobs[place.job_id] = started(
                    self.jobs[place.job_id], place.worker_id, place.gpu_indices, self.now
                )
        self.starvation = dict(fair.starvation)
        cycle = Cycle(fair, found, before, dict(self.jobs), self.now)
        self.now += self.settings.backoff_s + 1
        return cycle

    def _victims_leave(self) -> None:
        """Victims whose stop is over are re-queued; preemptors none of whose victims is left
        start."""
        for job_id, at in list(self.leaving.items()):
            if at <= self.now:
                self.jobs[job_id] = requeued(self.jobs[job_id])
                del self.leaving[job_id]
        for job_id, victims in list(self.waiting_for.items()):
            if not victims & self.leaving.keys():
                self.jobs[job_id] = replace(
                    self.jobs[job_id], status=Status.RUNNING, started_at=self.now, victims_deadline=None
                )
                del self.waiting_for[job_id]


def requeued(victim: Job) -> Job:
    return replace(
        victim,
        status=Status.PENDING,
        worker_id=None,
        gpu_indices=(),
        started_at=None,
        preempted_count=victim.preempted_count + 1,
        preempted_for=None,
        drain_started_at=None,
    )


def started(waiting: Job, worker_id: str, indices: tuple[int, ...], now: float) -> Job:
    return replace(waiting, status=Status.RUNNING, worker_id=worker_id, gpu_indices=indices, started_at=now)


def workers(count: int, gpus: int = 8) -> list[Worker]:
    return [gpu_worker(gpus=gpus, worker_id=f"w{index}") for index in range(count)]
