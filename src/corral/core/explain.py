"""Why is this job not running? A plain answer, computed from values (no I/O).

Each answer is a list of ``Reason`` values with stable codes: the first is the most useful one.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.core.admission_reasons import backfill_refused
from corral.core.placement import Placement, first_fit, free_capacity, holds_in_way, place
from corral.core.schedulable import Verdicts, never_fits
from corral.domain.clock import to_rfc3339
from corral.domain.queue_order import PREEMPTOR_CANDIDATES
from corral.domain.records import Allocation, Hold, Job, Reason, Worker
from corral.domain.status import Status, WorkerStatus

#: the preemption planner's answers a pending job keeps from a cycle that planned for it: stale
#: once the cycles stop reading it (``preemptors_cut``)
_PLANNER_ANSWERS = frozenset({"no_victim_set", "search_limited", "preemption_backoff"})


def explain_pending(
    job: Job,
    workers: Sequence[Worker],
    allocations: Sequence[Allocation],
    holds: Sequence[Hold] = (),
    now: float = 0.0,
) -> list[Reason]:
    """Reasons a pending job has not started, best first, by the rule every claim applies
    (``placement.first_fit``: capacity held for a waiting gang included).

    1. No active worker at all.
    2. No active worker could run it even if empty (too big, constraints): it will wait forever.
    3. Some worker has room now, by the claim's own rule: it starts at that worker's next claim.
    4. It has a reservation of its own: when and where it is planned to start.
    5. Some worker has room, but only capacity held for a waiting gang, which this job may not
       backfill: it waits for the gang (``backfill_refused`` when the gang's start is known).
    6. Otherwise it waits for capacity held by other jobs.
    """
    request, constraints = job.spec.resources, job.spec.constraints
    never = never_fits(1, request, constraints, workers)
    if never is not None and never.code == "no_workers":
        return [never]
    # the reason the job's record carries, as the workers stand now (what the jobs list shows)
    job = Verdicts(workers).with_standing_reason(job)
    active = sorted(
        (worker for worker in workers if worker.status == WorkerStatus.ACTIVE), key=lambda w: w.id
    )
    by_worker: dict[str, list[Allocation]] = {}
    for allocation in allocations:
        by_worker.setdefault(allocation.worker_id, []).append(allocation)
    holds_by_worker: dict[str, list[Hold]] = {}
    for hold in holds:
        holds_by_worker.setdefault(hold.worker_id, []).append(hold)
    could_ever: list[Worker] = []
    refusals: list[Reason] = []
    for worker in active:
        decision = place(request, constraints, worker, free_capacity(worker, []))
        if isinstance(decision, Placement):
            could_ever.append(worker)
        else:
            refusals.append(decision)
    if never is not None:
        return [never, *refusals[:3]]
    held_back: list[tuple[Worker, tuple[Hold, ...]]] = []
    for worker in could_ever:
        capacity = free_capacity(worker, by_worker.get(worker.id, []))
        on_worker = holds_by_worker.get(worker.id, [])
        if isinstance(first_fit(job, worker, capacity, on_worker, now), Placement):
            if job.reason is not None and job.reason.code == "borrowing_refused":
                return [job.reason]  # room, but not for work no preemption could take back
            return [
                Reason("fits_now", f"worker {worker.id} has room: the job starts at its next claim"),
                *([job.reason] if job.reason else []),
            ]
        in_way = holds_in_way(job, on_worker, now)
        if in_way and isinstance(place(request, constraints, worker, capacity), Placement):
            held_back.append((worker, in_way))
    planned = reserved_for(job, holds)
    if planned is not None:
        return [planned]
    if held_back:
        worker, in_the_way = held_back[0]
        return [held_for_gang(job, worker, in_the_way, len(held_back), now)]
    return [
        Reason(
            "waiting_for_capacity",
            f"{len(could_ever)} worker(s) can run this job but their capacity is held by other jobs",
        ),
        *([job.reason] if job.reason else []),
    ]


def reserved_for(job: Job, holds: Sequence[Hold]) -> Reason | None:
    """The job's own reservation (``corral.core.reservations``), if it has one with a start."""
    mine = [hold for hold in holds if hold.gang_id == job.id and hold.expected_at is not None]
    if not mine:
        return None
    start = min(hold.expected_at for hold in mine if hold.expected_at is not None)
    workers = ", ".join(sorted({hold.worker_id for hold in mine}))
    return Reason("reserved_for_later", f"planned to start at {to_rfc3339(start)} on {workers}")


def held_for_gang(job: Job, worker: Worker, holds: Sequence[Hold], count: int, now: float) -> Reason:
    """Room exists, but it is kept for the gang first in line (seed 001's hold), and this job may
    not backfill it: no declared walltime, or one that ends after the gang is expected to start.
    Kept by reservations with a start, it is ``backfill_refused``: it would delay the first."""
    if all(hold.expected_at is not None for hold in holds):
        first = min(holds, key=lambda hold: (hold.expected_at or 0.0, hold.gang_id))
        assert first.expected_at is not None
        return backfill_refused(first.gang_id, first.expected_at, job.spec.walltime_s)
    gang_ids = ", ".join(sorted({hold.gang_id for hold in holds}))
    expected = [hold.expected_at for hold in holds]
    if any(at is None for at in expected):
        rule = "nothing may backfill it (when it frees up is unknown)"
    else:
        at = max(at for at in expected if at is not None)
        walltime = job.spec.walltime_s
        expected_free = f"expected free in {max(0.0, at - now):.0f} s"
        rule = (
            f"{expected_free}; declare a walltime_s that ends before then to backfill"
            if walltime is None
            else f"{expected_free}, before this job's walltime_s ({walltime:g} s) ends"
        )
    return Reason(
        "held_for_gang",
        f"worker {worker.id}{f' (and {count - 1} more)' if count > 1 else ''} has room, but it is held "
        f"for gang {gang_ids}; {rule}",
    )


def preemptors_cut(ahead: int | None, read: int = PREEMPTOR_CANDIDATES) -> Reason | None:
    """``search_limited`` for a pending single job the cycle's read of possible preemptors by class
    stops before: ``ahead`` of them in queue order (``Gangs.preemptors_ahead``, counted up to
    ``read``, the cap: ``PREEMPTOR_CANDIDATES``). The planner then plans nothing for it (no victim
    set is looked for), whatever its last recorded answer said. None when the read takes it, or
    the read by class never would (``ahead`` None)."""
    if ahead is None or ahead < read:
        return None
    return Reason(
        "search_limited",
        f"the preemption planner reads at most {read:,} pending jobs per cycle as possible preemptors"
        " (in queue order, of the lowest running class or above), and at least that many are ahead"
        " of this one: no victim set is looked for it until those ahead have started or left (a"
        " starving or sensitive pool's jobs are also read apart)",
    )


def explain(
    job: Job,
    workers: Sequence[Worker],
    allocations: Sequence[Allocation],
    holds: Sequence[Hold] = (),
    now: float = 0.0,
    fair_share: Reason | None = None,
    pool_limit: Reason | None = None,
    preemptor_cut: Reason | None = None,
) -> list[Reason]:
    """Why ``job`` is where it is: its pool's limits first when they keep it waiting
    (``pool_limits.explain``: no claim starts it, so "fits now" would mislead); live reasons for
    a pending job (its ``after`` conditions while it waits on them), else its last recorded reason;
    for a pending job that does not fit now and that the cycles' read of possible preemptors
    leaves out (``preemptor_cut``, from ``preemptors_cut``), that in place of the planner's last
    answer (its ``no_victim_set`` came from a cycle that still read it);
    its pool's fair share when it waits in a pool below it (``fairshare.explain``); then what its
    preemptions cost it, when it was preempted (seed 003: a failed or late checkpoint is visible)."""
    waits_on_dependencies = job.status == Status.PENDING and job.awaiting_dependencies
    reasons = []
    if waits_on_dependencies:
        named = ", ".join(f"{item.when}:{item.id}" for item in job.spec.after)
        reasons.append(Reason("dependency", f"waiting for the jobs it runs after ({named})"))
    elif job.status == Status.PENDING:
        reasons = explain_pending(job, workers, allocations, holds, now)
        if preemptor_cut is not None and reasons and reasons[0].code != "fits_now":
            reasons = [*(reason for reason in reasons if reason.code not in _PLANNER_ANSWERS), preemptor_cut]
    if job.status != Status.PENDING and job.reason and not (pool_limit and job.reason.code == "pool_limit"):
        reasons.append(job.reason)
    if pool_limit is not None:
        skipped = {"fits_now", "pool_limit"}
        reasons = [pool_limit, *(reason for reason in reasons if reason.code not in skipped)]
    if fair_share is not None:
        reasons.append(fair_share)
    if job.checkpoint_failures:
        reasons.append(
            Reason(
                "checkpoint_failed",
                f"{job.checkpoint_failures} preemption checkpoint(s) came late or not at all: the job lost"
                " the work since its last checkpoint",
            )
        )
    if job.preempted_count:
        reasons.append(Reason("preempted_before", f"preempted {job.preempted_count} time(s) so far"))
    return reasons
