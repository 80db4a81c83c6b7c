"""Job and Worker records as the store returns them and the core reads them.

Records are immutable values. Timestamps are floats (seconds since the epoch, UTC); the wire format
turns them into RFC 3339 at the edge.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.domain.resources import Resources
from corral.domain.status import Status
from corral.domain.wording import worded_reason


@dataclass(frozen=True, slots=True)
class Reason:
    """Why a job is where it is: a stable code for machines and a message for people."""

    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}

    def worded(self) -> str:
        """As people read it (``wording.worded_reason``): what the dashboard shows."""
        return worded_reason(self.code, self.message)


@dataclass(frozen=True, slots=True)
class Constraints:
    gpu_model: str | None = None
    labels: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {}
        if self.gpu_model is not None:
            result["gpu_model"] = self.gpu_model
        if self.labels:
            result["labels"] = dict(self.labels)
        return result


@dataclass(frozen=True, slots=True)
class Dependency:
    """One condition of a job's ``after`` (API.md "Arrays and dependencies"): the job, gang or
    array ``id`` must end as ``when`` says (``ok``: done; ``notok``: failed or cancelled; ``any``:
    ended at all) before the job may start."""

    id: str
    when: str

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "when": self.when}


@dataclass(frozen=True, slots=True)
class TopologyRequest:
    """Where a gang's ranks may sit (API.md "Topology"): inside one domain of ``level`` (one of
    ``CORRAL_TOPOLOGY_LEVELS``), either ``required`` (else it waits, reason ``topology``) or only
    preferred (placed across domains when no single one has room)."""

    level: str
    required: bool

    def to_dict(self) -> dict[str, str]:
        return {"required" if self.required else "preferred": self.level}

    @classmethod
    def from_dict(cls, value: dict[str, str]) -> TopologyRequest:
        """The inverse of ``to_dict``: ``{"required": LEVEL}`` or ``{"preferred": LEVEL}``."""
        if "required" in value:
            return cls(value["required"], True)
        return cls(value["preferred"], False)


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """An array a submit asks for: the task indices, in order, and the most tasks that may hold
    resources at once (None: no throttle). Only a submit carries it: each task is then a job of
    its own with its ``array_id`` and ``array_index``."""

    indices: tuple[int, ...]
    throttle: int | None = None


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a user asks for: everything of a job that does not change while it lives."""

    command: str
    name: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    gang_size: int = 1
    resources: Resources = field(default_factory=Resources)
    constraints: Constraints = field(default_factory=Constraints)
    pool: str = "default"
    user: str | None = None
    priority: int = 0
    preemption_class: int = 5
    checkpoint_mode: str = "none"
    max_retries: int = 3
    budget_s: float | None = None
    walltime_s: float | None = None
    stall_timeout_s: float | None = None
    #: where the job starts on its worker (an absolute path); None: a fresh per-job directory
    workdir: str | None = None
    #: what must have ended, and how, before the job may start
    after: tuple[Dependency, ...] = ()
    #: a submit of an array (``lifecycle.submitted`` makes one job per index; a task's spec has None)
    array: ArraySpec | None = None
    #: where a gang's ranks may sit (API.md "Topology"); None: anywhere, the placement's own choice
    topology: TopologyRequest | None = None


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    spec: JobSpec
    status: Status
    submitted_at: float
    gang_id: str | None = None
    gang_index: int | None = None
    attempts: int = 0
    watchdog_retries: int = 0
    preempted_count: int = 0
    queue_front: bool = False
    worker_id: str | None = None
    gpu_indices: tuple[int, ...] = ()
    reservation_epoch: int = 0
    reserved_at: float | None = None
    preemption_epoch: int = 0
    drain_started_at: float | None = None
    cancel_requested: bool = False
    started_at: float | None = None
    finished_at: float | None = None
    last_heartbeat_at: float | None = None
    exit_code: int | None = None
    error: str | None = None
    output_tail: str | None = None
    reason: Reason | None = None
    has_checkpoint: bool = False
    progress: dict[str, Any] | None = None
    #: rendezvous port on rank 0's worker, chosen when the gang is reserved (gang tasks only)
    master_port: int | None = None
    #: attempts given back (a drained gang peer's): ``attempts`` itself only grows, because it
    #: is the fence of every worker report; the retry rule counts ``attempts_used``
    refunds: int = 0
    #: how many status changes the row has seen (its event count): a change decided on one version
    #: is applied only to that version (compare-and-set), whatever else moved since
    version: int = 1
    #: the job's GPU utilisation and its process tree's memory, as its last heartbeat reported
    gpu_util_pct: float | None = None
    rss_mb: float | None = None
    #: a preemption victim: the job or gang (its id) it is being stopped for
    preempted_for: str | None = None
    #: a preemptor reserved on capacity its victims still hold: the reservation does not expire
    #: before this time (the victims' checkpoint phase and stop), and is not claimed before they left
    victims_deadline: float | None = None
    #: a victim's checkpoint phase (seed 003): when its worker was asked for the checkpoint (the
    #: hint: the first heartbeat answer of the phase; None before), and the time the server stops
    #: waiting for it (None: no phase under way); the one 50% extension, the deferrals
    checkpoint_requested_at: float | None = None
    checkpoint_deadline: float | None = None
    checkpoint_extended: bool = False
    checkpoint_deferred_s: float = 0.0
    #: how long its past checkpoint phases took, oldest first (at most ``CHECKPOINT_HISTORY``)
    checkpoint_durations: tuple[float, ...] = ()
    #: when the job last saved a checkpoint on its worker, as its heartbeats report it
    last_checkpoint_at: float | None = None
    #: checkpoint phases that ended without a checkpoint (late or failed)
    checkpoint_failures: int = 0
    #: the Idempotency-Key of the claim that started this run, if it carried one: a worker that
    #: lost the claim's answer retries with the same key and is handed this run again
    claim_key: str | None = None
    #: a task of an array: the array's id, this task's index, how many tasks the array has, and the
    #: most of them that may hold resources at once (None: no throttle)
    array_id: str | None = None
    array_index: int | None = None
    array_size: int | None = None
    array_throttle: int | None = None
    #: pending on its ``after`` conditions: no claim or admission takes it until they hold
    awaiting_dependencies: bool = False

    @property
    def attempts_used(self) -> int:
        """Attempts that count against ``max_retries``."""
        return self.attempts - self.refunds

    @property
    def retries_left(self) -> bool:
        """Seed 000's rule: a failed attempt is retried while the counted attempts are under
        ``max_retries``; 0 and 1 both mean one attempt, so a job refunded to none has one left."""
        return self.attempts_used < max(1, self.spec.max_retries)

    @property
    def deadline_at(self) -> float | None:
        """When its worker ends the current attempt for its ``walltime_s`` (a limit, enforced:
        API.md "Time limits"): its start plus the limit while it runs (``running``, or
        ``preempting`` and still holding its room); None when it has no limit or is not running."""
        walltime = self.spec.walltime_s
        if walltime is None or self.started_at is None or self.status not in _RUNS:
            return None
        return self.started_at + walltime


