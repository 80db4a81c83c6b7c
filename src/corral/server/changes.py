"""The server's state changes: each one a decision of ``corral.core`` applied through the store.

Routes and loops call these, then turn the typed outcome into metrics and log lines; the contract
tests call them too, so the store and the core are tested together the way the server uses them.
Nothing here decides a job's next status: it picks the core function, binds what the request or
the clock says, and hands it to the store, which locks the rows, calls it and applies its plan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from corral.core import drain, lifecycle
from corral.core.claim import Claim
from corral.core.drain import DrainCompleted, DrainStarted
from corral.core.hearing import ALWAYS, Hearing, silence_cutoff
from corral.core.lifecycle import CheckpointAccepted, HeartbeatAction, Reported
from corral.core.preemption import Preemption, PreemptionStarted, start_preemption
from corral.core.workers import flagged_dead, goes_offline
from corral.domain import errors
from corral.domain.records import Allocation, Job, Reason, Worker, WorkerContact
from corral.domain.transitions import Plan
from corral.store.base import (
    ClaimAsk,
    JobDecision,
    JobReport,
    LeaseRenewed,
    LogAppended,
    Stamp,
    WorkerBeat,
    stamp_of,
)
from corral.store.ports import Claims, Gangs, Jobs, Logs, Store, Workers

#: the claim's policy where no pool is stored (a gang's reservation reads only its capacity rules)
PLACEMENT = Claim()


def report_done(store: Jobs, job_id: str, worker_id: str, attempt: int, now: float) -> Reported:
    return store.change(job_id, done_decision(worker_id, attempt, now))


def done_decision(worker_id: str, attempt: int, now: float) -> JobDecision[Reported]:
    """The decision of a ``done`` report (for ``store.jobs.change``, or a group of reports):
    ``lifecycle.done_report``, which a store may settle in one statement."""
    return lifecycle.done_report(worker_id, attempt, now)


def report_failure(
    store: Jobs,
    job_id: str,
    worker_id: str,
    attempt: int,
    now: float,
    exit_code: int | None,
    error: str | None = None,
    output_tail: str | None = None,
    release: bool = False,
    reason: str | None = None,
) -> Reported:
    return store.change(
        job_id, failure_decision(worker_id, attempt, now, exit_code, error, output_tail, release, reason)
    )


def failure_decision(
    worker_id: str,
    attempt: int,
    now: float,
    exit_code: int | None,
    error: str | None = None,
    output_tail: str | None = None,
    release: bool = False,
    reason: str | None = None,
) -> JobDecision[Reported]:
    """The decision of a ``fail`` report (for ``store.jobs.change``, or a group of reports)."""
    return partial(
        lifecycle.report_failure,
        worker_id=worker_id,
        attempt=attempt,
        now=now,
        exit_code=exit_code,
        error=error,
        output_tail=output_tail,
        release=release,
        failure_code=reason,
    )


def report_trip(
    store: Jobs,
    job_id: str,
    worker_id: str,
    attempt: int,
    now: float,
    kind: str,
    detail: str,
    max_retries: int,
) -> Reported:
    decide = partial(
        lifecycle.report_trip,
        worker_id=worker_id,
        attempt=attempt,
        now=now,
        kind=kind,
        detail=detail,
        max_retries=max_retries,
    )
    return store.change(job_id, decide)


def acknowledge_stop(
    store: Jobs, job_id: str, worker_id: str, attempt: int, epoch: int, now: float
) -> Reported:
    decide = partial(lifecycle.acknowledge_stop, worker_id=worker_id, attempt=attempt, epoch=epoch, now=now)
    return store.change(job_id, decide)


def heartbeat(
    store: Jobs,
    job_id: str,
    worker_id: str,
    attempt: int,
    now: float,
    report: JobReport,
    defer_s: float | None = None,
    checkpoint_timeout_s: float = 600.0,
    max_deferral_s: float = 300.0,
) -> HeartbeatAction:
    """Renew the lease (one statement), then say what the worker must do. Refused (409) when the
    attempt no longer holds the job. Only a checkpoint phase that moves (a deferral, its extension,
    its end) writes again, decided once more on the locked row."""
    job = store.heartbeat_job(job_id, worker_id, attempt, now, report)
    return _heartbeat_answer(
        store, job, worker_id, attempt, now, defer_s, checkpoint_timeout_s, max_deferral_s
    )


def _heartbeat_answer(
    store: Jobs,
    job: Job,
    worker_id: str,
    attempt: int,
    now: float,
    defer_s: float | None,
    checkpoint_timeout_s: float,
    max_deferral_s: float,
) -> HeartbeatAction:
    lifecycle.check_heartbeat(job, worker_id, attempt)
    phase = partial(
        lifecycle.heartbeat_action,
        now=now,
        defer_s=defer_s,
        checkpoint_timeout_s=checkpoint_timeout_s,
        max_deferral_s=max_deferral_s,
    )
    first = phase(job)
    if not first.transitions:
        return first.outcome

    def decide(locked: Job, gang: tuple[Job, ...]) -> Plan[HeartbeatAction]:
        lifecycle.check_heartbeat(locked, worker_id, attempt)
        return phase(locked)

    return store.change(job.id, decide)


@dataclass(frozen=True)
class JobBeat:
    """One job's heartbeat carried by its worker's."""

    job_id: str
    attempt: int
    report: JobReport
    defer_s: float | None = None


def heartbeat_jobs(
    store: Jobs,
    worker_id: str,
    now: float,
    beats: Sequence[JobBeat],
    checkpoint_timeout_s: float = 600.0,
    max_deferral_s: float = 300.0,
) -> dict[str, HeartbeatAction | errors.CorralError | None]:
    """Renew every lease of the batch in one transaction, then answer each job as its own
    ``heartbeat`` would: the action, or the refusal (``Conflict`` / ``NotFound``) for that job alone.
    None for a lease renewed on a running job: nothing to do, which is what its own heartbeat would
    answer too (the store did not read its row back to say so). A checkpoint phase that moves is
    decided again on its locked row, as there."""
    renewed = store.heartbeat_jobs(worker_id, now, leases(beats))
    return beat_answers(store, worker_id, now, beats, renewed, checkpoint_timeout_s, max_deferral_s)


def leases(beats: Sequence[JobBeat]) -> list[tuple[str, int, JobReport]]:
    """The beats as the store renews them."""
    return [(beat.job_id, beat.attempt, beat.report) for beat in beats]


def beat_answers(
    store: Jobs,
    worker_id: str,
    now: float,
    beats: Sequence[JobBeat],
    renewed: Sequence[Job | LeaseRenewed | None],
    checkpoint_timeout_s: float,
    max_deferral_s: float,
) -> dict[str, HeartbeatAction | errors.CorralError | None]:
    """``heartbeat_jobs``' answers from what the store renewed (``renewed``, in the order of
    ``beats``), by itself or with the worker's heartbeat (``worker_heartbeat``'s ``jobs``)."""
    answers: dict[str, HeartbeatAction | errors.CorralError | None] = {}
    for beat, job in zip(beats, renewed, strict=True):
        if isinstance(job, LeaseRenewed):
            answers[beat.job_id] = None
            continue
        try:
            if job is None:
                raise errors.NotFound(f"job {beat.job_id} not found")
            answers[beat.job_id] = _heartbeat_answer(
                store, job, worker_id, beat.attempt, now, beat.defer_s, checkpoint_timeout_s, max_deferral_s
            )
        except (errors.Conflict, errors.NotFound) as refused:
            answers[beat.job_id] = refused
    return answers


def save_checkpoint(
    store: Jobs, job_id: str, worker_id: str, attempt: int, epoch: int | None, data: bytes, now: float
) -> CheckpointAccepted:
    decide = partial(lifecycle.accept_checkpoint, worker_id=worker_id, attempt=attempt, epoch=epoch, now=now)
    return store.save_checkpoint(job_id, data, now, decide)


def preempt(
    store: Gangs, preemption: Preemption, jobs: Mapping[str, Job], now: Stamp, checkpoint_timeout_s: float
) -> PreemptionStarted | None:
    """Apply one decision of the preemption planner, all of it or nothing (``start_preemption``).
    ``jobs``: the snapshot's rows, to know which preemptor and victims are gangs. A clock for
    ``now`` is read under the locks, as for a claim: the preemptor's reservation is stamped after
    every release it counted on."""
    gang_ids = sorted(
        {
            job.gang_id
            for job_id in (*preemption.job_ids, *(i for victim in preemption.victims for i in victim.job_ids))
            if (job := jobs.get(job_id)) is not None and job.gang_id is not None
        }
    )
    job_ids = sorted({*preemption.job_ids, *(i for victim in preemption.victims for i in victim.job_ids)})
    rank_zero = next(
        (place.worker_id for place in preemption.placements if place.job_id == preemption.job_ids[0]), None
    )
    port_worker = rank_zero if len(preemption.job_ids) > 1 else None

    def decide(
        locked: Mapping[str, Job],
        workers: Mapping[str, tuple[Worker, Sequence[Allocation]]],
        ports_used: set[int],
    ) -> Plan[PreemptionStarted | None]:
        return start_preemption(
            preemption,
            locked,
            workers,
            ports_used,
            now=stamp_of(now),
            checkpoint_timeout_s=checkpoint_timeout_s,
        )

    return store.preempt(
        job_ids,
        gang_ids,
        sorted({place.worker_id for place in preemption.placements}),
        port_worker,
        decide,
    )


def roll_back_single(
    store: Jobs, job_id: str, now: float, timeout_s: float, epoch: int | None = None
) -> Job | None:
    """A single job's reservation (a preemptor's) unclaimed past its time: back to pending; nothing
    when it was reserved again since under another epoch than ``epoch``."""
    return store.change(
        job_id, partial(lifecycle.stale_single_reservation, now=now, timeout_s=timeout_s, epoch=epoch)
    )


def note_single_waiting(store: Jobs, job_id: str, reason: Reason, now: float) -> None:
    store.change(job_id, partial(lifecycle.note_waiting, reason=reason, now=now))


#: why-notes written per transaction by ``note_singles_waiting``
NOTES_PER_TRANSACTION = 64


def note_singles_waiting(store: Jobs, notes: Sequence[tuple[str, Reason]], now: float) -> None:
    """``note_single_waiting`` for each ``(job_id, reason)``, ``NOTES_PER_TRANSACTION`` to a
    transaction (``Jobs.change_many``): the pass after a burst of submits notes up to a thousand
    preemptors, and one transaction each kept the write lock turning over for a second. A note
    refused (its job claimed or cancelled meanwhile) is simply not written."""
    for start in range(0, len(notes), NOTES_PER_TRANSACTION):
        store.change_many(
            [
                (job_id, partial(lifecycle.note_waiting, reason=reason, now=now))
                for job_id, reason in notes[start : start + NOTES_PER_TRANSACTION]
            ]
        )


def append_log(
    store: Logs,
    job_id: str,
    worker_id: str,
    attempt: int,
    offset: int,
    data: bytes,
    now: float,
    max_bytes: int,
) -> LogAppended:
    """Append output of the current attempt at ``offset``; fenced like every report (409
    ``stale_attempt`` from another worker or attempt, and nothing written)."""
    check = partial(lifecycle.check_fence, worker_id=worker_id, attempt=attempt)
    return store.append_log(job_id, offset, data, now, max_bytes, check)


def cancel(store: Jobs, job_id: str, now: float) -> tuple[Job, ...]:
    """Cancel a job or its whole gang; the jobs that changed, the one asked for first."""
    return store.change(job_id, partial(lifecycle.cancel, now=now))


def claim(
    store: Claims, worker_id: str, now: Stamp, key: str | None = None, policy: Claim = PLACEMENT
) -> Job | None:
    """Claim for ``worker_id``; the server passes its clock, read inside the claim's transaction.
    ``key``: the claim's Idempotency-Key (``Claims.claim_many`` says what a retry gets); ``policy``:
    the claim's rule with the stored pools (``ServerState.claim_policy``)."""
    return store.claim(worker_id, now, policy, key)


