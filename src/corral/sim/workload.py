"""What the simulator replays: the workload's jobs, the cluster's workers, the pools, the settings.

Plain values, read by ``corral.sim.readers`` from files and by tests from factories. A
``WorkloadJob`` is one line of the workload: a single job, or a gang of ``gang_size`` tasks that
each ask for ``gpus`` GPUs (shared/API.md "The simulator's input").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from corral.domain.pools import PoolSettings
from corral.domain.records import Worker

CHECKPOINT_MODES = ("none", "auto", "manual")


@dataclass(frozen=True, slots=True)
class WorkloadJob:
    job_id: str
    submit_time: float
    #: seconds the job runs once started (a gang: each task)
    duration: float
    gpus: int
    gang_size: int = 1
    pool: str = "default"
    user: str | None = None
    preemption_class: int = 5
    checkpoint: str = "none"
    #: how often the job saves a checkpoint of its own (None: never between checkpoint phases)
    checkpoint_every_s: float | None = None
    cpus: int = 0
    memory_mb: int = 0
    vram_mb: int = 0
    #: its ``walltime_s`` (a limit: a job whose work runs longer is ended at it, failed with reason
    #: ``walltime_exceeded``); None: the pool's default, if any
    walltime: float | None = None
    #: the trace's own figures where it has them (the Alibaba trace): when production started it
    production_start: float | None = None
    #: an array of this job (``"0-99%8"``, API.md "Arrays and dependencies"): one task per index,
    #: each ``<job_id>.<index>``; None: a single job or a gang
    array: str | None = None
    #: (when, workload job id) conditions: it starts once each named job, gang or array ended so
    after: tuple[tuple[str, str], ...] = ()
    #: where a gang's ranks may sit (API.md "Topology"): ("required" or "preferred", level)
    topology: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Unscheduled:
    """A trace job that production never scheduled: no duration, so it is not replayed; reported
    apart."""

    job_id: str
    submit_time: float
    gpus: int


@dataclass(frozen=True, slots=True)
class Workload:
    jobs: tuple[WorkloadJob, ...]
    #: the name shown in summaries (the file's stem)
    name: str = "workload"
    unscheduled: tuple[Unscheduled, ...] = ()


@dataclass(frozen=True, slots=True)
class Cluster:
    workers: tuple[Worker, ...]
    name: str = "cluster"

    @property
    def gpus(self) -> int:
        return sum(worker.resources.gpus for worker in self.workers)


@dataclass(frozen=True, slots=True)
class SimSettings:
    """The server's settings the core reads (the same names and defaults as ``ServerSettings``;
    ``--set CORRAL_<NAME>=value`` changes one), the worker's heartbeat interval, and the
    simulator's own model of a job's side of the protocol.

    The job's side, as modelled (a documented simplification of the worker and jobkit):

    - a worker claims as soon as capacity or work appears (its long poll is woken at once);
      workers poll in worker id order;
    - a victim hears of its preemption at its next heartbeat, ``heartbeat_s`` after the decision,
      then every ``heartbeat_s``; a victim that checkpoints (``auto``/``manual``) saves on
      SIGUSR1 in ``checkpoint_save_s`` and uploads (keeping all its work up to the signal); then
      the next heartbeat says ``preempt`` and the job exits and is acked ``stop_s`` later;
    - a job whose ``walltime_s`` (its own, else its pool's default) ends before its work is stopped
      by its worker at its claim plus the limit and reported failed (``walltime_exceeded``)
      ``stop_s`` later, unless it is being preempted by then (the stop's ack wins); a submit
      above its pool's ``max_walltime_s`` is refused (not run, counted in ``refused``);
    - a job with ``checkpoint_every_s`` saves that often on its own (its heartbeats report it,
      which the preemption cost reads); a victim without a checkpoint phase resumes from that
      save, or starts over.

    Not modelled: the server's early admission pass after a release while a gang waits (the
    simulator runs the cycle at its ticks only, so a gang may start up to one tick later than on
    the server), failures, watchdogs, the reaper and lost workers (every job runs to its end or
    to its stop), and the waiting reasons ``corral why`` shows (they change no status).
    """

    admission_tick_s: float = 5.0
    reservation_timeout_s: float = 30.0
    preempt_timeout_s: float = 45.0
    max_victims: int = 3
    near_completion_s: float = 300.0
    gang_preempt_exempt_s: float = 0.0
    preemptive_backoff_s: float = 5.0
    checkpoint_timeout_s: float = 600.0
    max_deferral_s: float = 300.0
    starvation_timeout_s: float = 30.0
    aggressive_starvation_timeout_s: float = 120.0
    starvation_tolerance: float = 0.8
    preemption_satisfaction_threshold: float = 1.0
    aggressive_preemption_satisfaction_threshold: float = 0.2
    max_preemptions_per_cycle: int = 128
    #: waiting gangs and jobs that get a reservation each cycle (``CORRAL_BACKFILL_DEPTH``)
    backfill_depth: int = 16
    #: the walltime_s of a job that sets none, and the most one may set (None: none; pools may
    #: set their own)
    default_walltime_s: float | None = None
    max_walltime_s: float | None = None
    heartbeat_s: float = 5.0
    checkpoint_save_s: float = 30.0
    stop_s: float = 1.0
    #: a gang waiting longer than this is starved (summary ``starved_gangs``)
    starvation_bound_s: float = 6 * 3600.0
    #: ``CORRAL_TOPOLOGY_LEVELS``, widest first, comma-separated; empty turns the topology off
    #: (labels and asks ignored: the id-order best fit)
    topology_levels: str = "topology.block,topology.rack"


@dataclass(frozen=True, slots=True)
class Scenario:
    """Everything one run needs."""

    workload: Workload
    cluster: Cluster
    pools: dict[str, PoolSettings] = field(default_factory=dict)
    settings: SimSettings = field(default_factory=SimSettings)
