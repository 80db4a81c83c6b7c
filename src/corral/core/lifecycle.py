"""Every decision about a job's next status, as pure functions: rows in, a ``Plan`` out.

Each function takes the job as the store read it under lock (and, for a gang task, every task of
its gang, in ``gang_index`` order), the report or the time, and returns the transitions to apply
with a typed outcome the caller turns into metrics and log lines. A report that the state does not
allow raises a ``Conflict`` (409), and nothing is written. The store applies the plan (one
compare-and-set per transition, its event row, in one transaction); a simulator can apply the
same plans to its own records (``corral.domain.transitions.applied``), so that what it predicts is
what the server does.

Where each rule of the seeds lives:

- the submit (a single job ``pending``, a gang's tasks ``blocked``): ``submitted``;
- the claim (pending or reserved -> running, ``attempts`` + 1: the fence): ``start``;
- the fence every worker report is checked against: ``check_fence``; which heartbeats renew a
  lease and what they answer (a preemption's checkpoint phase included): ``check_heartbeat``,
  ``heartbeat_action``; which checkpoint uploads are
  kept (from a stop at its epoch, or from any end of the current attempt): ``accept_checkpoint``;
- seed 000's retry rule (retry while counted attempts < ``max_retries``): ``report_failure``;
- a worker handing a job back without spending its attempt: ``report_failure(release=True)``;
- a watchdog trip (seed 004: re-queue at the front while under the cap, else fail; the trip spends
  only the watchdog cap, never an attempt): ``report_trip``;
- the stop the server asked for ending (ack, or the job exiting while stopped): ``acknowledge_stop``,
  ``finish_stop``; the force-drain of a stop nobody acks: ``force_drain``;
- the lease reaper's outcomes: ``lease_expired``; a job its worker says it no longer runs (seed 004's
  busy ghost): ``gone_from_worker``;
- cancel: ``cancel``;
- the gang drain, its completion rule, stale reservations: ``corral.core.drain``, called from here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from corral.core import dependencies, drain, schedulable
from corral.core.drain import VICTIM_CLEARED, DrainCompleted, DrainStarted
from corral.core.hearing import ALWAYS, Hearing, silence_cutoff
from corral.domain import errors
from corral.domain.ids import new_array_id, new_gang_id, new_job_id
from corral.domain.records import Job, JobSpec, Reason
from corral.domain.status import LEASED, TERMINAL, Status
from corral.domain.transitions import FencedReport, Plan, Submission, Transition, applied, move

__all__ = [
    "CheckpointAccepted",
    "HeartbeatAction",
    "Reported",
    "accept_checkpoint",
    "acknowledge_stop",
    "cancel",
    "check_fence",
    "check_heartbeat",
    "force_drain",
    "ghost_cutoff",
    "gone_from_worker",
    "heartbeat_action",
    "lease_expired",
    "note_waiting",
    "report_done",
    "report_failure",
    "report_trip",
    "stale_single_reservation",
    "start",
    "submitted",
]

#: what a job loses when it goes back to the queue
REQUEUED: dict[str, object] = {
    "worker_id": None,
    "gpu_indices": (),
    "started_at": None,
    "last_heartbeat_at": None,
}


@dataclass(frozen=True, slots=True)
class Reported:
    """What one decision did to a job: the job as it is now, the drain it started and the drain it
    completed (gang tasks), and, for a watchdog trip, the outcome the trip counts as (``requeued``
    or ``failed``; None when the drain's completion decides it, or the job was being stopped
    anyway)."""

    job: Job
    drain: DrainStarted | None = None
    completion: DrainCompleted | None = None
    trip_outcome: str | None = None
    #: the decision ended a stop the server had asked for with the job ``preempted``
    preempted: bool = False
    #: a preemption victim's checkpoint phase ended without a checkpoint (the job stopped first)
    failed_checkpoint: bool = False
    #: a preemption victim went back to the queue
    requeued: bool = False


# --- the fence --------------------------------------------------------------------------------


def check_fence(job: Job, worker_id: str, attempt: int) -> None:
    """A report must come from the worker and attempt that hold the job now; a stale one is refused
    (409 ``stale_attempt``) and the worker stops its copy."""
    if job.worker_id != worker_id or job.attempts != attempt:
        raise errors.StaleAttempt(
            f"job {job.id} is at attempt {job.attempts} on worker {job.worker_id}, "
            f"not attempt {attempt} on worker {worker_id}: stop it"
        )


def _not_running(job: Job) -> errors.Conflict:
    return errors.NotRunning(f"job {job.id} is {job.status}, not running")


# --- submit -----------------------------------------------------------------------------------

#: within one request, jobs are stamped this far apart, so the request's order is their queue order
BATCH_STEP_S = 1e-6
#: failure codes another attempt would meet again (``drain.NOT_RETRIED``)
NOT_RETRIED = drain.NOT_RETRIED
QUEUED = schedulable.QUEUED
WAITING_FOR_DEPENDENCY = dependencies.WAITING_FOR_DEPENDENCY
WAITING_FOR_GANG = Reason("gang_waiting", "waiting for the admission cycle to place the whole gang")


def submitted(
    specs: Sequence[JobSpec], now: float, verdicts: schedulable.Verdicts | None = None
) -> tuple[Submission, ...]:
    """The jobs a submit creates, in request order: a single job ``pending`` (any worker it fits may
    claim it), a gang's ``gang_size`` tasks ``blocked`` until the admission cycle reserves them all,
    an array's tasks each a single job of its own. A job with ``after`` conditions is ``pending``
    with reason ``dependency`` until they hold (``core.dependencies``).

    ``verdicts``: what the registered workers make of work, when the caller read them. Work none
    of them could ever hold (``schedulable.Verdicts.verdict``) then carries ``unschedulable``
    from its submit on, instead of a reason that promises it a place."""

    def standing(spec: JobSpec) -> Reason | None:
        if verdicts is None:
            return None
        return verdicts.verdict(spec.gang_size, spec.resources, spec.constraints)

    submissions: list[Submission] = []
    for offset, spec in enumerate(specs):
        stamp = now + offset * BATCH_STEP_S
        if spec.gang_size > 1:
            if spec.array is not None:
                raise errors.InvalidRequest("an array's tasks cannot be gangs", field="array")
            gang_id = new_gang_id()
            reason = standing(spec) or WAITING_FOR_GANG
            tasks = tuple(
                Job(new_job_id(), spec, Status.BLOCKED, stamp, gang_id, index, reason=reason)
                for index in range(spec.gang_size)
            )
            submissions.append((gang_id, tasks))
        elif spec.array is not None:
            submissions.append(_array_submitted(spec, stamp, standing(spec)))
        else:
            submissions.append((None, (_pending(spec, stamp, standing(spec)),)))
    return tuple(submissions)


def _pending(
    spec: JobSpec,
    stamp: float,
    standing: Reason | None = None,
    array: tuple[str, int, int, int | None] | None = None,
) -> Job:
    """A single job as submitted: queued (or ``standing``: it could never be placed), or waiting
    on its dependencies; ``array``: a task's array id, index, array size and throttle."""
    array_id, array_index, array_size, array_throttle = array or (None, None, None, None)
    return Job(
        new_job_id(),
        spec,
        Status.PENDING,
        stamp,
        reason=WAITING_FOR_DEPENDENCY if spec.after else standing or QUEUED,
        awaiting_dependencies=bool(spec.after),
        array_id=array_id,
        array_index=array_index,
        array_size=array_size,
        array_throttle=array_throttle,
    )