def claim_many(
    store: Claims, worker_id: str, now: Stamp, limit: int, key: str | None = None, policy: Claim = PLACEMENT
) -> list[Job]:
    """Up to ``limit`` claims for ``worker_id`` in one store transaction (``claim``'s rule, each
    claim's capacity taken before the next is chosen)."""
    return store.claim_many(worker_id, now, policy, limit, key)


def claim_group(
    store: Claims, asks: Sequence[ClaimAsk], now: Stamp, policy: Claim = PLACEMENT
) -> list[list[Job]]:
    """The claims of one turn of the server's event loop, in one store transaction (``claim_many``'s
    rule for each, each seeing the ones before it)."""
    return store.claim_group(asks, now, policy)


def reserve_gang(
    store: Gangs, gang_id: str, placements: Sequence[tuple[str, str, tuple[int, ...]]], now: Stamp
) -> tuple[Job, ...] | None:
    """Reserve a gang where the admission cycle placed it, all tasks or none. A clock for ``now``
    is read inside the transaction, after the capacity check: like a claim, the reservation is
    stamped after every release it counted on."""
    where = {job_id: (worker_id, indices) for job_id, worker_id, indices in placements}
    return store.reserve_gang(
        gang_id,
        placements,
        PLACEMENT,
        lambda tasks, ports: drain.reserve(tasks, where, drain.first_free_port(ports), stamp_of(now)),
    )


