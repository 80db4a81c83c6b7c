"""Request bodies of the wire contract (``shared/API.md``), validated at the edge.

Unknown fields are rejected: a typo such as ``"gpu": 1`` must not silently submit a CPU job.
Validation failures become 400 ``invalid_request`` naming the field (see ``describe_error``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from corral.domain import errors as domain_errors
from corral.domain import pools
from corral.domain.arrays import parse_array
from corral.domain.records import Constraints, Dependency, JobSpec, TopologyRequest
from corral.domain.resources import Resources

MAX_BATCH = 10_000
#: tasks one request may create (a batch's jobs plus every gang's tasks)
MAX_TASKS_PER_REQUEST = 10_000
INT32_MAX = 2**31 - 1
#: 9999-12-31T23:59:59Z: the latest time an answer can write
MAX_TIMESTAMP = 253402300799.0
#: the longest walltime_s (100 years): a deadline must stay a time an answer can write
MAX_WALLTIME_S = 100 * 365 * 86400.0
#: the largest GPU index a worker may report (NVML counts far fewer GPUs per host)
MAX_GPU_INDEX = 65535
GpuIndex = Annotated[int, Field(ge=0, le=MAX_GPU_INDEX)]
#: how deeply a free-form value (``progress``, a watchdog's ``detail``) may nest
MAX_JSON_DEPTH = 16
_WORKER_ID = re.compile(r"[A-Za-z0-9_.:@-]+")


def _no_nul(value: str) -> str:
    # PostgreSQL text cannot hold NUL, and no command, name or label needs one.
    if "\0" in value:
        raise ValueError("must not contain a NUL character")
    return value


def _replace_nul(value: str) -> str:
    """Output of a job may hold any byte: keep it, minus the one PostgreSQL cannot store."""
    return value.replace("\0", "\ufffd")


def _plain_json(value: Any) -> Any:
    """A free-form JSON value (a job's progress, a watchdog's detail): no NUL in a key or a
    string, as in every other string of a body, and at most ``MAX_JSON_DEPTH`` arrays and objects
    deep. The rest of a body has the depth of its schema; here a thousand-deep ``progress`` was
    taken, then failed to be stored (issue 24)."""
    _check_json(value, 1)
    return value


def _check_json(item: Any, depth: int) -> None:
    """``_plain_json`` of one value at ``depth``: its keys, then its items from the last to the
    first (the order of the explicit stack this replaced, so a value with two faults names the same
    one). Recursive: every batched heartbeat checks one ``progress`` per job, and the stack's
    tuples cost more than the calls; the depth limit stops the recursion at ``MAX_JSON_DEPTH``."""
    if isinstance(item, str):
        if "\0" in item:
            _no_nul(item)
        return
    if not isinstance(item, (dict, list)):
        return
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"must not nest arrays and objects more than {MAX_JSON_DEPTH} deep")
    if isinstance(item, dict):
        for key in item:
            if "\0" in key:
                _no_nul(key)
        item = item.values()
    for child in reversed(item):
        if isinstance(child, str):
            if "\0" in child:
                _no_nul(child)
        elif isinstance(child, (dict, list)):
            _check_json(child, depth + 1)


Text = Annotated[str, AfterValidator(_no_nul)]
Output = Annotated[str, AfterValidator(_replace_nul)]
JsonObject = Annotated[dict[str, Any], AfterValidator(_plain_json)]


class _Strict(BaseModel):
    """Unknown fields refused, and no coercion: ``"2"`` is not an integer and ``true`` not 1 (a
    ``gang_size: "2"`` once made a gang). An integer is still a number where a float is asked."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ResourcesBody(_Strict):
    gpus: int = Field(0, ge=0, le=1_000_000)
    vram_mb: int = Field(0, ge=0, le=INT32_MAX)
    memory_mb: int = Field(0, ge=0, le=INT32_MAX)
    cpus: int = Field(0, ge=0, le=1_000_000)

    def to_domain(self) -> Resources:
        return Resources(self.gpus, self.vram_mb, self.memory_mb, self.cpus)