def _array_submitted(spec: JobSpec, stamp: float, standing: Reason | None) -> Submission:
    """An array's tasks in index order, each stamped a step after the one before (queue order)."""
    assert spec.array is not None
    array_id = new_array_id()
    indices = spec.array.indices
    task_spec = replace(spec, array=None)
    tasks = tuple(
        _pending(
            task_spec,
            stamp + position * BATCH_STEP_S,
            standing,
            (array_id, index, len(indices), spec.array.throttle),
        )
        for position, index in enumerate(indices)
    )
    return (array_id, tasks)


# --- the claim --------------------------------------------------------------------------------


def start(
    job: Job,
    worker_id: str,
    gpu_indices: Sequence[int],
    now: float,
    claim_key: str | None = None,
    reservation_epoch: int | None = None,
) -> Transition | None:
    """pending -> running (any worker it fits) or reserved -> running (the worker it is reserved
    on, seed 001: a reservation rolled back, or moved to another worker, is not claimed); None when
    neither holds. ``reservation_epoch``: the epoch of the reservation the claim chose (None: the
    one the row holds); a task reserved again since, under a newer epoch, is not started by a claim
    that chose the older reservation (``drain.reserved_under``). The new attempt number is the
    fence of every report the worker makes for it; ``claim_key`` (the claim's Idempotency-Key)
    lets a retry of the same claim find this run."""
    reserved_here = (
        job.status == Status.RESERVED
        and job.worker_id == worker_id
        and drain.reserved_under(job, reservation_epoch)
    )
    if job.status != Status.PENDING and not reserved_here:
        return None
    return move(
        job,
        now,
        Reason("claimed", f"claimed by worker {worker_id}"),
        status=Status.RUNNING,
        worker_id=worker_id,
        gpu_indices=tuple(gpu_indices),
        attempts=job.attempts + 1,
        started_at=now,
        last_heartbeat_at=now,
        queue_front=False,
        exit_code=None,
        reason=None,
        victims_deadline=None,
        claim_key=claim_key,
    )