def roll_back_stale(
    store: Jobs, gang_id: str, now: float, timeout_s: float, epochs: Mapping[str, int] | None = None
) -> tuple[DrainStarted | None, DrainCompleted | None, tuple[Job, ...]]:
    """A reservation unclaimed past ``timeout_s``: rolled back, or the gang drained (see
    ``drain.stale_reservation``). Nothing when it was claimed meanwhile, or reserved again under
    a newer epoch than the ``epochs`` the decision read."""
    return store.change_gang(
        gang_id, partial(drain.stale_reservation, now=now, timeout_s=timeout_s, epochs=epochs)
    )


def note_waiting(store: Jobs, gang_id: str, reason: Reason, now: float) -> None:
    store.change_gang(gang_id, partial(drain.note_waiting, reason=reason, now=now))


def complete_drain(store: Jobs, gang_id: str, now: float) -> DrainCompleted | None:
    return store.change_gang(gang_id, partial(drain.completion, now=now))


@dataclass
class WorkerHeartbeat:
    """A worker heartbeat as applied: what the store recorded, and the jobs found gone from the
    worker (its ``running`` list left them out and they stopped heartbeating: seed 004's ghosts)."""

    beat: WorkerBeat
    gone: list[Reported] = field(default_factory=list)


def worker_heartbeat(
    store: Store,
    worker_id: str,
    now: float,
    lease_s: float,
    gpu_stats: list[dict[str, object]] | None = None,
    unhealthy_gpus: Sequence[int] | None = None,
    running: Sequence[str] | None = None,
    jobs: Sequence[JobBeat] = (),
) -> WorkerHeartbeat:
    """The worker's heartbeat; ``jobs``: the leases renewed with it (``Workers.worker_heartbeat``:
    each job named once, and listed in ``running`` when that is given), answered in
    ``beat.renewed``."""
    beat = store.workers.worker_heartbeat(worker_id, now, gpu_stats, unhealthy_gpus, running, leases(jobs))
    result = WorkerHeartbeat(beat)
    cutoff = lifecycle.ghost_cutoff(beat.previous_contact, now, lease_s)
    if cutoff is None:
        return result
    for job in beat.unlisted:
        decide = partial(lifecycle.gone_from_worker, worker_id=worker_id, silent_since=cutoff, now=now)
        outcome = store.jobs.change(job.id, decide)
        if outcome is not None:
            result.gone.append(outcome)
    return result


