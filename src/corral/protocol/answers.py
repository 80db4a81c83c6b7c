"""Answer models of the wire contract (``shared/API.md``): what the server says, typed once.

The server checks its answers against these models before they leave (``corral.server.http``), the
SDK (``corral.client``) and the worker parse what they receive into them, and the OpenAPI
description is generated from them, so the three cannot drift apart. They accept fields they do not
know (``extra="allow"``): API.md allows additions, and a client older than its server must keep
working. A field that is there but has the wrong type is an error: an answer that breaks its own
schema is a defect on the server's side, and ``bad_response`` on the client's.

Item access (``job["id"]``) works beside attribute access (``job.id``), read-only, for scripts
written against the SDK when it answered plain dictionaries.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Answer(BaseModel):
    """Base of every answer: unknown fields kept, values read-only."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    def __getitem__(self, name: str) -> Any:
        if name in type(self).model_fields:
            return getattr(self, name)
        extra = self.model_extra or {}
        if name in extra:
            return extra[name]
        aliases = {field.alias: key for key, field in type(self).model_fields.items() if field.alias}
        if name in aliases:
            return getattr(self, aliases[name])
        raise KeyError(name)

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    def to_wire(self) -> dict[str, Any]:
        """The answer as JSON-ready data, as the server sent it: field names as on the wire, and
        no default filled in for a field it left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class ResourcesAnswer(Answer):
    gpus: int = 0
    vram_mb: int = 0
    memory_mb: int = 0
    cpus: int = 0


class ConstraintsAnswer(Answer):
    gpu_model: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class ReasonAnswer(Answer):
    code: str
    message: str


class AfterAnswer(Answer):
    """One ``after`` condition of a job."""

    id: str
    when: str


class JobAnswer(Answer):
    """The job object (API.md "Jobs and gangs"). Times are RFC 3339 strings in UTC."""

    id: str
    name: str | None = None
    command: str
    env: dict[str, str] = Field(default_factory=dict)
    status: Literal[
        "pending", "blocked", "reserved", "running", "preempting", "preempted", "done", "failed", "cancelled"
    ]
    gang_id: str | None = None
    gang_size: int = 1
    gang_index: int | None = None
    resources: ResourcesAnswer = Field(default_factory=ResourcesAnswer)
    constraints: ConstraintsAnswer = Field(default_factory=ConstraintsAnswer)
    pool: str = "default"
    user: str | None = None
    priority: int = 0
    preemption_class: int = 5
    checkpoint_mode: str = "none"
    max_retries: int = 3
    attempts: int = 0
    attempt: int = 0
    watchdog_retries: int = 0
    preempted_count: int = 0
    worker_id: str | None = None
    gpu_indices: list[int] = Field(default_factory=list)
    reservation_epoch: int = 0
    reserved_at: str | None = None
    preemption_epoch: int = 0
    drain_started_at: str | None = None
    submitted_at: str
    started_at: str | None = None
    finished_at: str | None = None
    last_heartbeat_at: str | None = None
    exit_code: int | None = None
    error: str | None = None
    output_tail: str | None = None
    reason: ReasonAnswer | None = None
    has_checkpoint: bool = False
    progress: dict[str, Any] | None = None
    budget_s: float | None = None
    walltime_s: float | None = None
    #: while it runs: when its worker ends the attempt for its ``walltime_s`` (start + limit)
    deadline_at: str | None = None
    #: while it waits with a reservation: when it (its gang) is planned to start, and where
    estimated_start_at: str | None = None
    planned_workers: list[str] = []
    stall_timeout_s: float | None = None
    workdir: str | None = None
    cancel_requested: bool = False
    gpu_util_pct: float | None = None
    rss_mb: float | None = None
    preempted_for: str | None = None
    checkpoint_deadline: str | None = None
    last_checkpoint_at: str | None = None
    checkpoint_failures: int = 0
    #: a task of an array: its id, index and the array's size (API.md "Arrays and dependencies")
    array_id: str | None = None
    array_index: int | None = None
    array_size: int | None = None
    #: what must end, and how, before it starts
    after: list[AfterAnswer] = Field(default_factory=list)
    #: where a gang's ranks may sit (API.md "Topology"): {"required": LEVEL} or {"preferred": LEVEL}
    topology: dict[str, str] | None = None


class GangCheckpoint(Answer):
    """A rank of the gang that has a stored checkpoint (``GET /jobs/{job_id}/checkpoint``)."""

    gang_index: int
    job_id: str


class ClaimAnswer(JobAnswer):
    """``GET /jobs/next``: the job, the attempt every report of it carries, its environment."""

    attempt: int
    env: dict[str, str] = Field(default_factory=dict)
    gang_checkpoints: list[GangCheckpoint] = Field(default_factory=list)
    #: the server's lease (``CORRAL_HEARTBEAT_TIMEOUT_S``): the worker's self-fence stops the job
    #: when it could not renew it for this long (less a margin); None from an older server
    lease_s: float | None = None


class ClaimsAnswer(Answer):
    """``GET /jobs/next?max=N``: up to N claims made together, each as the single claim answers it."""

    items: list[ClaimAnswer]


class HeartbeatAnswer(Answer):
    """``POST /jobs/{id}/heartbeat``: carry on (no action), or stop / checkpoint at the epoch."""

    action: Literal["preempt", "checkpoint"] | None = None
    preemption_epoch: int | None = None
    deadline_s: float | None = None


class GangAnswer(Answer):
    gang_id: str
    size: int
    status: str
    tasks: list[JobAnswer]


class GangSubmitted(Answer):
    """``POST /jobs`` of a gang: its id and its task ids in ``gang_index`` order."""

    gang_id: str
    tasks: list[str]


class ArraySubmitted(Answer):
    """``POST /jobs`` of an array: its id and its task ids in index order."""

    array_id: str
    tasks: list[str]


class BatchSubmitted(Answer):
    """``POST /jobs/batch``: each item a job, or a gang's or an array's id and task ids, in request
    order."""

    items: list[JobAnswer | GangSubmitted | ArraySubmitted]


class ArrayAnswer(Answer):
    """``GET /arrays/{id}``: the array, how many of its tasks are in each status, its first tasks
    by index (``limit``, default 100)."""

    array_id: str
    size: int
    throttle: int | None = None
    counts: dict[str, int]
    tasks: list[JobAnswer]


class EventAnswer(Answer):
    at: str
    from_status: str | None = Field(None, alias="from")
    to: str
    reason: ReasonAnswer | None = None
    epoch: int | None = None
    worker_id: str | None = None
    attempt: int = 0


class EventsAnswer(Answer):
    items: list[EventAnswer]


class WhyAnswer(Answer):
    status: str
    reasons: list[ReasonAnswer]


class GpuStatAnswer(Answer):
    index: int
    util_pct: float | None = None
    mem_used_mb: float | None = None


class WorkerAnswer(Answer):
    """The worker object (API.md "Workers")."""

    id: str
    address: str = ""
    resources: ResourcesAnswer = Field(default_factory=ResourcesAnswer)
    gpu_model: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    status: Literal["active", "offline", "draining"]
    last_heartbeat_at: str | None = None
    registered_at: str
    flagged_dead_at: str | None = None
    used: ResourcesAnswer = Field(default_factory=ResourcesAnswer)
    running: list[str] = Field(default_factory=list)
    unhealthy_gpus: list[int] = Field(default_factory=list)
    gpu_stats: list[GpuStatAnswer] = Field(default_factory=list)
    #: what the worker holds its jobs to (identity, memory, cpu, pids, devices, kill_tree)
    enforcement: dict[str, str] = Field(default_factory=dict)


class JobPage(Answer):
    items: list[JobAnswer]
    next: str | None = None


class WorkerPage(Answer):
    items: list[WorkerAnswer]
    next: str | None = None
    #: the server's ``CORRAL_TOPOLOGY_LEVELS``, widest first (API.md "Topology")
    topology_levels: list[str] = Field(default_factory=list)


class LimitsAnswer(Answer):
    """A pool's limits: null for a resource it does not limit."""

    gpus: int | None = None
    vram_mb: int | None = None
    memory_mb: int | None = None
    cpus: int | None = None