def check_heartbeat(job: Job, worker_id: str, attempt: int) -> None:
    """A job heartbeat renews the lease of the attempt that holds the job while it runs or is being
    stopped; any other is refused, and the worker stops its copy."""
    check_fence(job, worker_id, attempt)
    if job.status not in LEASED:
        raise _not_running(job)


@dataclass(frozen=True, slots=True)
class HeartbeatAction:
    """What a heartbeat answers: carry on (``action`` None), ``checkpoint`` before the stop (with
    the seconds left, ``deadline_s``), or ``preempt``. ``failed_checkpoint``: this heartbeat ended a
    checkpoint phase that got no checkpoint (counted, and shown by ``why``)."""

    job: Job
    action: str | None = None
    epoch: int | None = None
    deadline_s: float | None = None
    failed_checkpoint: bool = False


def heartbeat_action(
    job: Job, now: float, defer_s: float | None, checkpoint_timeout_s: float, max_deferral_s: float
) -> Plan[HeartbeatAction]:
    """The answer to a heartbeat of a job being stopped, and the checkpoint phase's clock (seed 003):

    - ``defer_s`` (the job asked for more time, ``jobkit.defer``) pushes the deadline to at least
      ``now + defer_s``, up to ``max_deferral_s`` granted in all;
    - at the deadline, a job still beating (this heartbeat) gets one extension of 50% of
      ``checkpoint_timeout_s``;
    - past it, the phase ends without a checkpoint (``checkpoint_failures`` + 1) and the stop begins:
      the force-drain timer counts from now, never cutting the phase short.

    The first ``checkpoint`` answer is seed 003's checkpoint hint: the worker is told now, so
    ``checkpoint_requested_at`` is set now (once), and the phase's duration (the
    ``corral_preemption_checkpoint_duration_seconds`` histogram, the job's expected checkpoint
    time) is timed from it by ``accept_checkpoint``, not from the preemption decision: the wait
    for the victim's next heartbeat is not the job's checkpoint time.
    """
    if job.status != Status.PREEMPTING:
        return Plan((), HeartbeatAction(job))
    epoch = job.preemption_epoch
    deadline = job.checkpoint_deadline
    if deadline is None:
        return Plan((), HeartbeatAction(job, "preempt", epoch))
    fields: dict[str, object] = {}
    if defer_s and job.checkpoint_deferred_s < max_deferral_s:
        grant = min(defer_s, max_deferral_s - job.checkpoint_deferred_s)
        fields["checkpoint_deferred_s"] = job.checkpoint_deferred_s + grant
        deadline = max(deadline, now + grant)
    if now >= deadline and not job.checkpoint_extended:
        deadline += checkpoint_timeout_s * 0.5
        fields["checkpoint_extended"] = True
    if now < deadline:
        if deadline != job.checkpoint_deadline:
            fields["checkpoint_deadline"] = deadline
        if job.checkpoint_requested_at is None:
            fields["checkpoint_requested_at"] = now  # the hint: the worker is told now
        if not fields:
            return Plan((), HeartbeatAction(job, "checkpoint", epoch, deadline - now))
        transition = move(job, now, None, **fields)
        return Plan((transition,), HeartbeatAction(transition.after, "checkpoint", epoch, deadline - now))
    if job.checkpoint_requested_at is None:
        late = "no checkpoint: its worker was not heard from in time to be asked for one; stopping"
    else:
        waited = now - job.checkpoint_requested_at
        late = f"no checkpoint {waited:.0f} s after it was asked for; stopping"
    transition = move(
        job,
        now,
        None,
        **fields,
        checkpoint_deadline=None,
        checkpoint_failures=job.checkpoint_failures + 1,
        drain_started_at=now,
        reason=Reason("checkpoint_timed_out", late),
    )
    return Plan((transition,), HeartbeatAction(transition.after, "preempt", epoch, failed_checkpoint=True))


