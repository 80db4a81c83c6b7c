"""Gang rules (seeds 001 and 000): reserve, roll back a stale reservation, drain, complete a drain.

Every function takes the gang's tasks as read under lock (``gang_index`` order) and returns the
transitions to apply; nothing here reads a clock or a database. ``corral.core.lifecycle`` calls
them when a report or a reaper pass touches a gang task, and the admission loop for stale
reservations and waiting reasons; a simulator can call them on its own records.

The drain (seed 000's PreemptGang), in steps:

1. A new preemption epoch shared by the gang: the highest of its tasks' plus one.
2. The trigger, whose process is gone (it failed, tripped a watchdog, its lease expired), goes
   straight to ``preempted``: no ack can come. It keeps its attempt: that attempt is the real
   failure the retry budget must count.
3. Running peers go to ``preempting`` with the epoch (their next heartbeat says stop) and get their
   attempt back (``refunds`` + 1; ``attempts``, the fence their workers report with, is untouched).
   Peers whose lease also expired (a lease-expiry drain: ``expired_before``) are gone too: they go
   straight to ``preempted``, refunded, instead of waiting out the force-drain for an ack their dead
   worker will never send.
4. Reserved and pending peers go back to ``blocked``; terminal and blocked tasks stay. A trigger that
   never claimed its reservation is charged an attempt, or a worker that heartbeats but never claims
   would have the gang reserved and drained forever.

The completion rule (seed 000's option B), once nothing of the gang is in flight (reserved, running
or preempting): the gang goes back to ``blocked`` as a unit, or to ``failed`` when a task is out of
retries or a task already ended ``done`` or ``failed`` (those keep their own status: a gang that has
partly finished cannot be restarted whole), or when the trigger's failure is one another attempt
would meet again (``NOT_RETRIED``: its reason code says so, e.g. ``walltime_exceeded``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from corral.domain.records import Job, Reason
from corral.domain.status import TERMINAL, Status
from corral.domain.transitions import Plan, Transition, applied, move

__all__ = [
    "BLOCKED",
    "NOT_RETRIED",
    "DrainCompleted",
    "DrainStarted",
    "complete",
    "completion",
    "note_waiting",
    "reserve",
    "stale_reservation",
    "start_drain",
]

#: failure codes a worker reports (``POST /jobs/{id}/fail`` ``reason``) that another attempt would
#: meet again: a single job fails at once (``lifecycle.report_failure``), a gang whose drain such a
#: failure triggered fails at its completion (API.md "A job is contained on its host", "Time limits")
NOT_RETRIED = frozenset({"no_such_account", "workdir_unavailable", "walltime_exceeded"})

#: the statuses in which a gang task still has something under way: the drain is not over
IN_FLIGHT = frozenset({Status.RESERVED, Status.RUNNING, Status.PREEMPTING})
#: what a task loses when it goes back to waiting for the admission cycle
BLOCKED: dict[str, object] = {
    "worker_id": None,
    "gpu_indices": (),
    "started_at": None,
    "last_heartbeat_at": None,
    "reserved_at": None,
    "drain_started_at": None,
    "victims_deadline": None,
}
#: what a preemption victim loses when it goes back to the queue: its preemptor, its checkpoint phase
VICTIM_CLEARED: dict[str, object] = {
    "preempted_for": None,
    "checkpoint_requested_at": None,
    "checkpoint_deadline": None,
    "checkpoint_extended": False,
    "checkpoint_deferred_s": 0.0,
}


@dataclass(frozen=True, slots=True)
class DrainStarted:
    """A drain that started: the gang, its new shared epoch, the trigger as it is now, and every
    task the drain moved (the trigger included when it moved)."""

    gang_id: str
    epoch: int
    trigger: Job
    transitioned: tuple[Job, ...]


@dataclass(frozen=True, slots=True)
class DrainCompleted:
    """A gang whose drain ended: ``outcome`` ``blocked`` (back in the queue as a unit) or ``failed``.

    ``watchdog_trips`` names the kind of each watchdog trip this completion settles: a rank's trip
    under the cap drains the gang, and only the completion knows whether that re-queued the work
    (``blocked``) or ended it (``failed``)."""

    gang_id: str
    outcome: str
    epoch: int
    drain_seconds: float | None
    tasks: tuple[Job, ...]
    watchdog_trips: tuple[str, ...] = ()
    #: a preemption victim re-queued: the job or gang it was stopped for
    preempted_for: str | None = None


# --- reserve -------------------------------------------------------------------------------


def reserve(
    tasks: Sequence[Job],
    placements: dict[str, tuple[str, tuple[int, ...]]],
    master_port: int,
    now: float,
    why: str = "gang reserved on worker {worker}; waiting for its claim",
    victims_deadline: float | None = None,
) -> Plan[tuple[Job, ...] | None]:
    """Every task from ``blocked`` to ``reserved`` on its worker (``placements``: job id -> worker,
    GPU indices), or nothing when a task is no longer blocked or the placements do not cover the
    gang exactly (a claim or another replica got there first since the snapshot). A preemptor's
    reservation waits for its victims: ``victims_deadline`` (``corral.core.preemption``)."""
    if set(placements) != {task.id for task in tasks} or any(task.status != Status.BLOCKED for task in tasks):
        return Plan((), None)
    transitions = []
    for task in tasks:
        worker_id, gpu_indices = placements[task.id]
        transitions.append(reserve_one(task, worker_id, gpu_indices, now, why, master_port, victims_deadline))
    return Plan(tuple(transitions), tuple(transition.after for transition in transitions))


def reserve_one(
    job: Job,
    worker_id: str,
    gpu_indices: Sequence[int],
    now: float,
    why: str,
    master_port: int | None = None,
    victims_deadline: float | None = None,
) -> Transition:
    """One task, or one single job a preemption made room for, to ``reserved`` on ``worker_id``
    (``why`` names the worker as ``{worker}``): a new reservation epoch, the claim it waits for."""
    return move(
        job,
        now,
        Reason("reserved", why.format(worker=worker_id)),
        status=Status.RESERVED,
        worker_id=worker_id,
        gpu_indices=tuple(gpu_indices),
        reservation_epoch=job.reservation_epoch + 1,
        reserved_at=now,
        master_port=master_port,
        victims_deadline=victims_deadline,
    )


def note_waiting(tasks: Sequence[Job], reason: Reason, now: float) -> Plan[None]:
    """Why a blocked gang was not placed this cycle (``corral why``), on each blocked task that
    does not say so already: no status change, so no event row."""
    return Plan(
        tuple(
            move(task, now, None, reason=reason)
            for task in tasks
            if task.status == Status.BLOCKED and task.reason != reason
        ),
        None,
    )


def first_free_port(used: set[int], first: int = 29500) -> int:
    """The lowest rendezvous port from ``first`` (PyTorch's customary MASTER_PORT) no other gang on
    rank 0's worker uses."""
    port = first
    while port in used:
        port += 1
    return port


# --- stale reservations ----------------------------------------------------------------------


def stale_tasks(tasks: Sequence[Job], now: float, timeout_s: float) -> tuple[Job, ...]:
    """The reserved tasks whose reservation is older than ``timeout_s``: the one staleness rule,
    used by the admission cycle on its snapshot and again under lock when the rollback is applied.
    A preemptor's reservation counts from the time its victims must have left (``victims_deadline``),
    not from when it was made: it cannot be claimed before they have."""
    return tuple([task for task in tasks if is_stale(task, now, timeout_s)])


def reserved_under(task: Job, epoch: int | None) -> bool:
    """Seed 001's epoch check: ``task`` still holds the reservation a decision read, made under
    ``epoch`` (None: no epoch read, nothing to compare). A reservation rolled back and made again
    since has a newer ``reservation_epoch``: a decision about the old one (a claim that chose it,
    a rollback that found it stale) does not apply to the new one. The decision runs on the row
    locked in the transaction that writes it, so the check and the compare-and-set are one."""
    return epoch is None or task.reservation_epoch == epoch


def is_stale(task: Job, now: float, timeout_s: float) -> bool:
    if task.status != Status.RESERVED or task.reserved_at is None:
        return False
    return max(task.reserved_at, task.victims_deadline or 0.0) < now - timeout_s


def stale_reservation(
    tasks: Sequence[Job], now: float, timeout_s: float, epochs: Mapping[str, int] | None = None
) -> Plan[tuple[DrainStarted | None, DrainCompleted | None, tuple[Job, ...]]]:
    """Undo a reservation that went unclaimed past ``timeout_s``.

    ``epochs``: the reservation epoch of each task the decision found stale, by job id (the
    admission's ``Rollback``): a task reserved again since under a newer epoch (another replica
    rolled the gang back and reserved it anew) is no longer the reservation found stale, and
    nothing is undone (``reserved_under``).

    Without a started or finished sibling, the reserved tasks go back to ``blocked``. With one
    (seed 001's stuck state: the started ranks would wait forever for a peer that never joins; a
    finished rank means the gang can never run whole again) the gang drains instead, with the first
    stale task as the trigger, and completes at once when nothing is left in flight. The outcome:
    (the drain or None, its completion or None, the tasks rolled back to ``blocked``).
    """
    if epochs and not all(reserved_under(task, epochs.get(task.id)) for task in tasks):
        return Plan((), (None, None, ()))
    stale = stale_tasks(tasks, now, timeout_s)
    if not stale:
        return Plan((), (None, None, ()))
    ages = [now - (task.reserved_at or now) for task in stale]
    message = (
        f"{len(stale)} reserved task(s) not claimed within {timeout_s:g} s "
        f"(worker {stale[0].worker_id}; reserved {max(ages):.0f} s ago)"
    )
    reason = Reason("reservation_expired", message)
    started = [
        task
        for task in tasks
        if task.status in (Status.RUNNING, Status.PREEMPTING) or task.status in TERMINAL
    ]
    if started:
        transitions, drain = start_drain(tasks, stale[0].id, now, reason)
        after = applied(tasks, transitions)
        completion = complete(after, now)
        if completion is not None:
            transitions += completion.transitions
        return Plan(transitions, (drain, completion.outcome if completion else None, ()))
    transitions = tuple(
        move(task, now, reason, status=Status.BLOCKED, **BLOCKED)
        for task in tasks
        if task.status == Status.RESERVED
    )
    return Plan(transitions, (None, None, tuple(transition.after for transition in transitions)))


# --- the drain --------------------------------------------------------------------------------


def start_drain(
    tasks: Sequence[Job],
    trigger_id: str,
    now: float,
    reason: Reason,
    trigger_fields: dict[str, object] | None = None,
    expired_before: float | None = None,
) -> tuple[tuple[Transition, ...], DrainStarted]:
    """Seed 000's drain of the gang of ``tasks`` (steps in the module docstring). ``trigger_fields``
    are recorded on a running trigger (exit code, error, output tail, a refund or a watchdog count).
    """
    epoch = max(task.preemption_epoch for task in tasks) + 1
    stamp = {"preemption_epoch": epoch, "drain_started_at": now}
    peer_reason = Reason("gang_drain", f"gang drain: {reason.message} (task {trigger_id}); stopping")
    transitions: list[Transition] = []
    for task in tasks:
        if task.id == trigger_id and task.status == Status.RUNNING:
            fields = {**(trigger_fields or {}), **stamp}
            transitions.append(move(task, now, reason, epoch, status=Status.PREEMPTED, **fields))
        elif task.status == Status.RUNNING and _silent_since_before(task, expired_before):
            gone = Reason("lease_expired", f"gang drain: {reason.message}; this task's lease expired too")
            transitions.append(
                move(task, now, gone, epoch, status=Status.PREEMPTED, refunds=task.refunds + 1, **stamp)
            )
        elif task.status == Status.RUNNING:
            transitions.append(
                move(
                    task, now, peer_reason, epoch, status=Status.PREEMPTING, refunds=task.refunds + 1, **stamp
                )
            )
        elif task.status in (Status.RESERVED, Status.PENDING):
            charged = {"attempts": task.attempts + 1} if task.id == trigger_id else {}
            why = reason if task.id == trigger_id else Reason("gang_drain", f"gang drain: {reason.message}")
            transitions.append(
                move(
                    task, now, why, epoch, status=Status.BLOCKED, **BLOCKED, preemption_epoch=epoch, **charged
                )
            )
    moved = tuple(transition.after for transition in transitions)
    trigger = next((job for job in moved if job.id == trigger_id), None)
    if trigger is None:
        trigger = next(task for task in tasks if task.id == trigger_id)
    gang_id = tasks[0].gang_id or ""
    return tuple(transitions), DrainStarted(gang_id, epoch, trigger, moved)


def _silent_since_before(task: Job, cutoff: float | None) -> bool:
    if cutoff is None:
        return False
    last_contact = task.last_heartbeat_at or task.started_at
    return last_contact is not None and last_contact < cutoff


def completion(tasks: Sequence[Job], now: float) -> Plan[DrainCompleted | None]:
    """``complete`` as a plan that does nothing when there is nothing to complete (the reaper's
    pass over gangs that may have a drain to end)."""
    plan = complete(tasks, now)
    return Plan((), None) if plan is None else Plan(plan.transitions, plan.outcome)


# --- the completion rule ------------------------------------------------------------------------


def _not_retried(task: Job) -> bool:
    """The drain's trigger stopped for a failure another attempt would meet again."""
    return task.status == Status.PREEMPTED and task.reason is not None and task.reason.code in NOT_RETRIED


def complete(tasks: Sequence[Job], now: float) -> Plan[DrainCompleted] | None:
    """Seed 000's completion rule (module docstring), or None when there is nothing to complete:
    something is still in flight, or no drain happened and nothing is stranded.

    Stranded: a task ended ``done`` or ``failed`` while siblings wait in ``blocked`` (a rank
    finished, then a sibling's reservation expired): the gang can never run whole again either.
    A ``reserved`` sibling is in flight, not stranded: it is claimed as usual (a normal race with a
    rank that finishes first), or its reservation expires and drains the gang.
    """
    statuses = {task.status for task in tasks}
    if statuses & IN_FLIGHT:
        return None
    stranded = bool(statuses & {Status.DONE, Status.FAILED}) and bool(statuses - TERMINAL)
    if Status.PREEMPTED not in statuses and not stranded:
        return None
    preempted_for = next((task.preempted_for for task in tasks if task.preempted_for), None)
    exhausted = [
        task
        for task in tasks
        if task.status not in TERMINAL and (not task.retries_left or _not_retried(task))
    ]
    ended = [task for task in tasks if task.status in (Status.DONE, Status.FAILED)]
    epoch = max(task.preemption_epoch for task in tasks)
    started = [task.drain_started_at for task in tasks if task.drain_started_at is not None]
    tripped = tuple(
        task.reason.code.removeprefix("watchdog_")
        for task in tasks
        if task.status == Status.PREEMPTED
        and task.reason is not None
        and task.reason.code.startswith("watchdog_")
    )
    transitions: list[Transition] = []
    if exhausted or ended:
        culprit = ended[0] if ended else exhausted[0]
        why = f"already ended {culprit.status.value}" if ended else "is out of retries"
        if not ended and culprit.retries_left and _not_retried(culprit) and culprit.reason is not None:
            why = f"failed with {culprit.reason.code}, which another attempt would meet again"
        reason = Reason("gang_failed", f"gang failed: task {culprit.gang_index} ({culprit.id}) {why}")
        outcome = "failed"
        transitions.extend(
            move(task, now, reason, epoch, status=Status.FAILED, finished_at=now, drain_started_at=None)
            for task in tasks
            if task.status not in TERMINAL
        )
    else:
        reason = Reason("gang_requeued", "gang drained; waiting for the admission cycle to place it again")
        outcome = "blocked"
        # A drain that began with a watchdog trip puts the gang at the front of its queue, as a
        # tripped single job is.
        front = bool(tripped)
        if preempted_for is not None:
            reason = Reason(
                "preempted_requeued",
                f"gang preempted for {preempted_for}; re-queued with its submission time kept",
            )
        for task in tasks:
            if task.status != Status.BLOCKED:
                victim: dict[str, object] = {}
                if task.preempted_for is not None:
                    victim = {**VICTIM_CLEARED, "preempted_count": task.preempted_count + 1}
                transitions.append(
                    move(
                        task,
                        now,
                        reason,
                        epoch,
                        status=Status.BLOCKED,
                        **BLOCKED,
                        queue_front=front,
                        **victim,
                    )
                )
            elif task.preempted_for is not None:
                cleared = {**VICTIM_CLEARED, "preempted_count": task.preempted_count + 1}
                transitions.append(move(task, now, None, queue_front=front, **cleared))
            elif task.queue_front != front:  # set, or cleared after an earlier trip's re-queue
                transitions.append(move(task, now, None, queue_front=front))
    return Plan(
        tuple(transitions),
        DrainCompleted(
            gang_id=tasks[0].gang_id or "",
            outcome=outcome,
            epoch=epoch,
            drain_seconds=now - min(started) if started else None,
            tasks=tuple(transition.after for transition in transitions if transition.changes_status),
            watchdog_trips=tripped,
            preempted_for=preempted_for if outcome == "blocked" else None,
        ),
    )