@dataclass
class ReapReport:
    """What one reaper pass changed, for metrics and logs."""

    lost: list[Reported] = field(default_factory=list)
    force_drained: list[Reported] = field(default_factory=list)
    completions: list[DrainCompleted] = field(default_factory=list)
    offline_workers: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.lost or self.force_drained or self.completions)


#: what the liveness rules count silence from, read when asked: at the start of a pass (the
#: candidates) and again on each locked row (the decision), so that a store that failed meanwhile
#: (the pass's own write waited through the outage) reaps nothing (``core.hearing``)
HearingNow = Callable[[], Hearing]


def _always() -> Hearing:
    return ALWAYS


def reap(
    store: Store,
    now: float,
    heartbeat_timeout_s: float,
    preempt_timeout_s: float,
    worker_offline_s: float,
    hearing: HearingNow = _always,
) -> ReapReport:
    """One reaper pass; each change is its own transaction, decided again on the locked rows, so a
    pass is idempotent and two replicas reaping at once cannot double-apply.

    1. Running jobs whose lease expired (``lifecycle.lease_expired``).
    2. Stops nobody acknowledged within ``preempt_timeout_s`` (``lifecycle.force_drain``).
    3. Gangs with a drain to complete (``drain.completion``): after 2, so a gang whose last stuck
       task was just force-drained completes in the same pass.
    4. Active workers silent for ``worker_offline_s``: offline.

    1 and 4 count silence only from when the server could hear the workers (``hearing``: its
    start, the store's last recovery; nothing while the store is failing): a silence the server
    or its store caused is not the workers' fault.
    """
    report = ReapReport()

    def lease(job: Job, gang: tuple[Job, ...]) -> Plan[Reported | None]:
        return lifecycle.lease_expired(job, gang, now, heartbeat_timeout_s, hearing())

    cutoff = silence_cutoff(now, heartbeat_timeout_s, hearing())
    for job_id in [] if cutoff is None else store.jobs.expired_leases(cutoff):
        if (lost := store.jobs.change(job_id, lease)) is not None:
            report.lost.append(lost)
    for job_id, epoch in store.jobs.stuck_stops(now - preempt_timeout_s):
        stop = partial(lifecycle.force_drain, now=now, timeout_s=preempt_timeout_s, epoch=epoch)
        if (drained := store.jobs.change(job_id, stop)) is not None:
            report.force_drained.append(drained)
    for gang_id in store.jobs.gangs_to_complete():
        if (completion := complete_drain(store.jobs, gang_id, now)) is not None:
            report.completions.append(completion)
    report.offline_workers = mark_offline(store.workers, now, worker_offline_s, hearing)
    return report