class LimitsBody(_Strict):
    """A pool's limits: a resource left out (or null) is not limited."""

    gpus: int | None = Field(None, ge=0, le=1_000_000)
    vram_mb: int | None = Field(None, ge=0, le=INT32_MAX)
    memory_mb: int | None = Field(None, ge=0, le=INT32_MAX)
    cpus: int | None = Field(None, ge=0, le=1_000_000)

    def to_domain(self) -> Resources:
        return Resources(
            *(
                pools.UNLIMITED if value is None else value
                for value in (self.gpus, self.vram_mb, self.memory_mb, self.cpus)
            )
        )


class ConstraintsBody(_Strict):
    gpu_model: Text | None = Field(None, max_length=256)
    labels: dict[Text, Text] = Field(default_factory=dict)


class AfterBody(_Strict):
    """One ``after`` condition: the job, gang or array ``id`` must end as ``when`` says."""

    id: Text = Field(min_length=1, max_length=256)
    when: Literal["ok", "notok", "any"] = "ok"


class TopologyBody(_Strict):
    """Where a gang's ranks may sit (API.md "Topology"): exactly one of ``required`` (every rank
    inside one domain of that level, else it waits) and ``preferred``. The level must be one of
    the server's ``CORRAL_TOPOLOGY_LEVELS`` (checked by the server, which knows them)."""

    required: Text | None = Field(None, min_length=1, max_length=256)
    preferred: Text | None = Field(None, min_length=1, max_length=256)

    @model_validator(mode="after")
    def _one_of(self) -> TopologyBody:
        if (self.required is None) == (self.preferred is None):
            raise ValueError("topology takes exactly one of required and preferred")
        return self

    def to_domain(self) -> TopologyRequest:
        if self.required is not None:
            return TopologyRequest(self.required, True)
        assert self.preferred is not None
        return TopologyRequest(self.preferred, False)


