"""Typed settings for the server and the worker: ``CORRAL_*`` environment variables, each also a flag.

A flag wins over its variable, which wins over the default. ``--help`` shows every flag with its
``CORRAL_*`` twin and default. Settings are validated once, at start: a bad value stops the command
with a message that names the setting, never a stack trace.
"""

from __future__ import annotations

import argparse
import math
import ssl
from typing import Any

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_PREFIX = "CORRAL_"
# Wall-clock budgets of a job that sets none and a worker that sets no CORRAL_BUDGET_S (seed 004).
GPU_JOB_BUDGET_S = 8100.0
CPU_JOB_BUDGET_S = 2100.0


class ServerSettings(BaseSettings):
    """Only settings something reads: a flag that does nothing is a promise ``--help`` cannot keep.

    A setting arrives with the code that reads it (``tests/unit/test_every_setting_is_read.py``
    fails on a field nothing outside this module reads).
    """

    model_config = SettingsConfigDict(env_prefix=_PREFIX, extra="ignore")

    db: str = Field("sqlite:///corral.db", description="store URL: sqlite:///path.db or postgresql://...")
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8765, ge=0, le=65535, description="port to listen on (0: any free port)")
    admission_tick_s: float = Field(5.0, gt=0, description="admission cycle interval")
    reaper_tick_s: float = Field(10.0, gt=0, description="reaper interval")
    heartbeat_timeout_s: float = Field(30.0, gt=0, description="a running job's lease")
    worker_offline_s: float = Field(60.0, gt=0, description="a silent worker goes offline after this")
    dead_worker_after_s: float = Field(30.0, gt=0, description="dead-worker flag after this silence")
    reservation_timeout_s: float = Field(30.0, gt=0, description="an unclaimed reservation rolls back")
    preempt_timeout_s: float = Field(45.0, gt=0, description="a preempting job is force-drained after")
    watchdog_max_retries: int = Field(3, ge=0, description="watchdog re-queues before a job fails")
    checkpoint_max_bytes: int = Field(16 * 1024 * 1024, gt=0, description="largest checkpoint body")
    # Preemption (seed 003): planned by the admission cycle.
    max_victims: int = Field(3, ge=1, description="jobs or whole gangs one preemption may stop, at most")
    max_preemptions_per_cycle: int = Field(
        128, ge=1, description="preemptions one admission cycle decides, at most (the rest wait a cycle)"
    )
    near_completion_s: float = Field(
        300.0, ge=0, description="a job this close to its walltime limit is never preempted"
    )
    gang_preempt_exempt_s: float = Field(
        0.0,
        ge=0,
        description="a gang that started less than this long ago is not preempted (0: no exemption)",
    )
    default_walltime_s: float | None = Field(
        None, gt=0, description="walltime_s of a job that sets none (pool default; none: no limit)"
    )
    max_walltime_s: float | None = Field(
        None, gt=0, description="largest walltime_s a submit may ask for (pool default; none: no maximum)"
    )
    preemptive_backoff_s: float = Field(
        5.0, ge=0, description="at most one preemptive placement per worker per this many seconds"
    )
    backfill_depth: int = Field(
        16,
        ge=0,
        description="waiting gangs and jobs, in queue order, that get a reservation each admission cycle"
        " (0: only the head of the queue's hold)",
    )
    topology_levels: str = Field(
        "topology.block,topology.rack",
        description="worker labels naming the topology levels, widest first, comma-separated"
        " (a host is its own narrowest level)",
    )
    checkpoint_timeout_s: float = Field(
        600.0, gt=0, description="a preemption victim's checkpoint phase (extended by half, once)"
    )
    max_deferral_s: float = Field(300.0, ge=0, description="extra checkpoint time a victim may ask for")
    log_max_bytes: int = Field(
        16 * 1024 * 1024, gt=0, description="job output kept per attempt (past it the oldest bytes go)"
    )
    retention_days: float = Field(
        14.0, gt=0, description="finished jobs, their events, logs, checkpoints and keys are kept this long"
    )
    retention_tick_s: float = Field(60.0, gt=0, description="retention loop interval")
    usage_retention_days: float = Field(
        400.0, gt=0, description="usage accounting rows are kept this long, whatever job retention removes"
    )
    history_interval_s: float = Field(
        60.0,
        description="the dashboard overview's last 24 hours: the queue's length and the GPUs allocated"
        " are sampled into the store once per this many seconds (replicas of one store: give them the"
        " same value)",
    )
    history_retention_days: float = Field(
        8.0, description="those samples are kept this long (the overview shows the last day)"
    )

    @field_validator("history_interval_s")
    @classmethod
    def _history_interval_charts_a_day(cls, value: float) -> float:
        """Between 10 s (the overview reads every sample of its day: 8,640 at most) and an hour
        (a day of fewer than 24 points is no chart)."""
        if not 10 <= value <= 3600:
            raise ValueError(
                "must be between 10 and 3600 seconds (the overview draws a day of samples: at most"
                " 8,640 of them, at least 24)"
            )
        return value

    @field_validator("history_retention_days")
    @classmethod
    def _history_kept_a_day(cls, value: float) -> float:
        if not 1 <= value < math.inf:  # NaN compares false both ways: it would delete every sample
            raise ValueError("must be at least 1 day (the overview shows the last 24 hours) and finite")
        return value

    dependency_tick_s: float = Field(
        5.0, gt=0, description="dependency loop interval (a job's end wakes it sooner)"
    )
    log_level: str = Field("info", description="debug, info, warning or error")
    # --- pools: the defaults a pool inherits unless it or an ancestor sets its own (seed 002) ---
    starvation_timeout_s: float = Field(
        30.0, gt=0, description="a pool below its fair share this long is starving (pool default)"
    )
    aggressive_starvation_timeout_s: float = Field(
        120.0, gt=0, description="... and this long, aggressively starving (pool default)"
    )
    starvation_tolerance: float = Field(
        0.8, gt=0, le=1, description="below fair share x this counts as below fair share (pool default)"
    )

    preemption_satisfaction_threshold: float = Field(
        1.0,
        gt=0,
        description="a pool's allocations past its fair share x this are preemptible for starving pools",
    )
    aggressive_preemption_satisfaction_threshold: float = Field(
        0.2,
        ge=0,
        description="... past fair share x this, preemptible for aggressively starving pools (<= the above)",
    )

    @field_validator("aggressive_starvation_timeout_s")
    @classmethod
    def _aggressive_after_starvation(cls, value: float, info: ValidationInfo) -> float:
        if value < info.data.get("starvation_timeout_s", 0):
            raise ValueError("must be at least starvation_timeout_s")
        return value

    @field_validator("topology_levels")
    @classmethod
    def _levels_named_once(cls, value: str) -> str:
        names = [part.strip() for part in value.split(",") if part.strip()]
        if len(set(names)) != len(names):
            raise ValueError("names a level twice")
        return value

    @field_validator("max_walltime_s")
    @classmethod
    def _max_walltime_above_default(cls, value: float | None, info: ValidationInfo) -> float | None:
        default = info.data.get("default_walltime_s")
        if value is not None and default is not None and value < default:
            raise ValueError("must be at least default_walltime_s")
        return value

    @field_validator("aggressive_preemption_satisfaction_threshold")
    @classmethod
    def _aggressive_below_regular(cls, value: float, info: ValidationInfo) -> float:
        if value > info.data.get("preemption_satisfaction_threshold", 1.0):
            raise ValueError("must not exceed preemption_satisfaction_threshold")
        return value

    # --- end of pools ---
    access_log: bool = Field(False, description="log every HTTP request")
    body_timeout_s: float = Field(30.0, gt=0, description="a request body must arrive within this (else 408)")
    max_requests_per_client: int = Field(
        256, ge=1, description="requests one client address may have in flight (else 429)"
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a request's headers must all arrive within this of its first byte (a new"
        " connection's first request: of its opening); else the connection is closed (408 when part of"
        " a request came)",
    )
    idle_timeout_s: float = Field(
        30.0, gt=0, description="a kept-alive connection with no request in progress is closed after this"
    )
    max_connections: int = Field(
        10000,
        ge=1,
        description="connections open at once, past it 503 unavailable (lowered at start to fit the"
        " open-file limit, which the server raises to its hard limit, less a reserve)",
    )
    max_connections_per_client: int = Field(
        256,
        ge=1,
        description="connections one client may hold open, past it 429 (a client: its address; with"
        " --auth-tokens, the token's user or worker from that address)",
    )
    auth_tokens: str | None = Field(
        None, description="token file (TOKEN ROLE NAME lines) that turns authentication on"
    )
    tls_cert: str | None = Field(
        None, description="PEM certificate (chain) to serve HTTPS with; needs --tls-key (default: plain HTTP)"
    )
    tls_key: str | None = Field(
        None, validate_default=True, description="PEM private key of --tls-cert (unencrypted)"
    )
    insecure_http: bool = Field(
        False,
        description="let a server with auth serve plain HTTP on an address other than loopback (tokens"
        " then cross the network in clear); without it such a server refuses to start",
    )

    @field_validator("tls_key")
    @classmethod
    def _certificate_and_key(cls, value: str | None, info: ValidationInfo) -> str | None:
        """Both or neither, and a pair that loads: a server that would fail its first handshake
        stops at start, with the reason."""
        certificate = info.data.get("tls_cert")
        if (certificate is None) != (value is None):
            raise ValueError("--tls-cert and --tls-key go together: give both or neither")
        if certificate is not None and value is not None:
            try:
                ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(certificate, value)
            except ssl.SSLError as error:  # before OSError, which it is a kind of
                raise ValueError(
                    f"cannot load the certificate {certificate} with the key {value}: {error.reason or error}"
                ) from None
            except OSError as error:
                raise ValueError(f"cannot read {error.filename or certificate}: {error.strerror}") from None
        return value

    store_threads: int = Field(
        8,
        ge=0,
        le=256,
        description="threads that run the store's work off the event loop (PostgreSQL: a connection"
        " each; on SQLite a claim, report or heartbeat runs on the event loop when no lock is in its"
        " way, and on a thread when one is); 0: everything on the event loop, as before (a slow or"
        " locked store then stalls every request)",
    )
    store_on_loop: bool = Field(
        True,
        description="PostgreSQL: run a claim, report or heartbeat on the event loop (its waits on the"
        " database are the loop's, a connection of its own each, as many as store_threads) rather"
        " than handing each to a store thread; false: on the store threads. On: up to store_threads"
        " more connections per replica (the loop's sessions' beside the threads')",
    )
    store_busy_timeout_s: float = Field(
        5.0, gt=0, description="a change waiting longer than this for a store lock is answered 503 store_busy"
    )
    store_processes: bool = Field(
        True,
        description="plan the admission pass, and build the large list answers (GET /jobs pages over"
        " 500 jobs, GET /workers), in two processes of their own (corral server only), and on PostgreSQL"
        " store POST /jobs/batch in a third: their Python then never competes with the requests for the"
        " interpreter; false: on the server's threads",
    )
    store_process_timeout_s: float = Field(
        300.0,
        ge=30,
        description="a call to one of those processes (an admission pass's plan, a list, a batch"
        " submit) not answered within this is given up: the process is stopped (the pass fails, the"
        " list is built on a thread, the batch is answered 503 store_unavailable), and a new one takes"
        " the next call, so that a stuck child cannot hold the admission loop or the batches for ever;"
        " at least 30 s: a call that starts a new child counts its start (seconds on a loaded host)",
    )
    switch_interval_s: float = Field(
        0.0005,
        gt=0,
        le=1,
        description="the interpreter's switch interval while long work (a large list, a dashboard page,"
        " a loop pass) runs on a thread beside the event loop, so that requests get the interpreter"
        " back soon; the interpreter's own (5 ms) the rest of the time",
    )
    gc_threshold: int = Field(
        50_000,
        ge=0,
        description="corral server: the cyclic garbage collector's first threshold (container objects"
        " allocated net of those freed before a young collection); the interpreter's 700 promotes each"
        " request's objects still in flight to the oldest generation and sets off full collections"
        " that walk every object of the process (100 ms and more at thousands of hosts, on every"
        " request in flight); 0: the interpreter's own",
    )