def ghost_cutoff(previous_contact: float | None, now: float, lease_s: float) -> float | None:
    """A job its worker's heartbeat does not list is gone when it has not heartbeated since this:
    since the worker's previous heartbeat (so the worker had a whole interval to list a job it
    had just claimed), and for at least a third of the lease (two missed job heartbeats at the
    default intervals). None: no previous heartbeat to judge by."""
    if previous_contact is None:
        return None
    return min(previous_contact, now - lease_s / 3)


# --- reports from the worker --------------------------------------------------------------------


def report_done(job: Job, gang: Sequence[Job], worker_id: str, attempt: int, now: float) -> Plan[Reported]:
    """running (or preempting: it finished before it was stopped, and keeps its result) -> done."""
    check_fence(job, worker_id, attempt)
    if job.status not in (Status.RUNNING, Status.PREEMPTING):
        raise _not_running(job)
    done = move(job, now, COMPLETED, **done_fields(now))
    return _then_complete((done,), gang, now, Reported(done.after))


#: a ``done`` report's reason, on the row and its event
COMPLETED = Reason("completed", "exited with code 0")


def done_fields(now: float) -> dict[str, Any]:
    """The fields a ``done`` report sets on a job it accepts, whatever the job was (the store's
    one-statement ``done``, ``done_report``, writes exactly these)."""
    return {"status": Status.DONE, "finished_at": now, "exit_code": 0}


def done_report(worker_id: str, attempt: int, now: float) -> FencedReport:
    """A ``done`` report's decision (``report_done``), with what it does to a single running job
    of that attempt on that worker (``FencedReport``: a store may settle that case in one
    statement, deciding by ``report_done`` only where the statement matched no row)."""
    return FencedReport(
        decide=partial(report_done, worker_id=worker_id, attempt=attempt, now=now),
        worker_id=worker_id,
        attempt=attempt,
        from_status=Status.RUNNING.value,
        fields=done_fields(now),
        at=now,
        reason_code=COMPLETED.code,
        reason_message=COMPLETED.message,
        outcome=Reported,
    )


def report_failure(
    job: Job,
    gang: Sequence[Job],
    worker_id: str,
    attempt: int,
    now: float,
    exit_code: int | None,
    error: str | None,
    output_tail: str | None,
    release: bool = False,
    failure_code: str | None = None,
) -> Plan[Reported]:
    """The attempt ended badly: running -> pending (retry) or failed; a gang task drains its gang.

    ``failure_code``: the worker's ``reason``, the job's reason code when given; a code of
    ``NOT_RETRIED`` (the host cannot run it as asked: no account, no workdir, its walltime) fails a
    single job at once, whatever attempts it has left.

    1. A job that was being stopped (preempting) ends as the stop intended (``finish_stop``).
    2. ``release`` (the worker gave the job back for its own reasons: a shutdown) re-queues it with
       the attempt refunded; a gang task so released drains its gang, refunded too.
    3. A gang task that failed drains its gang (``corral.core.drain``): the retry decision is the
       drain completion's.
    4. A single job is retried while its counted attempts are under ``max_retries``, else failed.
    """
    check_fence(job, worker_id, attempt)
    if job.status == Status.PREEMPTING:
        report = {"exit_code": exit_code, "error": error, "output_tail": output_tail}
        return finish_stop(job, gang, now, "job exited while being stopped", report)
    if job.status != Status.RUNNING:
        raise _not_running(job)
    outcome = "exited" if exit_code is None else f"exited with code {exit_code}"
    detail: dict[str, object] = {"exit_code": exit_code, "error": error, "output_tail": output_tail}
    if release:
        detail["refunds"] = job.refunds + 1
    if job.gang_id is not None:
        why = "was handed back by its worker" if release else outcome
        if failure_code is not None:
            why = f"{why} ({failure_code})"
        # a failure another attempt would meet again is the trigger's reason code: the drain's
        # completion fails the gang on it (``drain.complete``)
        code = failure_code if failure_code in NOT_RETRIED and not release else "task_failed"
        reason = Reason(code, f"task {job.gang_index} {why}; draining the gang")
        return _drain_and_complete(job, gang, now, reason, detail)
    if release:
        reason = Reason("released", f"worker {worker_id} handed the job back ({error or outcome}); re-queued")
        return _single(move(job, now, reason, status=Status.PENDING, **detail, **REQUEUED))
    # API.md's words: counted attempts against max_retries (0 and 1 both allow one), and the run
    # number the events, the claim and CORRAL_ATTEMPT carry (it also counts refunded runs)
    allowed = max(1, job.spec.max_retries)
    counted = f"counted attempt {job.attempts_used} of {allowed} (run {job.attempts}) {outcome}"
    if failure_code is not None:
        counted = f"{counted} ({failure_code}{': ' + error if error else ''})"
    if job.retries_left and failure_code not in NOT_RETRIED:
        transition = move(
            job,
            now,
            Reason(failure_code or "retrying", f"{counted}; re-queued"),
            status=Status.PENDING,
            **detail,
            **REQUEUED,
        )
    else:
        transition = move(
            job,
            now,
            Reason(failure_code or "failed", counted),
            status=Status.FAILED,
            **detail,
            finished_at=now,
        )
    return _single(transition)


