"""The history checker: what must hold of ``job_events`` and the final rows, whatever faults came.

``check(jobs, events, capacities)`` is pure (records in, violations out); ``check_store(store)``
loads them. The chaos suite (``tests/chaos/``) asserts it after every fault and ``bench/soak.py``
reports its verdict. The invariants:

1. **One running attempt at a time.** A job never enters ``running`` while it is already running
   (or preempting), and every run has a larger attempt number than the one before (an attempt is
   never run twice).
2. **No attempt reported twice.** An attempt leaves ``running``/``preempting`` at most once for a
   report-driven outcome: at most one transition out of the lease per attempt.
3. **One end.** A job has at most one transition into a terminal status, none out of one, and its
   final row agrees with its last event: terminal (exactly one terminal event) or still live.
4. **No worker over capacity.** Replaying every transition into and out of a holding status
   (reserved, running, preempting) in time order (releases before acquisitions at one instant, as
   one transaction may free and re-use a slot), no worker ever holds more than it offers.
5. **Gangs are all or nothing.** A gang's tasks are reserved together (every reservation round
   names every task, at one instant), and no task is reserved again once a peer has ended (a gang
   is never re-run in part: a task lost after its peer finished fails the gang, seed 001's rule).
   A task may still start the run it was reserved for after a peer of the same round ended: a
   job that does not wait for its peers (``sleep 1``) can finish before a slow worker claims.

The check reads rows and then events: run it on a quiet system (every job ended, or the
processes stopped), or a job that moves in between reads as a disagreement.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from corral.domain.records import Job, JobEvent
from corral.domain.resources import Resources
from corral.domain.status import HOLDING, LEASED, TERMINAL, Status
from corral.store.ports import Store


@dataclass
class Verdict:
    jobs: int = 0
    events: int = 0
    violations: list[str] = field(default_factory=list)
    by_status: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        head = "OK" if self.ok else f"{len(self.violations)} VIOLATION(S)"
        statuses = ", ".join(f"{status} {count}" for status, count in sorted(self.by_status.items()))
        text = f"history check: {head}; {self.jobs} jobs, {self.events} events ({statuses})"
        return "\n".join([text, *self.violations[:50]])


def check(
    jobs: Sequence[Job], events: Mapping[str, Sequence[JobEvent]], capacities: Mapping[str, Resources]
) -> Verdict:
    verdict = Verdict(jobs=len(jobs), events=sum(len(items) for items in events.values()))
    for job in jobs:
        verdict.by_status[job.status.value] = verdict.by_status.get(job.status.value, 0) + 1
        _check_job(job, events.get(job.id, ()), verdict.violations)
    _check_capacity(jobs, events, capacities, verdict.violations)
    _check_gangs(jobs, events, verdict.violations)
    return verdict


def _check_job(job: Job, history: Sequence[JobEvent], violations: list[str]) -> None:
    running_attempt: int | None = None
    last_run = 0
    exits: dict[int, int] = defaultdict(int)
    terminal = 0
    for event in history:
        if event.from_status is not None and event.from_status in TERMINAL:
            violations.append(f"{job.id}: left terminal status {event.from_status} for {event.to_status}")
        if event.to_status == Status.RUNNING:
            if running_attempt is not None:
                violations.append(f"{job.id}: attempt {event.attempt} ran while {running_attempt} still ran")
            if event.attempt <= last_run:
                violations.append(f"{job.id}: attempt {event.attempt} ran again (last run {last_run})")
            running_attempt = event.attempt
            last_run = max(last_run, event.attempt)
        elif event.from_status in LEASED and event.to_status not in LEASED:
            exits[event.attempt] += 1
            running_attempt = None
        if event.to_status in TERMINAL:
            terminal += 1
    for attempt, count in exits.items():
        if count > 1:
            violations.append(f"{job.id}: attempt {attempt} ended {count} times")
    if terminal > 1:
        violations.append(f"{job.id}: {terminal} terminal transitions")
    if history and history[-1].to_status != job.status:
        violations.append(f"{job.id}: row says {job.status}, last event says {history[-1].to_status}")
    if job.status in TERMINAL and terminal != 1:
        violations.append(f"{job.id}: terminal ({job.status}) with {terminal} terminal events")
    if not history:
        violations.append(f"{job.id}: no events")


def _check_capacity(
    jobs: Sequence[Job],
    events: Mapping[str, Sequence[JobEvent]],
    capacities: Mapping[str, Resources],
    violations: list[str],
) -> None:
    need = {job.id: job.spec.resources for job in jobs}
    # (at, order, job, worker, +1/-1): a release sorts before an acquisition at one instant
    moves: list[tuple[float, int, str, str, int]] = []
    for job_id, history in events.items():
        holder: str | None = None
        for event in history:
            holds = event.to_status in HOLDING
            if holder is not None and (not holds or (event.worker_id and event.worker_id != holder)):
                moves.append((event.at, 0, job_id, holder, -1))
                holder = None
            if holds and holder is None and event.worker_id:
                holder = event.worker_id
                moves.append((event.at, 1, job_id, holder, +1))
    moves.sort()
    # summed: GPUs, memory, CPUs (VRAM is per GPU, checked at placement, never summed)
    used: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    reported: set[str] = set()
    for at, _, job_id, worker_id, sign in moves:
        resources = need.get(job_id, Resources())
        total = used[worker_id]
        for index, amount in enumerate((resources.gpus, resources.memory_mb, resources.cpus)):
            total[index] += sign * amount
        capacity = capacities.get(worker_id)
        if capacity is None or worker_id in reported:
            continue
        if any(
            have > limit
            for have, limit in zip(total, (capacity.gpus, capacity.memory_mb, capacity.cpus), strict=True)
        ):
            reported.add(worker_id)
            violations.append(
                f"worker {worker_id} over capacity at {at:.3f}: (gpus, memory_mb, cpus) {tuple(total)} > "
                f"{(capacity.gpus, capacity.memory_mb, capacity.cpus)}"
            )


def _check_gangs(
    jobs: Sequence[Job], events: Mapping[str, Sequence[JobEvent]], violations: list[str]
) -> None:
    gangs: dict[str, list[Job]] = defaultdict(list)
    for job in jobs:
        if job.gang_id is not None:
            gangs[job.gang_id].append(job)
    for gang_id, tasks in gangs.items():
        first_end = min(
            (event.at for task in tasks for event in events.get(task.id, ()) if event.to_status in TERMINAL),
            default=None,
        )
        if first_end is not None:
            late = [
                task.id
                for task in tasks
                for event in events.get(task.id, ())
                if event.to_status == Status.RESERVED and event.at > first_end
            ]
            if late:
                violations.append(f"gang {gang_id}: {late[0]} reserved again after a peer ended")
        rounds: dict[float, set[str]] = defaultdict(set)
        for task in tasks:
            for event in events.get(task.id, ()):
                if event.to_status == Status.RESERVED:
                    rounds[event.at].add(task.id)
        for at, reserved in rounds.items():
            if len(reserved) != len(tasks):
                violations.append(
                    f"gang {gang_id}: {len(reserved)} of {len(tasks)} tasks reserved at {at:.3f}"
                )


def load(store: Store, page: int = 5000) -> tuple[list[Job], dict[str, list[JobEvent]], dict[str, Resources]]:
    """Every job, its events, and every worker's capacity, from ``store``."""
    from corral.store.base import JobFilter

    jobs: list[Job] = []
    after: tuple[float, str] | None = None
    while True:
        batch = store.jobs.list_jobs(JobFilter(), page, after)
        jobs.extend(batch)
        if len(batch) < page:
            break
        after = (batch[-1].submitted_at, batch[-1].id)
    events = {job.id: store.jobs.job_events(job.id) for job in jobs}
    capacities = {worker.id: worker.resources for worker in store.workers.workers()}
    return jobs, events, capacities


def check_store(store: Store) -> Verdict:
    jobs, events, capacities = load(store)
    return check(jobs, events, capacities)


def check_url(url: str) -> Verdict:
    """The verdict on the store at ``url`` (opened and closed here)."""
    from corral.store import open_store

    store = open_store(url)
    try:
        return check_store(store)
    finally:
        store.close()


def duplicates(lines: Iterable[str]) -> list[str]:
    """Lines written more than once (a job that appends a line per run, checked for a second run)."""
    seen: dict[str, int] = defaultdict(int)
    for line in lines:
        seen[line] += 1
    return sorted(line for line, count in seen.items() if count > 1)