def mark_offline(store: Workers, now: float, after_s: float, hearing: HearingNow = _always) -> list[str]:
    """Active workers silent for ``after_s`` go offline (``core.workers.goes_offline``), each
    decided on its locked row; the ids of those that went."""

    def decide(worker: Worker, contact: WorkerContact) -> Worker | None:
        return goes_offline(worker, contact, now=now, after_s=after_s, hearing=hearing())

    cutoff = silence_cutoff(now, after_s, hearing())
    if cutoff is None:
        return []
    return [
        worker_id
        for worker_id in store.offline_candidates(cutoff)
        if store.change_worker(worker_id, decide) is not None
    ]


def flag_dead_workers(
    store: Workers, now: float, after_s: float, hearing: HearingNow = _always
) -> list[tuple[Worker, int]]:
    """Flag workers silent for ``after_s`` that hold leased jobs (``core.workers.flagged_dead``),
    each decided on its locked row; each newly flagged worker with its count of leased jobs."""

    def decide(worker: Worker, contact: WorkerContact) -> Worker | None:
        return flagged_dead(worker, contact, now=now, after_s=after_s, hearing=hearing())

    cutoff = silence_cutoff(now, after_s, hearing())
    if cutoff is None:
        return []
    flagged = []
    for worker_id in store.dead_candidates(cutoff):
        if (changed := store.change_worker(worker_id, decide)) is not None:
            worker, contact = changed
            flagged.append((worker, contact.leased_jobs))
    return flagged