class PoolSettingsAnswer(Answer):
    """What ``PUT /pools/{path}`` stored for the pool: null where it inherits."""

    weight: float | None = None
    guarantee: ResourcesAnswer | None = None
    limits: LimitsAnswer | None = None
    mode: Literal["fair_share", "fifo"] | None = None
    kind: Literal["batch", "training", "service", "sensitive", "interactive"] | None = None
    starvation_timeout_s: float | None = None
    aggressive_starvation_timeout_s: float | None = None
    starvation_tolerance: float | None = None
    enable_aggressive_starvation: bool | None = None
    allow_aggressive_preemption: bool | None = None
    default_walltime_s: float | None = None
    max_walltime_s: float | None = None


class FairShareAnswer(Answer):
    """A fair share in resources: fractional, as shares of a cluster are."""

    gpus: float = 0.0
    memory_mb: float = 0.0
    cpus: float = 0.0


class PoolAnswer(Answer):
    """A pool (API.md "Pools"): its effective settings (its own, else inherited, else the
    defaults), what it stored (``settings``), and what the non-terminal jobs of its subtree hold
    (``usage``: reserved, running, preempting) and wait for (``demand``). ``explicit`` is false for
    a pool only implied by a descendant's path.

    Fair share (``corral.core.fairshare``): ``fair_share`` is what the pool is entitled to now, in
    resources (its demand's shape), ``fair_share_ratio`` the same as its dominant share of the
    cluster, ``satisfaction`` usage over fair share (null for a pool that asks for nothing);
    ``starvation`` with ``below_fair_share_since`` (the timer) and ``starvation_since`` (when the
    status began), as the admission cycle last left them."""

    path: str
    parent: str | None = None
    explicit: bool = True
    weight: float
    guarantee: ResourcesAnswer = Field(default_factory=ResourcesAnswer)
    limits: LimitsAnswer | None = None
    mode: Literal["fair_share", "fifo"]
    kind: Literal["batch", "training", "service", "sensitive", "interactive"]
    starvation_timeout_s: float
    aggressive_starvation_timeout_s: float
    starvation_tolerance: float
    enable_aggressive_starvation: bool
    allow_aggressive_preemption: bool
    #: inherited down the tree; null: no default limit, no maximum
    default_walltime_s: float | None = None
    max_walltime_s: float | None = None
    settings: PoolSettingsAnswer = Field(default_factory=PoolSettingsAnswer)
    usage: ResourcesAnswer = Field(default_factory=ResourcesAnswer)
    demand: ResourcesAnswer = Field(default_factory=ResourcesAnswer)
    jobs: int = 0
    fair_share: FairShareAnswer = Field(default_factory=FairShareAnswer)
    fair_share_ratio: float = 0.0
    satisfaction: float | None = None
    starvation: Literal["non_starving", "starving", "aggressively_starving"] = "non_starving"
    below_fair_share_since: str | None = None
    starvation_since: str | None = None