class WorkerSettings(BaseSettings):
    """The worker's settings; as for ``ServerSettings``, each one is read by the worker."""

    model_config = SettingsConfigDict(env_prefix=_PREFIX, extra="ignore")

    @field_validator("server")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value

    server: str = Field("http://127.0.0.1:8765", description="URL of corral server")
    ca_file: str | None = Field(
        None,
        description="CA certificate an https:// server's certificate must chain to (default: the"
        " system's trust store)",
    )
    worker_id: str | None = Field(None, description="this worker's id (default: the host name)")
    worker_address: str | None = Field(None, description="address peers reach this host at")
    gpus: int | None = Field(None, ge=0, description="GPUs to offer (default: detected, else 0)")
    vram_mb: int | None = Field(None, ge=0, description="VRAM per GPU in MB (default: detected)")
    memory_mb: int | None = Field(None, ge=0, description="memory to offer in MB (default: detected)")
    cpus: int | None = Field(None, ge=0, description="CPUs to offer (default: detected)")
    gpu_model: str | None = Field(None, description="GPU model name (default: detected)")
    label: list[str] = Field(default_factory=list, description="label k=v (repeatable)")
    poll_s: float = Field(1.0, gt=0, description="pause between claims when the server is unreachable")
    claim_wait_s: float = Field(
        2.0,
        ge=0,
        le=30,
        description="long-poll wait of each claim (also how long a shutdown may wait on one)",
    )
    heartbeat_s: float = Field(5.0, gt=0, description="job heartbeat interval")
    worker_heartbeat_s: float = Field(15.0, gt=0, description="worker heartbeat interval")
    preempt_grace_s: float = Field(15.0, ge=0, description="SIGTERM to SIGKILL grace")
    shutdown_timeout_s: float = Field(60.0, ge=0, description="on SIGTERM, time running jobs get")
    output_tail_bytes: int = Field(4096, ge=0, description="output tail sent with a failure")
    log_ship_delay_s: float = Field(
        0.2,
        ge=0,
        le=60,
        description="a job's output smaller than a chunk (1 MiB) goes to the server at most this long"
        " after the previous send (a follow sees it within about that); a full chunk goes at once",
    )
    log_spill_max_mb: int = Field(
        4096,
        ge=0,
        description="output a job writes faster than the server takes it, past the 8 MiB buffer, is"
        " kept in a spill file of the attempt in the state directory, up to this much (and half the"
        " disk's free space); past it the oldest unsent output is dropped with a note. 0: no spill",
    )
    report_window_s: float = Field(
        0.005,
        ge=0,
        le=1,
        description="final reports (done, fail) of jobs ending within this long of each other go to the"
        " server in one request (POST /workers/{id}/reports); 0: each by its own request",
    )
    log_level: str = Field("info", description="debug, info, warning or error")
    # Watchdogs (seed 004): a job's own budget_s / stall_timeout_s win over these.
    budget_s: float | None = Field(
        None, gt=0, description="wall-clock budget of a job without one (default: 8100 GPU jobs, 2100 CPU)"
    )
    stall_timeout_s: float = Field(120.0, gt=0, description="no beat for this long: suspect a stall")
    walltime_warning_s: float = Field(
        60.0,
        ge=0,
        description="a checkpointing job (auto/manual) gets the checkpoint hint (SIGUSR1) this long"
        " before its walltime_s ends it",
    )
    stall_confirm_samples: int = Field(3, ge=1, description="reads that confirm a suspected stall")
    stall_confirm_poll_s: float = Field(1.0, gt=0, description="spacing of the stall confirmation reads")
    gpu_idle_pct: float = Field(5.0, ge=0, le=100, description="GPU utilisation at or under this is idle")
    ram_delta_mb: float = Field(5120.0, gt=0, description="memory moving this much means working")
    gpu_health_window_s: float = Field(300.0, gt=0, description="GPU-health window (reset by each beat)")
    gpu_health_grace_s: float = Field(1200.0, ge=0, description="first GPU-health window, for model loading")
    gpu_sampler: str | None = Field(
        None, description="nvml, none or fake:<path> (default: nvml where NVML loads, else none)"
    )
    state_dir: str | None = Field(
        None,
        description="where the worker records its jobs' process groups, to stop what a killed run "
        "left (default: <tmp>/corral-<uid>/worker-<id>)",
    )
    user_map: str | None = Field(
        None,
        description="corral user names that differ from their Unix account: a file of NAME UNIX_ACCOUNT "
        "lines, or the lines themselves (default: each user runs as the account of the same name)",
    )
    containment: str = Field(
        "auto", description="auto (a cgroup per job where the host has them) or none (no limits)"
    )
    default_job_memory_mb: int | None = Field(
        None, ge=1, description="memory limit of a job that asks for 0 MB (default: none)"
    )
    job_pids_max: int | None = Field(16384, ge=1, description="most processes a job may have at once")
    gpu_devices: str = Field(
        "/dev/nvidia[0-9]*", description="the GPU device nodes (glob; the trailing number is the GPU index)"
    )
    allow_root_jobs: bool = Field(
        False,
        description="let a root worker without auth run jobs (as root) for a server not on loopback",
    )
    self_fence: bool = Field(
        True,
        description="stop a job whose lease this worker could not renew for the lease less"
        " --self-fence-margin-s (a partition: the server may be giving it to another worker), as a"
        " preemption stops it, and hand it back; off: it runs on until the server answers again",
    )
    self_fence_margin_s: float = Field(
        2.0,
        ge=0,
        description="how long before its lease ends a fenced job is stopped (at most a quarter of the"
        " lease); a job that checkpoints gets this long to save first",
    )

    @field_validator("ca_file")
    @classmethod
    def _readable_ca(cls, value: str | None) -> str | None:
        """A CA file that cannot be read stops the worker at start, not at each claim after."""
        if value is not None:
            try:
                ssl.create_default_context(cafile=value)
            except ssl.SSLError as error:  # before OSError, which it is a kind of
                raise ValueError(f"{value} holds no usable CA certificate: {error.reason or error}") from None
            except OSError as error:
                raise ValueError(f"cannot read {value}: {error.strerror}") from None
        return value

    @field_validator("containment")
    @classmethod
    def _known_containment(cls, value: str) -> str:
        if value not in ("auto", "none"):
            raise ValueError("expected auto or none")
        return value

    @field_validator("gpu_sampler")
    @classmethod
    def _known_sampler(cls, value: str | None) -> str | None:
        if value is None or value in ("nvml", "none") or (value.startswith("fake:") and len(value) > 5):
            return value
        raise ValueError("expected nvml, none or fake:<path>")

    def default_budget_s(self, holds_gpus: bool) -> float:
        """``budget_s`` when set, else the source's defaults: 8100 s for a GPU job, 2100 s for a CPU job."""
        if self.budget_s is not None:
            return self.budget_s
        return GPU_JOB_BUDGET_S if holds_gpus else CPU_JOB_BUDGET_S