#: the statuses in which an attempt's process runs on its worker
_RUNS = frozenset({Status.RUNNING, Status.PREEMPTING})


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU of a worker as its last heartbeat read it (NVML): utilisation and memory in use."""

    index: int
    util_pct: float | None = None
    mem_used_mb: float | None = None


@dataclass(frozen=True, slots=True)
class Worker:
    id: str
    address: str
    resources: Resources
    gpu_model: str | None
    labels: dict[str, str]
    status: str
    registered_at: float
    last_heartbeat_at: float | None
    flagged_dead_at: float | None = None
    #: GPU indices the worker reported unusable: placement never hands them out
    unhealthy_gpus: tuple[int, ...] = ()
    #: what its last heartbeat read of each GPU (empty without a GPU sampler)
    gpu_stats: tuple[GpuReading, ...] = ()
    #: what it holds its jobs to (API.md ``enforcement``), as it said at its registration
    enforcement: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WorkerContact:
    """What the liveness rules read of a worker beside its own row: the jobs it holds a lease on
    and the latest heartbeat of any of them (a worker heartbeats every 15 s, each of its jobs every
    5 s, and any of them shows the worker alive)."""

    leased_jobs: int
    last_job_heartbeat_at: float | None


@dataclass(frozen=True, slots=True)
class Allocation:
    """What one job holds on a worker: the input of every capacity computation."""

    job_id: str
    worker_id: str
    resources: Resources
    gpu_indices: tuple[int, ...]
    status: Status = Status.RUNNING
    #: a reserved job's ``reservation_epoch`` as read with the allocation: the claim starts the
    #: reservation it chose, never a newer one made since (seed 001's epoch check)
    reservation_epoch: int = 0


def unregistered_gpus(worker: Worker, indices: Iterable[int]) -> list[int]:
    """The GPU indices in ``indices`` that ``worker`` did not register (it has 0 .. gpus - 1): a
    heartbeat that reads or reports them speaks of GPUs the server does not know."""
    return sorted({index for index in indices if not 0 <= index < worker.resources.gpus})


def capacity_shortfall(capacity: Resources, held: Sequence[Allocation]) -> list[str]:
    """What a worker re-registering with ``capacity`` would have too little of for the jobs it
    holds (``held``): a resource they use more of in all, or a GPU index past its new count.
    Empty: the new capacity covers them."""
    used = Resources()
    for allocation in held:
        used = used + allocation.resources
    short = capacity.shortfall(used)
    if "gpus" not in short and any(index >= capacity.gpus for a in held for index in a.gpu_indices):
        short.insert(0, "gpus")
    return short


@dataclass(frozen=True, slots=True)
class Hold:
    """Capacity kept on a worker for the gang at the head of the queue: no new job may start on it,
    except one whose declared walltime ends before ``expected_at`` (backfill). ``expected_at`` is
    None when it is unknown (some job in the way declared no walltime): then nothing backfills."""

    gang_id: str
    worker_id: str
    resources: Resources
    expected_at: float | None


@dataclass(frozen=True, slots=True)
class JobEvent:
    job_id: str
    at: float
    from_status: Status | None
    to_status: Status
    reason: Reason | None
    epoch: int | None
    worker_id: str | None
    attempt: int