def report_trip(
    job: Job,
    gang: Sequence[Job],
    worker_id: str,
    attempt: int,
    now: float,
    kind: str,
    detail: str,
    max_retries: int,
) -> Plan[Reported]:
    """A worker's watchdog stopped the job (seed 004): re-queued at the front of its queue with
    ``watchdog_retries`` + 1 while under ``max_retries``, else failed.

    The trip spends the watchdog cap alone, never one of the job's ``max_retries`` (its attempt is
    refunded), for a single job and a gang rank alike. A rank's trip under the cap drains the gang,
    which the completion puts back at the front of its queue; past the cap the rank fails and the
    drain completes the gang as failed. A job that was being stopped anyway ends as that stop
    intended; a retried report of a trip already applied is refused.
    """
    check_fence(job, worker_id, attempt)
    if job.status == Status.PREEMPTING:
        error = f"{kind} watchdog: {detail}"
        return finish_stop(job, gang, now, f"{kind} watchdog stopped it: {detail}", {"error": error})
    if job.status != Status.RUNNING:
        raise _not_running(job)
    trip = f"{kind} watchdog tripped ({job.watchdog_retries + 1} of {max_retries + 1})"
    error = f"{kind} watchdog: {detail}"
    code = f"watchdog_{kind}"
    under_cap = job.watchdog_retries < max_retries
    if under_cap and job.gang_id is not None:
        fields = {"watchdog_retries": job.watchdog_retries + 1, "error": error, "refunds": job.refunds + 1}
        return _drain_and_complete(
            job, gang, now, Reason(code, f"{trip}; draining the gang: {detail}"), fields
        )
    if under_cap:
        transition = move(
            job,
            now,
            Reason(code, f"{trip}; re-queued at the front: {detail}"),
            status=Status.PENDING,
            **REQUEUED,
            queue_front=True,
            watchdog_retries=job.watchdog_retries + 1,
            refunds=job.refunds + 1,
            error=error,
        )
        return Plan((transition,), Reported(transition.after, trip_outcome="requeued"))
    # Past the cap: the job fails; a rank's gang drains, and its completion fails the gang.
    stamp = {"drain_started_at": now} if job.gang_id is not None else {}
    failed = move(
        job,
        now,
        Reason(code, f"{trip}; out of watchdog retries: {detail}"),
        status=Status.FAILED,
        finished_at=now,
        error=error,
        **stamp,
    )
    if job.gang_id is None:
        return Plan((failed,), Reported(failed.after, trip_outcome="failed"))
    drained, started = drain.start_drain(
        applied(gang, (failed,)), job.id, now, Reason("gang_drain", f"task {job.gang_index} failed: {error}")
    )
    # A drain with nothing left to stop (every peer had ended) is no drain to tell of.
    reported = Reported(failed.after, drain=started if drained else None, trip_outcome="failed")
    return _then_complete((failed, *drained), gang, now, reported)


def acknowledge_stop(
    job: Job, gang: Sequence[Job], worker_id: str, attempt: int, epoch: int, now: float
) -> Plan[Reported]:
    """The worker stopped a preempting job at ``epoch``: preempting -> preempted (or cancelled)."""
    check_stop_epoch(job, worker_id, attempt, epoch)
    return finish_stop(job, gang, now, f"stopped by worker {worker_id}")


def check_stop_epoch(job: Job, worker_id: str, attempt: int, epoch: int) -> None:
    """The precondition of a stopping worker's ack and epoch checkpoint: its attempt, preempting, at
    the current epoch (a late ack of an earlier round is refused, seed 000)."""
    check_fence(job, worker_id, attempt)
    if job.status != Status.PREEMPTING:
        raise errors.NotPreempting(f"job {job.id} is {job.status}, not preempting")
    if job.preemption_epoch != epoch:
        raise errors.StaleEpoch(f"job {job.id} is at preemption epoch {job.preemption_epoch}, not {epoch}")