class PoolPage(Answer):
    items: list[PoolAnswer]
    next: str | None = None


class UsageWait(Answer):
    """Percentiles of how long the jobs waited for their first attempt (null: none in the window)."""

    p50: float | None = None
    p90: float | None = None


class UsageItem(Answer):
    """One group's use of the window (API.md "Usage"): ``user`` or ``pool`` null where the grouping
    leaves it out. Seconds of the attempts that held resources in the window, each clipped to it."""

    user: str | None = None
    pool: str | None = None
    gpu_seconds: float
    cpu_seconds: float
    attempts: int
    jobs: int
    wait_s: UsageWait


class UsagePage(Answer):
    since: str
    until: str
    items: list[UsageItem]


class CheckpointSaved(Answer):
    job_id: str
    bytes: int
    preemption_epoch: int | None = None
    attempt: int


class LogAppendedAnswer(Answer):
    """``POST /jobs/{id}/logs``: where the attempt's stored stream ends now (``size``, the offset of
    the next chunk), the bytes of this chunk newly stored (0 for a retry), and how many of the
    attempt's first bytes were dropped to stay under ``CORRAL_LOG_MAX_BYTES``."""

    job_id: str
    attempt: int
    size: int
    accepted: int
    dropped: int


class HealthAnswer(Answer):
    status: str
    instance_id: str
    uptime_s: float
    version: str


class EmptyAnswer(Answer):
    """``{}``: done, nothing to say."""


class StatusAnswer(Answer):
    """``/healthz`` and ``/readyz``: the process is up, the store answers."""

    status: str


class OpenApiAnswer(Answer):
    """``GET /openapi.json``: an OpenAPI 3.1 document."""

    openapi: str
    info: dict[str, Any]
    paths: dict[str, Any]


class ErrorDetail(Answer):
    code: str
    message: str


class JobBeatAnswer(HeartbeatAnswer):
    """One job of a batched worker heartbeat: its heartbeat answer, or the error its own heartbeat
    would have got (``stale_attempt``, ``not_running``, ``not_found``: the worker stops that job)."""

    error: ErrorDetail | None = None


class WorkerHeartbeatAnswer(Answer):
    """``POST /workers/{id}/heartbeat``: ``{}``; with ``jobs`` in the body, each job's answer by id."""

    jobs: dict[str, JobBeatAnswer] | None = None


class FinalReportAnswer(Answer):
    """One item of ``POST /workers/{id}/reports``: the status and answer its own route would have
    given: ``status`` 200 with the job, or the error status with the error (``stale_attempt``,
    ``not_running``, ``not_found``, ``invalid_request``, ``store_busy``...)."""

    status: int
    job: JobAnswer | None = None
    error: ErrorDetail | None = None


class FinalReportsAnswer(Answer):
    """``POST /workers/{id}/reports``: one answer per report, in the order of the reports."""

    items: list[FinalReportAnswer]


class ErrorAnswer(Answer):
    """Every error: the status code plus this envelope with a stable ``code``."""

    error: ErrorDetail