def add_flags(parser: argparse.ArgumentParser, settings_class: type[BaseSettings]) -> None:
    """One flag per setting: ``--admission-tick-s`` for ``CORRAL_ADMISSION_TICK_S``."""
    for name, field in settings_class.model_fields.items():
        flag = "--" + name.replace("_", "-")
        env = _PREFIX + name.upper()
        default = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
        help_text = f"{field.description} [env {env}; default {default}]"
        if field.annotation is bool:
            parser.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif name == "label":
            parser.add_argument(flag, dest=name, action="append", default=None, metavar="K=V", help=help_text)
        else:
            parser.add_argument(flag, dest=name, default=None, metavar=name.upper(), help=help_text)


def load(settings_class: type[BaseSettings], arguments: argparse.Namespace) -> Any:
    """Settings from the environment, overridden by the flags that were given.

    Raises ``SystemExit`` with a one-line message naming the bad setting.
    """
    overrides = {
        name: getattr(arguments, name)
        for name in settings_class.model_fields
        if getattr(arguments, name, None) is not None
    }
    try:
        return settings_class(**overrides)
    except ValidationError as error:
        first = error.errors()[0]
        name = ".".join(str(part) for part in first["loc"])
        flag = "--" + name.replace("_", "-")
        raise SystemExit(
            f"corral: bad setting {name} ({flag} / {_PREFIX}{name.upper()}): {first['msg']}"
        ) from None