class SubmitBody(_Strict):
    command: Text = Field(min_length=1, max_length=65536)
    name: Text | None = Field(None, max_length=256)
    env: dict[Text, Text] = Field(default_factory=dict)
    gang_size: int = Field(1, ge=1, le=MAX_TASKS_PER_REQUEST)
    resources: ResourcesBody = Field(default_factory=ResourcesBody)
    constraints: ConstraintsBody = Field(default_factory=ConstraintsBody)
    pool: str = "default"
    user: Text | None = Field(None, max_length=256)
    priority: int = Field(0, ge=-1_000_000, le=1_000_000)
    preemption_class: int = Field(5, ge=0, le=10)
    checkpoint: Literal["none", "auto", "manual"] = "none"
    max_retries: int = Field(3, ge=0, le=1000)
    budget_s: float | None = Field(None, gt=0)
    walltime_s: float | None = Field(None, gt=0, le=MAX_WALLTIME_S)
    stall_timeout_s: float | None = Field(None, gt=0)
    #: where the job starts on its worker: an absolute path, or null for a fresh per-job directory
    workdir: Text | None = Field(None, min_length=1, max_length=4096)
    #: an array of tasks (API.md "Arrays and dependencies"): "0-99", "0-99:4", "1,5,7", with "%N"
    array: Text | None = Field(None, min_length=1, max_length=4096)
    after: list[AfterBody] = Field(default_factory=list, max_length=1000)
    #: where a gang's ranks may sit (API.md "Topology")
    topology: TopologyBody | None = None

    @field_validator("array")
    @classmethod
    def _array_expression(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_array(value)
            except domain_errors.InvalidRequest as error:
                raise ValueError(str(error)) from None
        return value

    @model_validator(mode="after")
    def _array_not_gang(self) -> SubmitBody:
        if self.array is not None and self.gang_size > 1:
            raise ValueError("array: an array's tasks cannot be gangs (gang_size > 1)")
        return self

    @field_validator("workdir")
    @classmethod
    def _absolute_workdir(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("workdir must be an absolute path")
        return value

    @field_validator("command")
    @classmethod
    def _command_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("command must not be blank")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not key or "=" in key or "\0" in key:
                raise ValueError(f"invalid environment variable name {key!r}")
        return value

    @field_validator("pool")
    @classmethod
    def _pool_path(cls, value: str) -> str:
        return pools.check_path(value)

    def to_domain(self, user: str | None = None) -> JobSpec:
        return JobSpec(
            command=self.command,
            name=self.name,
            env=dict(self.env),
            gang_size=self.gang_size,
            resources=self.resources.to_domain(),
            constraints=Constraints(self.constraints.gpu_model, dict(self.constraints.labels)),
            pool=self.pool,
            user=self.user or user,
            priority=self.priority,
            preemption_class=self.preemption_class,
            checkpoint_mode=self.checkpoint,
            max_retries=self.max_retries,
            budget_s=self.budget_s,
            walltime_s=self.walltime_s,
            stall_timeout_s=self.stall_timeout_s,
            workdir=self.workdir,
            after=tuple(Dependency(item.id, item.when) for item in self.after),
            array=parse_array(self.array) if self.array is not None else None,
            topology=self.topology.to_domain() if self.topology is not None else None,
        )

    @property
    def tasks(self) -> int:
        """How many jobs the item creates."""
        return len(parse_array(self.array).indices) if self.array is not None else self.gang_size


class PoolBody(_Strict):
    """``PUT /pools/{path}``: the pool's settings, each optional (left out or null: inherited from
    the parent pool, or the default; see ``corral.domain.pools``). A PUT replaces every setting."""

    weight: float | None = Field(None, gt=0, le=1_000_000)
    guarantee: ResourcesBody | None = None
    limits: LimitsBody | None = None
    # enums are read from their string values (strict mode would want instances of them)
    mode: pools.PoolMode | None = Field(None, strict=False)
    kind: pools.PoolKind | None = Field(None, strict=False)
    starvation_timeout_s: float | None = Field(None, gt=0, le=365 * 86400)
    aggressive_starvation_timeout_s: float | None = Field(None, gt=0, le=365 * 86400)
    starvation_tolerance: float | None = Field(None, gt=0, le=1)
    enable_aggressive_starvation: bool | None = None
    allow_aggressive_preemption: bool | None = None
    #: the walltime_s a job of the subtree gets when it sets none, and the most a submit may ask
    default_walltime_s: float | None = Field(None, gt=0, le=MAX_WALLTIME_S)
    max_walltime_s: float | None = Field(None, gt=0, le=MAX_WALLTIME_S)

    @field_validator("max_walltime_s")
    @classmethod
    def _default_within_the_max(cls, value: float | None, info: ValidationInfo) -> float | None:
        default = info.data.get("default_walltime_s")
        if value is not None and default is not None and default > value:
            raise ValueError(f"is below default_walltime_s ({default:g})")
        return value

    @field_validator("limits")
    @classmethod
    def _limits_cover_the_guarantee(cls, value: LimitsBody | None, info: ValidationInfo) -> LimitsBody | None:
        guarantee = info.data.get("guarantee")
        if value is None or guarantee is None:
            return value
        for name in ("gpus", "vram_mb", "memory_mb", "cpus"):
            limit = getattr(value, name)
            if limit is not None and limit < getattr(guarantee, name):
                raise ValueError(f"{name} limit {limit} is below the guarantee of {getattr(guarantee, name)}")
        return value

    @field_validator("aggressive_starvation_timeout_s")
    @classmethod
    def _aggressive_after_starvation(cls, value: float | None, info: ValidationInfo) -> float | None:
        starving = info.data.get("starvation_timeout_s")
        if value is not None and starving is not None and value < starving:
            raise ValueError("must be at least starvation_timeout_s")
        return value

    def to_domain(self) -> pools.PoolSettings:
        return pools.PoolSettings(
            weight=self.weight,
            guarantee=self.guarantee.to_domain() if self.guarantee is not None else None,
            limits=self.limits.to_domain() if self.limits is not None else None,
            mode=self.mode,
            kind=self.kind,
            starvation_timeout_s=self.starvation_timeout_s,
            aggressive_starvation_timeout_s=self.aggressive_starvation_timeout_s,
            starvation_tolerance=self.starvation_tolerance,
            enable_aggressive_starvation=self.enable_aggressive_starvation,
            allow_aggressive_preemption=self.allow_aggressive_preemption,
            default_walltime_s=self.default_walltime_s,
            max_walltime_s=self.max_walltime_s,
        )


class BatchBody(_Strict):
    jobs: list[SubmitBody] = Field(min_length=1, max_length=MAX_BATCH)

    @field_validator("jobs")
    @classmethod
    def _bounded_tasks(cls, value: list[SubmitBody]) -> list[SubmitBody]:
        tasks = sum(job.tasks for job in value)
        if tasks > MAX_TASKS_PER_REQUEST:
            raise ValueError(f"creates {tasks} tasks; one request may create at most {MAX_TASKS_PER_REQUEST}")
        return value


Mechanism = Annotated[str, AfterValidator(_no_nul), Field(min_length=1, max_length=64)]


class EnforcementBody(_Strict):
    """What a worker holds its jobs to (API.md "A job is contained on its host"): each the
    mechanism in use, or ``none``."""

    identity: Mechanism = "none"
    memory: Mechanism = "none"
    cpu: Mechanism = "none"
    pids: Mechanism = "none"
    devices: Mechanism = "none"
    kill_tree: Mechanism = "none"


class WorkerRegisterBody(_Strict):
    id: str | None = Field(None, min_length=1, max_length=256)
    address: Text = Field("", max_length=1024)
    resources: ResourcesBody = Field(default_factory=ResourcesBody)
    gpu_model: Text | None = Field(None, max_length=256)
    labels: dict[Text, Text] = Field(default_factory=dict)
    enforcement: EnforcementBody | None = None

    @field_validator("id")
    @classmethod
    def _usable_in_a_path(cls, value: str | None) -> str | None:
        if value is not None and not _WORKER_ID.fullmatch(value):
            raise ValueError("worker id may hold only letters, digits and _ . : @ -")
        return value


def _no_repeats(indices: list[int]) -> None:
    seen: set[int] = set()
    repeated: set[int] = set()
    for index in indices:
        (repeated if index in seen else seen).add(index)
    if repeated:
        raise ValueError(f"GPU {', '.join(map(str, sorted(repeated)))} given more than once")


class GpuReading(_Strict):
    index: int = Field(ge=0, le=MAX_GPU_INDEX)
    util_pct: float | None = Field(None, ge=0, le=100)
    mem_used_mb: float | None = Field(None, ge=0)


class WorkerHeartbeatBody(_Strict):
    gpus: list[GpuReading] | None = Field(None, max_length=4096)
    running: list[Text] | None = None
    #: GPU indices the worker will not use again (a killed job's process would not exit from a
    #: driver call); the server places no work on them until the worker re-registers
    unhealthy_gpus: list[GpuIndex] | None = Field(None, max_length=4096)
    #: the leases and progress of the worker's running jobs, renewed in one transaction: each job
    #: is answered as its own ``POST /jobs/{id}/heartbeat`` would be (``WorkerHeartbeatAnswer``)
    jobs: list[JobBeat] | None = Field(None, max_length=4096)
    #: as at the registration (it does not change while the worker runs); the registered one is kept
    enforcement: EnforcementBody | None = None

    @field_validator("gpus")
    @classmethod
    def _one_reading_per_gpu(cls, value: list[GpuReading] | None) -> list[GpuReading] | None:
        if value is not None:
            _no_repeats([reading.index for reading in value])
        return value

    @field_validator("unhealthy_gpus")
    @classmethod
    def _each_gpu_once(cls, value: list[int] | None) -> list[int] | None:
        if value is not None:
            _no_repeats(value)
        return value


class JobHeartbeatBody(_Strict):
    progress: JsonObject | None = None
    gpu_util_pct: float | None = Field(None, ge=0, le=100)
    rss_mb: float | None = Field(None, ge=0)
    #: when the job last saved a checkpoint on its worker (epoch seconds: the modification time of
    #: ``CORRAL_CHECKPOINT_OUT``): the preemption planner's cost counts the work since then
    # a Unix time an RFC 3339 answer can carry (year 9999 at most; found by Schemathesis)
    checkpoint_at: float | None = Field(None, ge=0, le=MAX_TIMESTAMP)
    #: during a preemption's checkpoint phase, the job asks for this many more seconds
    #: (``jobkit.defer``); the server grants up to ``CORRAL_MAX_DEFERRAL_S`` in all
    defer_s: float | None = Field(None, ge=0, le=86400)


class JobBeat(JobHeartbeatBody):
    """One running job's heartbeat inside its worker's (``WorkerHeartbeatBody.jobs``)."""

    id: Text = Field(min_length=1, max_length=64)
    attempt: int = Field(ge=0, lt=2**63)


FailReason = Literal["no_such_account", "workdir_unavailable", "oom_killed", "walltime_exceeded"]


class FailBody(_Strict):
    exit_code: int | None = Field(None, ge=-INT32_MAX, le=INT32_MAX)
    error: Output | None = Field(None, max_length=65536)
    output_tail: Output | None = Field(None, max_length=65536)
    #: the worker gives the job back for its own reasons (it is shutting down): re-queue it
    #: without spending the attempt
    release: bool = False
    #: why the attempt failed, when the worker knows (API.md "A job is contained on its host"):
    #: ``no_such_account``, ``workdir_unavailable`` and ``walltime_exceeded`` are not retried
    reason: FailReason | None = None


class DoneReport(_Strict):
    """One attempt's ``done`` inside its worker's batch (``POST /workers/{id}/reports``): the job and
    the attempt its fence names, as ``POST /jobs/{id}/done?worker_id=&attempt=`` takes them."""

    job_id: Text = Field(min_length=1, max_length=64)
    attempt: int = Field(ge=0, lt=2**63)
    outcome: Literal["done"]


class FailReport(FailBody):
    """One attempt's ``fail`` inside its worker's batch: its fence and the single route's body."""

    job_id: Text = Field(min_length=1, max_length=64)
    attempt: int = Field(ge=0, lt=2**63)
    outcome: Literal["fail"]


#: one item of a batch of final reports, told apart by ``outcome``
FinalReport = Annotated[DoneReport | FailReport, Field(discriminator="outcome")]

#: the most final reports one batch carries: the group commit's bound (one transaction)
MAX_FINAL_REPORTS = 64


class FinalReportsBody(_Strict):
    """``POST /workers/{id}/reports``: a worker's final reports of several attempts. The items are
    checked one by one (``FinalReport``), so that a malformed one is that item's 400 alone."""

    reports: list[Any] = Field(min_length=1, max_length=MAX_FINAL_REPORTS)


class WatchdogBody(_Strict):
    kind: Literal["budget", "stall", "gpu_health"]
    #: what the watchdog saw (readings, deadlines), kept in the job's event history
    detail: JsonObject | Text | None = None


def describe_error(error: ValidationError) -> tuple[str, str]:
    """The first problem of a validation error as (field path, message): ``jobs.3.command``."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "body"
    message = first["msg"]
    if first["type"] == "extra_forbidden":
        message = "unknown field"
    elif first["type"] == "missing":
        message = "field required"
    return field, f"{field}: {message}"