#: how many past checkpoint phases a job remembers (their median is its expected checkpoint time)
CHECKPOINT_HISTORY = 10


@dataclass(frozen=True, slots=True)
class CheckpointAccepted:
    """A stored checkpoint: the job as it is now, and how long the checkpoint phase it ended took
    (None when it ended none)."""

    job: Job
    phase_seconds: float | None = None


def accept_checkpoint(
    job: Job, gang: Sequence[Job], worker_id: str, attempt: int, epoch: int | None, now: float
) -> Plan[CheckpointAccepted]:
    """Whether a checkpoint upload may be stored, and the job marked as having one (``gang`` is not
    read: a checkpoint is one rank's own).

    With ``epoch``: from a stop the server asked for, at that epoch. Without: from the current
    attempt however it is ending (a crash, a rank dying on its own when its peer did, done), so
    only until that attempt's final report: while the job is still running or preempting.
    """
    if epoch is not None:
        check_stop_epoch(job, worker_id, attempt, epoch)
    else:
        check_fence(job, worker_id, attempt)
        if job.status not in (Status.RUNNING, Status.PREEMPTING):
            raise _not_running(job)
    if job.checkpoint_deadline is not None:
        # The checkpoint phase of a preemption ends here: the stop begins (its force-drain timer
        # with it), and how long it took from the hint (the worker told, ``heartbeat_action``)
        # goes into the job's expected checkpoint time. A checkpoint that came before any hint
        # (the job saved on its own) tells nothing of how long the job takes when asked.
        hinted = job.checkpoint_requested_at
        took = None if hinted is None else max(0.0, now - hinted)
        durations = job.checkpoint_durations if took is None else (*job.checkpoint_durations, took)
        transition = move(
            job,
            now,
            None,
            has_checkpoint=True,
            checkpoint_deadline=None,
            checkpoint_durations=durations[-CHECKPOINT_HISTORY:],
            last_checkpoint_at=now,
            drain_started_at=now,
        )
        return Plan((transition,), CheckpointAccepted(transition.after, took))
    if job.has_checkpoint:
        return Plan((), CheckpointAccepted(job))
    transition = move(job, now, None, has_checkpoint=True)
    return Plan((transition,), CheckpointAccepted(transition.after))


def stale_single_reservation(
    job: Job, gang: Sequence[Job], now: float, timeout_s: float, epoch: int | None = None
) -> Plan[Job | None]:
    """A single job reserved by a preemption (its victims have left by ``victims_deadline``) and not
    claimed ``timeout_s`` after that: back to ``pending`` (``drain.is_stale``, the gangs' rule).
    None when it was claimed or cancelled meanwhile, or reserved again under another epoch than
    the ``epoch`` the decision read (``drain.reserved_under``)."""
    if job.gang_id is not None or not drain.reserved_under(job, epoch):
        return Plan((), None)
    if not drain.is_stale(job, now, timeout_s):
        return Plan((), None)
    transition = move(
        job,
        now,
        Reason(
            "reservation_expired", f"reserved on worker {job.worker_id} and not claimed in time; re-queued"
        ),
        status=Status.PENDING,
        **REQUEUED,
        reserved_at=None,
        victims_deadline=None,
    )
    return Plan((transition,), transition.after)


def note_waiting(job: Job, gang: Sequence[Job], reason: Reason, now: float) -> Plan[None]:
    """Why a pending single job was not placed by the cycle (a preemptor with no victim set), for
    ``corral why``: no status change, so no event row; nothing when it says so already."""
    if job.status != Status.PENDING or job.reason == reason:
        return Plan((), None)
    return Plan((move(job, now, None, reason=reason),), None)


# --- stops -------------------------------------------------------------------------------------


