"""The discrete-event engine: corral's own core on a simulated clock.

Events sit in a heap keyed ``(time, order, seq)``. At each instant the engine (1) handles every
event due then, in a fixed order (job ends, victims' heartbeats, checkpoint uploads, stop acks,
submits), (2) lets workers claim, in worker id order, as a woken long poll would, (3) runs the
admission cycle when the instant is a tick (a multiple of ``admission_tick_s``), (4) lets workers
claim again. Every status change is a ``Plan`` of ``corral.core`` applied to the engine's records
(``_apply``): ``lifecycle.start`` for a claim (chosen by ``corral.core.claim`` exactly as the
store's claim does), ``lifecycle.report_done``, ``heartbeat_action``, ``accept_checkpoint``,
``acknowledge_stop`` for the job's side; ``admission.decide`` then ``drain.reserve``,
``drain.stale_reservation``, ``lifecycle.stale_single_reservation`` and
``preemption.start_preemption`` for the cycle's decisions, in the order the server's admission
loop applies them.

A tick on a state that has not changed since a tick that decided nothing decides nothing again
(the cycle is a pure function of the snapshot), unless time itself can change its answer: a
reservation that may go stale, a per-worker preemption backoff that has run out. Such ticks are
skipped; nothing else is. A cycle in which the preemption planner provably decides no preemption
(``corral.sim.shortcuts``) runs ``admission.decide`` without it: the decisions applied are the same
(``verify_shortcuts`` checks it), only the waiting reasons, which the engine does not read, differ.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any

from corral.core import admission, cycle, dependencies, drain, lifecycle, topology, walltime
from corral.core.admission import CycleMemo
from corral.core.claim import Claim, may_use_held_room
from corral.core.decisions import AdmissionDecisions, Reservation, Rollback, Waiting
from corral.core.ordering import queue_key
from corral.core.placement import Capacity, without_holds
from corral.core.preemption import Preemption, PreemptionSettings, start_preemption
from corral.core.snapshot import Snapshot
from corral.domain import errors
from corral.domain import pools as pool_rules
from corral.domain.arrays import parse_array
from corral.domain.pools import BorrowingView
from corral.domain.queue_order import PREEMPTOR_CANDIDATES, preemptor_floor
from corral.domain.records import (
    Allocation,
    Constraints,
    Dependency,
    Hold,
    Job,
    JobSpec,
    Reason,
    TopologyRequest,
    Worker,
)
from corral.domain.resources import ZERO, Resources
from corral.domain.status import HOLDING, TERMINAL, Status
from corral.domain.transitions import Plan, Transition
from corral.sim import shortcuts
from corral.sim.policy import Policy
from corral.sim.workload import Scenario, WorkloadJob

#: the statuses whose GPUs a run counts as busy, and as reserved (``Record.allocation``, ``reserved``)
BUSY = frozenset({Status.RUNNING, Status.PREEMPTING})
RESERVED = frozenset({Status.RESERVED})

# event kinds, in the order they are handled within one instant
END, BEAT, SAVED, STOPPED, SUBMIT, TIMEOUT = range(6)
#: a change of a waiting job's estimated start recorded (``Record.estimates``): smaller moves are
#: no news to a user, and one behind work reserved and not started yet (whose deadline counts from
#: now, ``cycle.expected_ends``) moves a tick at every tick
ESTIMATE_STEP_S = 60.0
#: what the worker reports for an attempt it ended at its walltime (``corral.worker.walltime``)
WALLTIME_ERROR = "walltime exceeded"


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a run has got, for a progress display: simulated time against the last arrival,
    workload jobs (a gang counts once) submitted and done so far, out of ``total``."""

    now: float
    horizon: float
    submitted: int
    done: int
    total: int
    #: the run is over (every event handled): the last report
    finished: bool = False


@dataclass(slots=True)
class Task:
    """The simulator's side of one job (a gang: one per task): its work, what it has saved."""

    job_id: str
    work: WorkloadJob
    #: work (seconds) kept from earlier attempts: a checkpoint it resumes from
    kept: float = 0.0
    #: work the current preemption's checkpoint phase is saving (from SIGUSR1), and once uploaded
    phase_saved: float | None = None
    uploaded: float | None = None
    first_start: float | None = None
    #: when the current attempt's work began (a gang: once every rank runs); None: not working
    working_since: float | None = None
    end: float | None = None
    preempted: int = 0


@dataclass(slots=True)
class Record:
    """What the run records for the summary and the report."""

    #: workload job id -> (submit, start of the gang/job, end)
    starts: dict[str, float] = field(default_factory=dict)
    ends: dict[str, float] = field(default_factory=dict)
    #: (time, pool, gpus delta): changes of the GPUs busy with work (running, preempting: a victim
    #: holds its GPUs until it has exited)
    allocation: list[tuple[float, str, int]] = field(default_factory=list)
    #: (time, pool, gpus delta): changes of the GPUs reserved for work not started yet (a gang's
    #: tasks, a preemptor waiting for its victims to leave: room held, not used)
    reserved: list[tuple[float, str, int]] = field(default_factory=list)
    #: (time, victim job id, pool, gpus, GPU-seconds of work lost)
    preemptions: list[tuple[float, str, str, int, float]] = field(default_factory=list)
    #: (time, kind, job id, worker id or "", reason code or ""): every status change, for the
    #: differential test
    decisions: list[tuple[float, str, str, str, str]] = field(default_factory=list)
    #: workload jobs refused at submit (a walltime above their pool's maximum), and jobs (tasks)
    #: ended at their walltime
    refused: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)
    #: workload gang id -> the workers its tasks first started on (the summary's gang spread)
    gang_workers: dict[str, list[str]] = field(default_factory=dict)
    #: workload job id -> (time, estimated start) each time a waiting gang or job's estimated start
    #: (its reservation's start, ``Hold.expected_at``) moved by ``ESTIMATE_STEP_S`` or more before
    #: it started: None when it lost its estimate (its room came to depend on work without a
    #: deadline, or fell past the depth). Arrays' tasks are left out (their ids are not workload
    #: ids).
    estimates: dict[str, list[tuple[float, float | None]]] = field(default_factory=dict)
    cycles: int = 0
    cycles_skipped: int = 0
    #: cycles run without the preemption planner (``corral.sim.shortcuts``)
    plans_skipped: int = 0
    events: int = 0