def finish_stop(
    job: Job, gang: Sequence[Job], now: float, how: str, report: Mapping[str, object] | None = None
) -> Plan[Reported]:
    """preempting -> cancelled (a cancel asked for the stop) or preempted, keeping what the worker
    reported of the end (``report``: exit code, error, output tail); for a gang task, the drain
    completes at once when this was its last rank in flight; a preempted single victim of the
    planner goes back to the queue at once (``_requeue_victim``). A victim that stopped during its
    checkpoint phase failed to checkpoint (counted)."""
    fields = dict(report or {})
    failed_checkpoint = job.checkpoint_deadline is not None
    if failed_checkpoint:
        fields.update(checkpoint_deadline=None, checkpoint_failures=job.checkpoint_failures + 1)
    if job.cancel_requested:
        transition = move(
            job,
            now,
            Reason("cancelled", f"cancelled; {how}"),
            job.preemption_epoch,
            status=Status.CANCELLED,
            finished_at=now,
            **fields,
        )
    else:
        transition = move(
            job, now, Reason("preempted", how), job.preemption_epoch, status=Status.PREEMPTED, **fields
        )
    preempted = transition.after.status == Status.PREEMPTED
    reported = Reported(transition.after, preempted=preempted, failed_checkpoint=failed_checkpoint)
    if preempted and job.gang_id is None and job.preempted_for is not None:
        requeued = _requeue_victim(transition.after, now)
        return Plan((transition, requeued), replace(reported, job=requeued.after, requeued=True))
    return _then_complete((transition,), gang, now, reported)


def _requeue_victim(job: Job, now: float) -> Transition:
    """A preempted single job goes back to the queue (seed 003): its submission time kept, the
    preemption counted, its checkpoint handed to the next attempt (its attempt was refunded when it
    was told to stop: a preemption never spends a retry)."""
    resume = "resuming from its checkpoint" if job.has_checkpoint else "starting over (no checkpoint)"
    return move(
        job,
        now,
        Reason("preempted_requeued", f"preempted for {job.preempted_for}; re-queued, {resume}"),
        job.preemption_epoch,
        status=Status.PENDING,
        **REQUEUED,
        **VICTIM_CLEARED,
        drain_started_at=None,
        preempted_count=job.preempted_count + 1,
    )


def force_drain(
    job: Job, gang: Sequence[Job], now: float, timeout_s: float, epoch: int
) -> Plan[Reported | None]:
    """A stop nobody acknowledged within ``timeout_s`` (its worker died mid-drain) ends anyway, so
    that it stops holding the gang's drain open. None when the job moved on meanwhile (acked, or a
    newer stop at another epoch)."""
    if job.status != Status.PREEMPTING or job.preemption_epoch != epoch:
        return Plan((), None)
    # A checkpoint phase under way is never cut short: the stop's timer starts when it ends.
    began = job.checkpoint_deadline if job.checkpoint_deadline is not None else job.drain_started_at
    if began is None or began >= now - timeout_s:
        return Plan((), None)
    plan = finish_stop(job, gang, now, f"force-drained after {timeout_s:.0f}s without an ack")
    return Plan(plan.transitions, plan.outcome)


# --- the reaper and the worker's own report ----------------------------------------------------------


def lease_expired(
    job: Job, gang: Sequence[Job], now: float, timeout_s: float, hearing: Hearing = ALWAYS
) -> Plan[Reported | None]:
    """A running job without a heartbeat for ``timeout_s`` (its worker died or lost the network):
    a single job is retried while attempts remain, else failed; a gang task drains its gang, with
    every peer whose lease lapsed too treated as gone. None when the lease is fresh after all.

    The silence counts only from when the server could hear the job's worker (``core.hearing``):
    while a server was down, or its store could take no write, no heartbeat could land, though the
    workers held on (and are retrying their reports). So for a lease after a start or after the
    store's recovery nothing lapses; a worker that is really gone is reaped one lease later than
    otherwise. (A worker retries a final report at most ``worker.reporting.OUTCOME_MAX_BACKOFF_S``
    apart, well within any lease.)"""
    if job.status != Status.RUNNING:
        return Plan((), None)
    cutoff = silence_cutoff(now, timeout_s, hearing)
    last_contact = job.last_heartbeat_at or job.started_at or now
    if cutoff is None or last_contact >= cutoff:
        return Plan((), None)
    silent = f"no heartbeat from worker {job.worker_id} for {now - last_contact:.0f}s"
    return _lost(job, gang, now, silent, expired_before=cutoff)


def gone_from_worker(
    job: Job, gang: Sequence[Job], worker_id: str, silent_since: float, now: float
) -> Plan[Reported | None]:
    """The job's worker says it no longer runs the job (its heartbeat's ``running`` list leaves it
    out, seed 004's busy ghost: a worker restarted under the same id, a run it lost track of), and
    the job has not heartbeated since ``silent_since``: it is gone now, not when its lease lapses.

    A running job is lost as if its lease had expired; a preempting one has stopped. None when the
    job moved on meanwhile (reported, re-claimed, or heartbeated after all).
    """
    if job.worker_id != worker_id or job.status not in (Status.RUNNING, Status.PREEMPTING):
        return Plan((), None)
    if (job.last_heartbeat_at or job.started_at or now) >= silent_since:
        return Plan((), None)
    if job.status == Status.PREEMPTING:
        plan = finish_stop(job, gang, now, f"worker {worker_id} no longer runs it")
        return Plan(plan.transitions, plan.outcome)
    return _lost(job, gang, now, f"worker {worker_id} no longer runs it (its heartbeat does not list it)")


def _lost(
    job: Job, gang: Sequence[Job], now: float, what: str, expired_before: float | None = None
) -> Plan[Reported | None]:
    if job.gang_id is not None:
        plan = _drain_and_complete(job, gang, now, Reason("lease_expired", what), {}, expired_before)
        return Plan(plan.transitions, plan.outcome)
    if job.retries_left:
        transition = move(
            job, now, Reason("lease_expired", f"{what}; re-queued"), status=Status.PENDING, **REQUEUED
        )
    else:
        transition = move(
            job,
            now,
            Reason("lease_expired", f"{what}; out of retries"),
            status=Status.FAILED,
            finished_at=now,
        )
    return Plan((transition,), Reported(transition.after))


# --- cancel ------------------------------------------------------------------------------------


def cancel(job: Job, gang: Sequence[Job], now: float) -> Plan[tuple[Job, ...]]:
    """Cancel a job, or every task of its gang. Jobs that are not running are cancelled at once;
    running jobs go to ``preempting`` with ``cancel_requested`` (their next heartbeat tells the
    worker to stop them; the ack makes them ``cancelled``); a job already being stopped ends as a
    cancel instead. 409 ``already_terminal`` when there is nothing left to cancel. The outcome: the
    jobs that changed, the one asked for first."""
    targets = tuple(gang) if job.gang_id is not None else (job,)
    if all(target.status in TERMINAL for target in targets):
        raise errors.AlreadyTerminal(f"job {job.id} is already {job.status}")
    transitions = []
    for target in targets:
        if target.status in TERMINAL or (target.status == Status.PREEMPTING and target.cancel_requested):
            continue
        if target.status == Status.RUNNING:
            epoch = target.preemption_epoch + 1
            transitions.append(
                move(
                    target,
                    now,
                    Reason("cancel_requested", "cancel requested; stopping the job"),
                    epoch,
                    status=Status.PREEMPTING,
                    preemption_epoch=epoch,
                    drain_started_at=now,
                    cancel_requested=True,
                )
            )
        elif target.status == Status.PREEMPTING:
            transitions.append(move(target, now, None, cancel_requested=True))
        else:
            transitions.append(
                move(
                    target,
                    now,
                    Reason("cancelled", "cancelled by request"),
                    status=Status.CANCELLED,
                    finished_at=now,
                )
            )
    changed = [transition.after for transition in transitions]
    ordered = [target for target in changed if target.id == job.id] + [
        target for target in changed if target.id != job.id
    ]
    return Plan(tuple(transitions), tuple(ordered))


# --- shared steps -------------------------------------------------------------------------------


def _single(transition: Transition) -> Plan[Reported]:
    return Plan((transition,), Reported(transition.after))


def _drain_and_complete(
    trigger: Job,
    gang: Sequence[Job],
    now: float,
    reason: Reason,
    trigger_fields: dict[str, object],
    expired_before: float | None = None,
) -> Plan[Reported]:
    transitions, started = drain.start_drain(gang, trigger.id, now, reason, trigger_fields, expired_before)
    return _then_complete(transitions, gang, now, Reported(started.trigger, drain=started))


def _then_complete(
    transitions: tuple[Transition, ...], gang: Sequence[Job], now: float, reported: Reported
) -> Plan[Reported]:
    """``transitions``, then, for a gang task, the drain completion they make possible, in the same
    plan: a drain ends as soon as its last rank has stopped, not at the next reaper pass."""
    if reported.job.gang_id is None or not gang:
        return Plan(transitions, reported)
    after = applied(gang, transitions)
    completion = drain.complete(after, now)
    if completion is None:
        return Plan(transitions, reported)
    job = next(
        (moved.after for moved in completion.transitions if moved.after.id == reported.job.id), reported.job
    )
    return Plan(
        transitions + completion.transitions, replace(reported, job=job, completion=completion.outcome)
    )