class Engine:
    """One run of a ``Scenario`` under a ``Policy``; ``run()`` returns the ``Record``."""

    def __init__(
        self,
        scenario: Scenario,
        policy: Policy,
        progress: Callable[[Progress], None] | None = None,
        record_decisions: bool = False,
        verify_shortcuts: bool = False,
    ) -> None:
        self.scenario = scenario
        self.policy = policy
        self.settings = scenario.settings
        self.topology_levels = topology.parse_levels(scenario.settings.topology_levels)
        self.progress = progress
        self.record_decisions = record_decisions
        #: run the planner even where ``corral.sim.shortcuts`` skips it, and fail on a difference
        self.verify_shortcuts = verify_shortcuts
        self.workers = tuple(sorted(scenario.cluster.workers, key=lambda worker: worker.id))
        self.worker_by_id = {worker.id: worker for worker in self.workers}
        self.pool_defaults = cycle.pool_defaults(self.settings)
        # a pool a job names without a row is added at its submit (the server creates it)
        self.pools = pool_rules.resolve(scenario.pools, self.pool_defaults)
        self.preemption_settings: PreemptionSettings | None = None
        if policy.preemption:
            self.preemption_settings = cycle.preemption_settings(self.settings)
        #: per pool, what its jobs hold and wait for as (gpus, memory_mb, cpus): the store's
        #: ``pool_usage``, kept up to date by every status change
        self.pool_held: dict[str, list[int]] = {}
        self.pool_waiting: dict[str, list[int]] = {}
        #: the pools' starvation timers (the store's ``pool_starvation``)
        self.starvation: dict[str, pool_rules.StarvationState] = {}
        self.total_gpus = scenario.cluster.gpus
        #: the claim's borrowing figures while no allocation changes (``_borrowing_view``)
        self.view: BorrowingView | None = None
        #: what each pool's jobs hold (GPUs, memory, CPUs) for the pool limits, and the claim's
        #: reading of it while no allocation changes (``_pool_held``)
        self.held_resources: dict[str, Resources] = {}
        self.held_view: dict[str, Resources] | None = None
        #: the claim's policy, reading the pools' kinds from ``pools`` as they grow
        self.claim = Claim(self.pools)
        self.now = 0.0
        self.jobs: dict[str, Job] = {}
        self.tasks: dict[str, Task] = {}
        self.gang_tasks: dict[str, tuple[str, ...]] = {}
        #: arrays: their tasks, how many of each hold resources (the %N throttle), and the jobs that
        #: wait on their ``after`` conditions (out of the queue until settled, ``_settle_dependencies``)
        self.array_tasks: dict[str, tuple[str, ...]] = {}
        self.array_holding: dict[str, int] = {}
        self.awaiting: dict[str, None] = {}  # in submit order
        self.settle_due = False
        self.settling = False
        self.waiting_gangs: set[str] = set()  # gangs with a task blocked or reserved
        self.allocations: dict[str, dict[str, Allocation]] = {worker.id: {} for worker in self.workers}
        self.holding: dict[str, Job] = {}
        self.holding_ids: list[str] = []  # ``holding``'s keys, sorted (the snapshot's order)
        #: the allocation record of each job in ``holding`` (``allocations`` by job id)
        self.allocation_of: dict[str, Allocation] = {}
        #: the jobs in ``holding`` that save checkpoints of their own (``_reported`` moves their
        #: rows on), and those that declared a walltime (``expected_ends``)
        self.periodic: set[str] = set()
        self.walltimed: set[str] = set()
        self.capacity: dict[str, Capacity] = {}
        self.holds: dict[str, list[Hold]] = {}
        #: the keys (gang or job ids) the last cycle's holds gave an estimated start
        self.estimated: set[str] = set()
        self.last_preemptive: dict[str, float] = {}
        #: when running gangs' preemption exemptions run out (``gang_preempt_exempt_s`` after a
        #: task started), soonest first, those no cycle has run since: time alone can then make a
        #: gang a victim, so the tick there is not skipped
        self.exemption_ends: list[float] = []
        self.pending: list[tuple[Any, str]] = []  # (queue key, job id), sorted
        self.queue_keys: dict[str, Any] = {}
        self.pending_added = 0  # bumped whenever a job enters the queue
        self.round_version = 0  # ``pending_added`` at the last claim round
        #: pending jobs no preemption could take back (the claim's borrowing rule may refuse them
        #: on any worker), and whether GPUs were released since the last claim round: the rule's
        #: answer then may change on workers whose own capacity did not
        self.pending_unreclaimable: dict[tuple[str, int], list[Any]] = {}  # (pool, GPUs) -> [count, a job]
        self.released_since_round = False
        self.pending_gpus: dict[int, int] = {}  # GPUs asked -> pending jobs asking for that many
        self.dirty: set[str] = set()  # workers whose capacity, holds or reservations changed
        self.worker_ids = [worker.id for worker in self.workers]
        self.roomy = [worker.id for worker in self.workers if worker.resources.gpus > 0]
        self.roomy_set = set(self.roomy)
        self.recheck: set[str] = set()  # workers whose allocations changed since the last round
        self.claimer: str | None = None  # the worker claiming now
        self.reserved_singles: set[str] = set()
        self.changed = True  # anything moved since the last cycle
        self.events: list[tuple[float, int, int, int, tuple[Any, ...]]] = []
        self.seq = 0
        self.record = Record()
        self.submitted = 0  # workload jobs submitted so far
        #: the workers' free capacity from earlier cycles: the engine keeps its job rows and
        #: allocation records until they change, so a cycle counts only the workers that changed
        self.memo: CycleMemo | None = CycleMemo()
        self.allocated_gpus = 0
        self.held_by_pool: dict[str, int] = {}
        #: the stored pools' guaranteed GPUs (the store's ``pools`` rows with a GPU guarantee)
        self.guaranteed = {
            path: settings.guarantee.gpus
            for path, settings in scenario.pools.items()
            if settings.guarantee is not None and settings.guarantee.gpus > 0
        }

    # --- the run ------------------------------------------------------------------------------

    def run(self) -> Record:
        for work in sorted(self.scenario.workload.jobs, key=lambda job: (job.submit_time, job.job_id)):
            self._schedule(work.submit_time, SUBMIT, (work,))
        tick = self.settings.admission_tick_s
        horizon = max((job.submit_time for job in self.scenario.workload.jobs), default=0.0)
        next_tick = 0.0
        while True:
            due = self.events[0][0] if self.events else math.inf
            if due == math.inf and next_tick == math.inf:
                break
            if next_tick < due:
                if due == math.inf and not self._tick_may_act(next_tick):
                    break  # nothing left that time alone could change
                self.now = next_tick
                self._cycle()
                self._claims()
                next_tick = self._next_tick(next_tick, tick)
                self._report(horizon)
                continue
            self.now = due
            while self.events and self.events[0][0] == due:
                _, _, _, kind, payload = heapq.heappop(self.events)
                self.record.events += 1
                self._handle(kind, payload)
            self._claims()
            if next_tick == due:
                self._cycle()
                self._claims()
                next_tick = self._next_tick(next_tick, tick)
            self._report(horizon)
        self._report(horizon, finished=True)
        return self.record

    def _report(self, horizon: float, finished: bool = False) -> None:
        """Tell ``progress`` how far the run has got (after each step: the callback decides how
        often to show it, by the wall clock)."""
        if self.progress is not None:
            self.progress(self._how_far(horizon, finished))

    def _how_far(self, horizon: float, finished: bool = False) -> Progress:
        total = len(self.scenario.workload.jobs)
        return Progress(self.now, horizon, self.submitted, len(self.record.ends), total, finished)

    def _next_tick(self, current: float, tick: float) -> float:
        """The next tick that may decide something: the next one, or, when a cycle then could not
        act (module docstring), the first at or after what could change that: the next event, a
        backoff running out."""
        following = current + tick
        if self._tick_may_act(following):
            return following
        wake = [self.events[0][0]] if self.events else []
        if not self._has_waiting():
            # Only an event (an arrival, an end) can give a cycle something to decide: timers
            # (starvation, backoffs, an exemption running out) wake nobody, or each would be a
            # tick visited in vain until the next event. The cycle at ``current`` has already
            # dropped the holds of the work that no longer waits.
            self._drop_exemptions_ended(current)
            return max(following, math.ceil(wake[0] / tick) * tick) if wake else math.inf
        backoff = self.settings.preemptive_backoff_s
        wake.extend(at + backoff for at in self.last_preemptive.values())
        if self.exemption_ends:
            wake.append(self.exemption_ends[0])
        if self.preemption_settings is not None and self.starvation:
            due = self._starvation_due()
            if due < math.inf:
                wake.append(due)
        if not wake:
            return math.inf
        return max(following, math.ceil(min(wake) / tick) * tick)

    def _drop_exemptions_ended(self, by: float) -> None:
        """Forget the exemptions that ran out by ``by``: a cycle then has seen them, or nothing waited."""
        while self.exemption_ends and self.exemption_ends[0] <= by:
            heapq.heappop(self.exemption_ends)

    def _has_waiting(self) -> bool:
        return bool(self.waiting_gangs or self.reserved_singles or self.pending)

    # --- events ----------------------------------------------------------------------------

    def _schedule(self, at: float, kind: int, payload: tuple[Any, ...]) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, kind, self.seq, kind, payload))

    def _handle(self, kind: int, payload: tuple[Any, ...]) -> None:
        if kind == SUBMIT:
            self._submit(payload[0])
            return
        job_id, attempt = payload[0], payload[1]
        job = self.jobs[job_id]
        if job.attempts != attempt or job.worker_id is None:
            return  # a report of an attempt that is over: the server answers 409
        gang = self._gang(job)
        try:
            if kind == END:
                if job.status in (Status.RUNNING, Status.PREEMPTING):
                    self._apply(lifecycle.report_done(job, gang, job.worker_id, attempt, self.now))
            elif kind == BEAT:
                self._victim_beat(job, attempt)
            elif kind == SAVED:
                plan = lifecycle.accept_checkpoint(job, gang, job.worker_id, attempt, payload[2], self.now)
                self._apply(plan)
                self.tasks[job_id].uploaded = self.tasks[job_id].phase_saved
            elif kind == STOPPED:
                self._stopped(job, gang, attempt, payload[2])
            elif kind == TIMEOUT and job.status == Status.RUNNING:
                # a victim already being stopped acks its stop instead (the worker's stop path)
                failed = lifecycle.report_failure(
                    job, gang, job.worker_id, attempt, self.now, None, WALLTIME_ERROR, None,
                    failure_code="walltime_exceeded",
                )  # fmt: skip
                self._apply(failed)
                self.tasks[job_id].working_since = None
                self.record.timed_out.append(job_id)
        except errors.Conflict:
            return  # refused as the server refuses it: nothing changes

    def _submit(self, work: WorkloadJob) -> None:
        if work.pool not in self.pools:
            self.pools[work.pool] = pool_rules.effective(work.pool, self.pools, self.pool_defaults)
        try:
            spec = walltime.limited(self._spec(work), self.pools[work.pool])
        except errors.InvalidRequest:
            self.record.refused.append(work.job_id)  # the server answers 400
            return
        if any(not self._known(item.id) for item in spec.after):
            self.record.refused.append(work.job_id)  # an unknown id: the server answers 400
            return
        self.submitted += 1
        ((gang_id, created),) = lifecycle.submitted([spec], self.now)
        # Deterministic ids (the server draws random ones): the workload's id, ``.<rank>`` for tasks
        # (``.<index>`` for an array's).
        if gang_id is None:
            jobs = [replace(created[0], id=work.job_id)]
        elif created[0].array_id is not None:
            jobs = [
                replace(task, id=f"{work.job_id}.{task.array_index}", array_id=work.job_id)
                for task in created
            ]
            self.array_tasks[work.job_id] = tuple(job.id for job in jobs)
        else:
            gang_id = work.job_id
            jobs = [replace(task, id=f"{work.job_id}.{task.gang_index}", gang_id=gang_id) for task in created]
            self.gang_tasks[gang_id] = tuple(job.id for job in jobs)
            self.waiting_gangs.add(gang_id)
        for job in jobs:
            self.jobs[job.id] = job
            self.tasks[job.id] = Task(job.id, work)
            self._count(job, 1)
            if job.awaiting_dependencies:
                self.awaiting[job.id] = None
                self.settle_due = True  # what it waits on may have ended already
            elif job.status == Status.PENDING:
                self._enqueue(job)
            self._note(job.status.value, job)
        self.changed = True
        self._settle_dependencies()

    def _known(self, named: str) -> bool:
        """Whether ``named`` is a job, gang or array submitted so far."""
        return named in self.jobs or named in self.gang_tasks or named in self.array_tasks

    def _statuses(self, named: str) -> tuple[Status, ...]:
        """The statuses of the tasks of the job, gang or array ``named`` (the store's
        ``task_statuses``)."""
        if named in self.jobs:
            return (self.jobs[named].status,)
        task_ids = self.gang_tasks.get(named) or self.array_tasks.get(named, ())
        return tuple(self.jobs[task_id].status for task_id in task_ids)

    def _settle_dependencies(self) -> None:
        """The server's dependency loop (``core.dependencies``), run as soon as a job ends (the
        end wakes it there): each waiting job released to the queue or cancelled, over again
        while a cancel may settle others."""
        while self.settle_due and not self.settling:
            self.settle_due = False
            self.settling = True
            try:
                for job_id in list(self.awaiting):
                    job = self.jobs[job_id]
                    statuses = {item.id: self._statuses(item.id) for item in job.spec.after}
                    found = dependencies.verdict(job.spec.after, statuses)
                    if found == dependencies.Verdict.WAITING:
                        continue
                    del self.awaiting[job_id]
                    plan = dependencies.settle(job, found, self.now)
                    self._apply(plan)
                    if found == dependencies.Verdict.SATISFIED and plan.outcome is not None:
                        self._enqueue(plan.outcome)
            finally:
                self.settling = False

    def _spec(self, work: WorkloadJob) -> JobSpec:
        return JobSpec(
            command="sim",
            name=work.job_id,
            gang_size=work.gang_size,
            resources=Resources(work.gpus, work.vram_mb, work.memory_mb, work.cpus),
            constraints=Constraints(),
            pool=work.pool,
            user=work.user,
            preemption_class=work.preemption_class,
            checkpoint_mode=work.checkpoint,
            walltime_s=work.walltime,
            after=tuple(Dependency(named, when) for when, named in work.after),
            array=parse_array(work.array) if work.array is not None else None,
            topology=(
                TopologyRequest(work.topology[1], work.topology[0] == "required")
                if work.topology is not None
                else None
            ),
        )

    def _victim_beat(self, job: Job, attempt: int) -> None:
        """A victim's heartbeat: the checkpoint phase's clock (``heartbeat_action``)."""
        if job.status != Status.PREEMPTING:
            return
        plan = lifecycle.heartbeat_action(
            job, self.now, None, self.settings.checkpoint_timeout_s, self.settings.max_deferral_s
        )
        self._apply(plan)
        answer = plan.outcome
        task = self.tasks[job.id]
        epoch = job.preemption_epoch
        if answer.action == "checkpoint":
            if task.phase_saved is None:  # SIGUSR1: the job saves where it is now, then uploads
                task.phase_saved = self._progress(job)
                self._schedule(self.now + self.settings.checkpoint_save_s, SAVED, (job.id, attempt, epoch))
            self._schedule(self.now + self.settings.heartbeat_s, BEAT, (job.id, attempt))
        elif answer.action == "preempt":
            self._schedule(self.now + self.settings.stop_s, STOPPED, (job.id, attempt, epoch))

    def _stopped(self, job: Job, gang: tuple[Job, ...], attempt: int, epoch: int) -> None:
        if job.status != Status.PREEMPTING or job.preemption_epoch != epoch:
            return
        task = self.tasks[job.id]
        progress = self._progress(job)
        kept = task.uploaded if task.uploaded is not None else self._periodic(job)
        plan = lifecycle.acknowledge_stop(job, gang, job.worker_id or "", attempt, epoch, self.now)
        self._apply(plan)
        lost = max(0.0, progress - kept)
        task.kept = kept
        task.phase_saved = task.uploaded = task.working_since = None
        task.preempted += 1
        gpus = job.spec.resources.gpus
        self.record.preemptions.append((self.now, job.id, job.spec.pool, gpus, gpus * lost))

    def _progress(self, job: Job) -> float:
        """Work done by ``job`` so far: what it resumed from plus this attempt's run time."""
        task = self.tasks[job.id]
        since = self.now if task.working_since is None else task.working_since
        return task.kept + max(0.0, self.now - since)

    def _periodic(self, job: Job) -> float:
        """Work kept by the job's own periodic checkpoints (``checkpoint_every_s``) in this attempt."""
        task = self.tasks[job.id]
        every = task.work.checkpoint_every_s
        if not every or task.working_since is None:
            return task.kept
        return task.kept + math.floor((self.now - task.working_since) / every) * every

    # --- claims ------------------------------------------------------------------------------

    def _claims(self) -> None:
        """Workers whose claim may now find something poll, in worker id order, each until it finds
        nothing (the store's ``claim``: its reserved task first, else the first fit in queue order).

        Who may find something: a worker whose capacity, holds or reservations changed (``dirty``),
        and, once a job entered the queue, every worker with a free GPU (every worker at all when
        a queued job asks for none); every such worker too once GPUs were released anywhere while a
        job no preemption could take back waits (the claim's borrowing rule reads the whole
        cluster), or while pools have limits (a pool's job that ended anywhere may let its other
        work start on any worker). A worker that found nothing finds nothing again until one of
        those changes, and once the queue is empty only the dirty workers are left to poll.
        """
        self._refresh_roomy()
        fresh = bool(self.pending) and (
            self.pending_added > self.round_version
            or (self.released_since_round and (self._protected_may_start() or bool(self.claim.limits)))
        )
        if not self.dirty and not fresh:
            return
        dirty = sorted(self.dirty)
        self.dirty.clear()
        order: Iterable[str] = dirty
        if fresh:
            others = self.worker_ids if self._smallest_pending() == 0 else list(self.roomy)
            order = heapq.merge(dirty, others)
        left = set(dirty)
        previous = None
        for worker_id in order:
            if worker_id == previous:
                continue
            previous = worker_id
            was_dirty = worker_id in left
            left.discard(worker_id)
            if not was_dirty and not self.pending:
                if not left:
                    break
                continue
            worker = self.worker_by_id[worker_id]
            self.claimer = worker_id
            while self._claim(worker):
                pass
            self.claimer = None
        self.round_version = self.pending_added
        self.released_since_round = False

    def _protected_may_start(self) -> bool:
        """Whether a pending job no preemption could take back may now start somewhere as far as
        the claim's borrowing rule goes (its answer reads the whole cluster, so GPUs released on
        one worker may let it start on another that found nothing before)."""
        if not self.pending_unreclaimable or not self.guaranteed:
            return False
        view = self._borrowing_view()
        return any(self.claim.may_borrow(job, view) for _, job in self.pending_unreclaimable.values())

    def _refresh_roomy(self) -> None:
        """Keep ``roomy`` (the workers with a free GPU, sorted) up to date for the workers whose
        allocations changed."""
        for worker_id in self.recheck:
            free = self._capacity(self.worker_by_id[worker_id]).free.gpus > 0
            if free and worker_id not in self.roomy_set:
                insort(self.roomy, worker_id)
                self.roomy_set.add(worker_id)
            elif not free and worker_id in self.roomy_set:
                del self.roomy[bisect_left(self.roomy, worker_id)]
                self.roomy_set.discard(worker_id)
        self.recheck.clear()

    def _smallest_pending(self) -> int:
        return min(gpus for gpus, count in self.pending_gpus.items() if count > 0)

    def _capacity(self, worker: Worker) -> Capacity:
        capacity = self.capacity.get(worker.id)
        if capacity is None:
            capacity = self.claim.capacity(worker, tuple(self.allocations[worker.id].values()))
            self.capacity[worker.id] = capacity
        return capacity

    def _claim(self, worker: Worker) -> bool:
        """One claim by ``worker`` (``corral.core.claim``): its reserved task, else the first pending
        job in queue order that fits and may start."""
        allocations = tuple(self.allocations[worker.id].values())
        reserved = self.claim.reserved_task(worker, allocations)
        if reserved is not None:
            job = self.jobs[reserved]
            started = self.claim.start(job, worker.id, job.gpu_indices, self.now)
            if started is not None:
                self._apply(Plan((started,), None))
                return True
        if not self.pending:
            return False
        capacity = self._capacity(worker)
        free = capacity.free
        if free.cpus < 0 or free.memory_mb < 0 or free.gpus < 0:
            return False
        holds = self.holds.get(worker.id, [])
        view = self._borrowing_view if self.guaranteed else None
        held = self._pool_held if self.claim.limits else None
        candidates = self._fitting(free, *self._beside_holds(capacity, holds))
        chosen = self.claim.choose(worker, capacity, candidates, holds, self.now, view, held)
        if chosen is None:
            return False
        job, indices = chosen
        started = self.claim.start(job, worker.id, indices, self.now)
        if started is None:
            raise AssertionError(f"pending job {job.id} could not start")
        self._apply(Plan((started,), None))
        return True

    def _borrowing_view(self) -> BorrowingView:
        """What the store's claim reads for the borrowing rule: GPUs free on the (usable) workers,
        each stored pool's guaranteed GPUs, the GPUs each pool's jobs hold. The same object until
        an allocation changes (the claim then reuses what it made of it)."""
        if self.view is None:
            held = {pool: gpus for pool, gpus in self.held_by_pool.items() if gpus}
            self.view = BorrowingView(self.total_gpus - self.allocated_gpus, self.guaranteed, held)
        return self.view

    def _runnable(self, job: Job) -> bool:
        """The claim query's ``RUNNABLE_SQL``: not a task of an array that already holds its %N
        throttle's worth of tasks (a job waiting on dependencies is not in the queue at all)."""
        throttle = job.array_throttle
        return throttle is None or self.array_holding.get(job.array_id or "", 0) < throttle

    def _pool_held(self) -> dict[str, Resources]:
        """What the store's claim reads for the pool limits: what each pool's jobs hold. The same
        object until an allocation changes (the claim then reuses its answers)."""
        if self.held_view is None:
            self.held_view = {pool: held for pool, held in self.held_resources.items() if held != ZERO}
        return self.held_view

    @staticmethod
    def _beside_holds(capacity: Capacity, holds: Sequence[Hold]) -> tuple[Resources, frozenset[str]]:
        """What a job without a walltime may use on a worker with ``holds`` (never the held room:
        ``claim.choose``), and the jobs that hold room there themselves (they may use their own)."""
        if not holds:
            return capacity.free, frozenset()
        return without_holds(capacity, holds).free, frozenset(hold.gang_id for hold in holds)

    def _fitting(self, free: Resources, beside: Resources, holders: frozenset[str]) -> Iterable[Job]:
        """Pending single jobs that fit ``free`` (the claim query's filter), in queue order; those
        without a walltime only if they fit ``beside`` the holds, as the claim's choice would
        refuse them anyway (a worker whose room is reserved reads thousands a poll otherwise)."""
        jobs = self.jobs
        for _, job_id in self.pending:
            job = jobs[job_id]
            request = job.spec.resources
            if (
                request.gpus <= free.gpus
                and request.memory_mb <= free.memory_mb
                and request.cpus <= free.cpus
                and (request.gpus == 0 or request.vram_mb <= free.vram_mb)
                and (may_use_held_room(job, holders) or beside.covers(request))
                and (job.array_throttle is None or self._runnable(job))
            ):
                yield job

    def _enqueue(self, job: Job) -> None:
        key = self.policy.queue_key(job)
        self.queue_keys[job.id] = key
        insort(self.pending, (key, job.id))
        self.pending_added += 1
        if self.claim.unreclaimable(job):
            kept = self.pending_unreclaimable.setdefault((job.spec.pool, job.spec.resources.gpus), [0, job])
            kept[0] += 1
        gpus = job.spec.resources.gpus
        self.pending_gpus[gpus] = self.pending_gpus.get(gpus, 0) + 1

    def _dequeue(self, job: Job) -> None:
        entry = (self.queue_keys.pop(job.id), job.id)
        index = bisect_left(self.pending, entry)
        if index < len(self.pending) and self.pending[index] == entry:
            del self.pending[index]
            self.pending_gpus[job.spec.resources.gpus] -= 1
            if self.claim.unreclaimable(job):
                key = (job.spec.pool, job.spec.resources.gpus)
                self.pending_unreclaimable[key][0] -= 1
                if not self.pending_unreclaimable[key][0]:
                    del self.pending_unreclaimable[key]

    # --- the admission cycle -------------------------------------------------------------------

    def _tick_may_act(self, now: float) -> bool:
        """Whether a cycle at ``now`` may decide anything (module docstring)."""
        if not self._has_waiting():
            return False
        if self.changed:
            return True
        if any(
            job.status == Status.RESERVED
            for gang_id in self.waiting_gangs
            for job in self._gang_by_id(gang_id)
        ):
            return True
        if self.reserved_singles:
            return True
        if self.preemption_settings is not None and self._starvation_due() <= now:
            return True
        if self.exemption_ends and self.exemption_ends[0] <= now:
            return True
        cutoff = now - self.settings.preemptive_backoff_s
        return any(at <= cutoff for at in self.last_preemptive.values())

    def _cycle(self) -> None:
        if not self._tick_may_act(self.now):
            self.record.cycles_skipped += 1
            if self.holds and not self._has_waiting():
                self.replace_holds(())
            return
        self.record.cycles += 1
        self.changed = False
        self._drop_exemptions_ended(self.now)  # this cycle sees those gangs as victims
        snapshot = self._snapshot()
        decisions = self._decide(snapshot)
        applied = cycle.apply_cycle(
            decisions, self, self.now, self.last_preemptive, self.settings.preemptive_backoff_s
        )
        self.last_preemptive = applied.last_preemptive
        if applied.changed:
            self.changed = True

    def _decide(self, snapshot: Snapshot) -> AdmissionDecisions:
        """``admission.decide``, without the preemption planner when it provably decides no
        preemption (``corral.sim.shortcuts``): the decisions the engine applies are the same."""
        timeout = self.settings.reservation_timeout_s
        planner = self.preemption_settings
        memo = self.memo
        depth = self.settings.backfill_depth
        levels = self.topology_levels
        if planner is None or shortcuts.planner_may_preempt(snapshot):
            return admission.decide(snapshot, timeout, planner, memo, depth, levels)
        self.record.plans_skipped += 1
        decisions = admission.decide(snapshot, timeout, None, memo, depth, levels)
        if self.verify_shortcuts:
            full = admission.decide(snapshot, timeout, planner, memo, depth, levels)
            if _applied(full) != _applied(decisions):
                raise AssertionError(f"the planner shortcut changed a decision at {self.now}")
        return decisions

    def _snapshot(self) -> Snapshot:
        """``cycle.snapshot_of`` on the engine's records (the store's ``admission_inputs``): the
        holding jobs' rows as their heartbeats left them, their allocation records, the waiting
        gangs, the possible preemptors in corral's queue order."""
        reported = self._reported
        for job_id in self.periodic:  # the others' rows are as their heartbeats left them
            reported(self.holding[job_id])
        holding = tuple(map(self.holding.__getitem__, self.holding_ids))
        planned = self.preemption_settings is not None
        floor = preemptor_floor(holding) if planned else None
        preemptors: tuple[Job, ...] = ()
        if floor is not None:
            jobs = (self.jobs[job_id] for _, job_id in self.pending if self._runnable(self.jobs[job_id]))
            preemptors = tuple(
                islice((job for job in jobs if job.spec.preemption_class >= floor), PREEMPTOR_CANDIDATES)
            )
            if self.policy.name != "corral":  # the planner reads preemptors in corral's queue order
                preemptors = tuple(sorted(preemptors, key=queue_key))
        reading = cycle.CycleReading(
            workers=self.workers,
            # the engine's own allocation records: the rows' (worker, resources, GPUs, status),
            # which change only with the status (``_changed``)
            allocations=tuple(map(self.allocation_of.__getitem__, self.holding_ids)),
            gangs=tuple((gang_id, self._gang_by_id(gang_id)) for gang_id in sorted(self.waiting_gangs)),
            holding=holding,
            preemptors=preemptors,
        )
        usage = self._pool_usage() if planned else {}
        pools = cycle.PoolsReading(self.pools, usage, self.starvation, self.pool_defaults)
        snapshot = cycle.snapshot_of(
            reading, self.now, pools, self._pending_in_pools, self.last_preemptive, fair_share=planned
        )
        if snapshot.fair is not None:
            self.starvation = dict(snapshot.fair.starvation)
        return snapshot

    def _pending_in_pools(self, paths: Sequence[str]) -> Iterable[Job]:
        """The store's ``pending_in_pools``: pending single jobs of ``paths``' subtrees, in the
        queue's order, at most ``PREEMPTOR_CANDIDATES``."""
        jobs = (self.jobs[job_id] for _, job_id in self.pending if self._runnable(self.jobs[job_id]))
        return islice(
            (job for job in jobs if any(pool_rules.is_within(job.spec.pool, path) for path in paths)),
            PREEMPTOR_CANDIDATES,
        )

    def _reported(self, job: Job) -> Job:
        """The row as the job's heartbeats have left it: its last periodic checkpoint."""
        task = self.tasks[job.id]
        every, since = task.work.checkpoint_every_s, task.working_since
        if not every or since is None or job.status != Status.RUNNING:
            return job
        at = since + math.floor((self.now - since) / every) * every
        if at <= since or at == job.last_checkpoint_at:
            return job
        updated = replace(job, last_checkpoint_at=at)
        self.jobs[job.id] = updated
        self.holding[job.id] = updated
        return updated

    # --- the cycle's effects (``cycle.CycleEffects``) on the records ------------------------------

    def roll_back_gang(self, rollback: Rollback) -> bool:
        tasks = self._gang_by_id(rollback.gang_id)
        timeout = self.settings.reservation_timeout_s
        return self._apply(drain.stale_reservation(tasks, self.now, timeout, rollback.epoch_of()))

    def reserve_gang(self, reservation: Reservation) -> bool:
        tasks = self._gang_by_id(reservation.gang_id)
        where = {place.job_id: (place.worker_id, place.gpu_indices) for place in reservation.placements}
        rank_zero = next(place.worker_id for place in reservation.placements)
        port = drain.first_free_port(self._ports_on(rank_zero))
        return self._apply(drain.reserve(tasks, where, port, self.now))

    def roll_back_single(self, job_id: str, epoch: int | None = None) -> bool:
        timeout = self.settings.reservation_timeout_s
        job = self.jobs[job_id]
        return self._apply(lifecycle.stale_single_reservation(job, (), self.now, timeout, epoch))

    def preempt(self, preemption: Preemption) -> bool:
        """``changes.preempt``: the rows of the preemptor and the victims (whole gangs), the
        placement workers with their allocations, rank 0's ports for a gang preemptor."""
        ids = {*preemption.job_ids, *(job_id for victim in preemption.victims for job_id in victim.job_ids)}
        rows: dict[str, Job] = {}
        for job_id in sorted(ids):
            job = self.jobs[job_id]
            rows[job_id] = job
            if job.gang_id is not None:
                rows.update((task.id, task) for task in self._gang_by_id(job.gang_id))
        workers = {
            place.worker_id: (
                self.worker_by_id[place.worker_id],
                tuple(self.allocations[place.worker_id].values()),
            )
            for place in preemption.placements
        }
        rank_zero = next(
            (place.worker_id for place in preemption.placements if place.job_id == preemption.job_ids[0]),
            None,
        )
        ports = self._ports_on(rank_zero) if rank_zero is not None and len(preemption.job_ids) > 1 else set()
        plan = start_preemption(
            preemption, rows, workers, ports, self.now, self.settings.checkpoint_timeout_s
        )
        if plan.outcome is None:
            return False
        self._apply(plan)
        return True

    def note_singles_waiting(self, notes: Sequence[tuple[str, Reason]]) -> None:
        """The waiting reasons change no status: the engine does not keep them."""

    def note_gangs_waiting(self, waiting: Sequence[Waiting]) -> None:
        """The waiting reasons change no status: the engine does not keep them."""

    def _ports_on(self, worker_id: str) -> set[int]:
        return {
            job.master_port
            for job_id in self.allocations[worker_id]
            if (job := self.jobs[job_id]).master_port is not None
        }

    def replace_holds(self, holds: Sequence[Hold]) -> None:
        by_worker: dict[str, list[Hold]] = {}
        for hold in holds:
            by_worker.setdefault(hold.worker_id, []).append(hold)
        if by_worker != self.holds:
            # released or changed holds (a reservation keeps less room now): claims may fit now
            self.dirty.update(
                worker_id for worker_id, held in self.holds.items() if by_worker.get(worker_id) != held
            )
            self.holds = by_worker
        self._note_estimates(holds)

    def _note_estimates(self, holds: Sequence[Hold]) -> None:
        """Each waiting gang or job's estimated start as this cycle's holds give it
        (``Record.estimates``): a new entry when it changed, and one of None when an estimate
        went while the work still waits (it started, or was placed now: no entry)."""
        found: dict[str, float] = {}
        for hold in holds:
            if hold.expected_at is not None:
                found[hold.gang_id] = hold.expected_at  # every hold of a reservation has its start
        estimates = self.record.estimates
        for key, at in found.items():
            work_id = self._work_id(key)
            if work_id is None:
                continue
            history = estimates.setdefault(work_id, [])
            last = history[-1][1] if history else None
            if last is None or abs(at - last) >= ESTIMATE_STEP_S:
                history.append((self.now, at))
        for key in self.estimated - found.keys():
            work_id = self._work_id(key)
            if work_id is not None and self._still_waiting(key):
                history = estimates.setdefault(work_id, [])
                if history and history[-1][1] is not None:
                    history.append((self.now, None))
        self.estimated = set(found)

    def _work_id(self, key: str) -> str | None:
        """The workload job id of a gang or job id, None for an array's task (or a started job)."""
        task_id = self.gang_tasks[key][0] if key in self.gang_tasks else key
        task = self.tasks.get(task_id)
        if task is None or task.work.array is not None or task.work.job_id in self.record.starts:
            return None
        return task.work.job_id

    def _still_waiting(self, key: str) -> bool:
        """Whether the gang's tasks are all blocked, or the job pending."""
        if key in self.gang_tasks:
            return all(task.status == Status.BLOCKED for task in self._gang_by_id(key))
        return self.jobs[key].status == Status.PENDING

    # --- applying plans ---------------------------------------------------------------------------

    def _gang(self, job: Job) -> tuple[Job, ...]:
        return self._gang_by_id(job.gang_id) if job.gang_id is not None else ()

    def _gang_by_id(self, gang_id: str) -> tuple[Job, ...]:
        return tuple(self.jobs[job_id] for job_id in self.gang_tasks[gang_id])

    def _apply(self, plan: Plan[Any]) -> bool:
        """Apply a plan's transitions to the records (the store's compare-and-set: a transition
        decided on a version that is not the current one is a bug here, there is no race); keep
        the queue, the allocations and the events that follow each change. True when anything
        changed."""
        for transition in plan.transitions:
            current = self.jobs[transition.before.id]
            if current.version != transition.before.version:
                raise AssertionError(
                    f"{current.id}: transition decided on version {transition.before.version}"
                )
            self._changed(current, transition)
        if plan.transitions:
            self.changed = True
        self._settle_dependencies()
        return bool(plan.transitions)

    def _changed(self, before: Job, transition: Transition) -> None:
        after = transition.after
        self.jobs[after.id] = after
        if before.status == after.status:
            if after.id in self.holding:
                self.holding[after.id] = after
            return
        now = self.now
        self._count(before, -1)
        self._count(after, 1)
        self._note(after.status.value, after, transition.reason.code if transition.reason else "")
        if before.status == Status.PENDING and before.id in self.queue_keys:  # not one still waiting
            self._dequeue(before)
        if after.status == Status.PENDING:
            self._enqueue(after)
        if before.array_id is not None:
            held = (after.status in HOLDING) - (before.status in HOLDING)
            self.array_holding[before.array_id] = self.array_holding.get(before.array_id, 0) + held
        if after.status in TERMINAL and self.awaiting:
            self.settle_due = True
        if before.status in HOLDING and before.worker_id is not None:
            del self.allocations[before.worker_id][before.id]
            del self.allocation_of[before.id]
            self._unhold(before.id)
            self._capacity_changed(before.worker_id)
        if after.status in HOLDING and after.worker_id is not None:
            self.allocations[after.worker_id][after.id] = self.allocation_of[after.id] = Allocation(
                after.id, after.worker_id, after.spec.resources, after.gpu_indices, after.status
            )
            self._hold(after)
            self._capacity_changed(after.worker_id)
        elif after.id in self.holding:
            self._unhold(after.id)
        self._allocation_delta(before, after)
        if after.gang_id is None:
            if after.status == Status.RESERVED:
                self.reserved_singles.add(after.id)
            else:
                self.reserved_singles.discard(after.id)
        else:
            gang = self._gang_by_id(after.gang_id)
            if any(task.status in (Status.BLOCKED, Status.RESERVED) for task in gang):
                self.waiting_gangs.add(after.gang_id)
            else:
                self.waiting_gangs.discard(after.gang_id)
        task = self.tasks[after.id]
        if after.status == Status.RUNNING:
            deadline = after.deadline_at
            if deadline is not None and before.status in (Status.PENDING, Status.RESERVED):
                # its worker stops it at the deadline; the failure is reported once it has exited
                self._schedule(deadline + self.settings.stop_s, TIMEOUT, (after.id, after.attempts))
            exempt = self.settings.gang_preempt_exempt_s
            if after.gang_id is not None and exempt > 0 and self.preemption_settings is not None:
                started = after.started_at if after.started_at is not None else now
                heapq.heappush(self.exemption_ends, started + exempt)
            if task.first_start is None:
                task.first_start = now
                key = task.work.job_id
                self.record.starts[key] = max(self.record.starts.get(key, now), now)
                if after.gang_id is not None and after.worker_id is not None:
                    self.record.gang_workers.setdefault(key, []).append(after.worker_id)
            self._work_starts(after)
        elif after.status == Status.PREEMPTING:
            self._schedule(now + self.settings.heartbeat_s, BEAT, (after.id, after.attempts))
        elif after.status in (Status.DONE, Status.FAILED):
            task.end = now
            self.record.ends[task.work.job_id] = max(self.record.ends.get(task.work.job_id, now), now)

    def _count(self, job: Job, sign: int) -> None:
        """``job`` enters (1) or leaves (-1) its pool's usage (holding) or demand (waiting)."""
        if job.status in TERMINAL:
            return
        books = self.pool_held if job.status in HOLDING else self.pool_waiting
        counts = books.setdefault(job.spec.pool, [0, 0, 0])
        resources = job.spec.resources
        counts[0] += sign * resources.gpus
        counts[1] += sign * resources.memory_mb
        counts[2] += sign * resources.cpus

    def _pool_usage(self) -> dict[str, pool_rules.PoolUsage]:
        """The store's ``pool_usage``: what each pool's own jobs hold and wait for."""
        own: dict[str, pool_rules.PoolUsage] = {}
        for path in self.pool_held.keys() | self.pool_waiting.keys():
            held = self.pool_held.get(path, [0, 0, 0])
            waiting = self.pool_waiting.get(path, [0, 0, 0])
            if any(held) or any(waiting):
                own[path] = pool_rules.PoolUsage(
                    Resources(held[0], 0, held[1], held[2]), Resources(waiting[0], 0, waiting[1], waiting[2])
                )
        return own

    def _starvation_due(self) -> float:
        """When the next pool timer runs out (a pool below its fair share becomes starving, or
        aggressively starving): a cycle then changes what the planner may do."""
        due = math.inf
        for path, state in self.starvation.items():
            if state.below_since is None:
                continue
            pool = self.pools.get(path) or pool_rules.effective(path, self.pools, self.pool_defaults)
            if state.status == pool_rules.Starvation.NON_STARVING:
                due = min(due, state.below_since + pool.starvation_timeout_s)
            elif pool.enable_aggressive_starvation and state.status == pool_rules.Starvation.STARVING:
                due = min(due, state.below_since + pool.aggressive_starvation_timeout_s)
        return due

    def _hold(self, job: Job) -> None:
        if job.id not in self.holding:
            insort(self.holding_ids, job.id)
            if self.tasks[job.id].work.checkpoint_every_s:
                self.periodic.add(job.id)
            if job.spec.walltime_s is not None:
                self.walltimed.add(job.id)
        self.holding[job.id] = job

    def _unhold(self, job_id: str) -> None:
        del self.holding[job_id]
        del self.holding_ids[bisect_left(self.holding_ids, job_id)]
        self.periodic.discard(job_id)
        self.walltimed.discard(job_id)

    def _work_starts(self, job: Job) -> None:
        """A single job works from its start; a gang's ranks from the start of the last of them
        (a collective waits for every peer): then each one's end is scheduled."""
        if job.gang_id is None:
            started = [job]
        else:
            started = list(self._gang_by_id(job.gang_id))
            if any(task.status != Status.RUNNING for task in started):
                return
        for task_job in started:
            task = self.tasks[task_job.id]
            task.working_since = self.now
            remaining = max(0.0, task.work.duration - task.kept)
            deadline = task_job.deadline_at
            if deadline is None or self.now + remaining <= deadline:
                self._schedule(self.now + remaining, END, (task_job.id, task_job.attempts))
            # else: its worker ends it at its deadline (``TIMEOUT``, scheduled at its claim)

    def _capacity_changed(self, worker_id: str) -> None:
        self.capacity.pop(worker_id, None)
        self.recheck.add(worker_id)
        if worker_id != self.claimer:  # a claiming worker polls on until it finds nothing anyway
            self.dirty.add(worker_id)

    def _allocation_delta(self, before: Job, after: Job) -> None:
        was, now_holds = before.status in HOLDING, after.status in HOLDING
        pool = after.spec.pool
        gpus = after.spec.resources.gpus
        if was != now_holds:
            self.view = None
            delta = gpus if now_holds else -gpus
            if delta < 0:
                self.released_since_round = True
            self.allocated_gpus += delta
            self.held_by_pool[pool] = self.held_by_pool.get(pool, 0) + delta
            self.held_view = None
            request = after.spec.resources
            sign = 1 if now_holds else -1
            before_held = self.held_resources.get(pool, ZERO)
            self.held_resources[pool] = Resources(
                before_held.gpus + sign * request.gpus,
                0,
                before_held.memory_mb + sign * request.memory_mb,
                before_held.cpus + sign * request.cpus,
            )
        for books, statuses in ((self.record.allocation, BUSY), (self.record.reserved, RESERVED)):
            before_in, after_in = before.status in statuses, after.status in statuses
            if before_in != after_in:
                books.append((self.now, pool, gpus if after_in else -gpus))

    def _note(self, kind: str, job: Job, reason: str = "") -> None:
        if self.record_decisions:
            self.record.decisions.append((self.now, kind, job.id, job.worker_id or "", reason))


def _applied(decisions: AdmissionDecisions) -> tuple[object, ...]:
    """The part of a cycle's decisions the engine applies."""
    return (
        decisions.rollbacks,
        decisions.reservations,
        decisions.holds,
        decisions.preemptions,
        decisions.single_rollbacks,
    )


def run(
    scenario: Scenario,
    policy: Policy,
    progress: Callable[[Progress], None] | None = None,
    record_decisions: bool = False,
) -> Record:
    return Engine(scenario, policy, progress, record_decisions).run()


def job_rows(record: Record) -> Mapping[str, tuple[float, float]]:
    return {key: (start, record.ends.get(key, math.nan)) for key, start in record.starts.items()}
