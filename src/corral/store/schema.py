"""The declared schema and the migrations that build it.

Both backends run the same migration list; the only dialect difference in DDL is the blob type,
written ``{blob}``. ``DECLARED_SCHEMA`` is what the migrations must produce: a test applies every
migration to an empty database of each backend and compares the result with it, so a migration that
drifts from the declaration fails CI. A new migration is appended (never edited) and the declaration
updated with it.

Timestamps are DOUBLE PRECISION seconds since the Unix epoch (UTC): exact to the microsecond, the
same on both backends, and cheap to compare in SQL.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]
    #: run after ``statements`` on PostgreSQL only (storage tuning that SQLite has no words for)
    postgres_statements: tuple[str, ...] = ()


JOB_COLUMNS: tuple[str, ...] = (
    "id",
    "name",
    "command",
    "env",
    "status",
    "gang_id",
    "gang_size",
    "gang_index",
    "gpus",
    "vram_mb",
    "memory_mb",
    "cpus",
    "gpu_model",
    "labels",
    "pool",
    "username",
    "priority",
    "preemption_class",
    "checkpoint_mode",
    "max_retries",
    "attempts",
    "watchdog_retries",
    "preempted_count",
    "queue_front",
    "worker_id",
    "gpu_indices",
    "reservation_epoch",
    "reserved_at",
    "preemption_epoch",
    "drain_started_at",
    "cancel_requested",
    "submitted_at",
    "started_at",
    "finished_at",
    "last_heartbeat_at",
    "exit_code",
    "error",
    "output_tail",
    "reason_code",
    "reason_message",
    "has_checkpoint",
    "progress",
    "budget_s",
    "walltime_s",
    "stall_timeout_s",
    "event_count",
    "master_port",
    "refunds",
    "gpu_util_pct",
    "rss_mb",
)

WORKER_COLUMNS: tuple[str, ...] = (
    "id",
    "address",
    "gpus",
    "vram_mb",
    "memory_mb",
    "cpus",
    "gpu_model",
    "labels",
    "status",
    "registered_at",
    "last_heartbeat_at",
    "flagged_dead_at",
    "gpu_stats",
    "unhealthy_gpus",
)

EVENT_COLUMNS: tuple[str, ...] = (
    "job_id",
    "seq",
    "at",
    "from_status",
    "to_status",
    "reason_code",
    "reason_message",
    "epoch",
    "worker_id",
    "attempt",
)

IDEMPOTENCY_COLUMNS: tuple[str, ...] = ("key", "fingerprint", "result", "created_at")
CHECKPOINT_COLUMNS: tuple[str, ...] = ("job_id", "data", "size", "epoch", "saved_at", "attempt")
HOLD_COLUMNS: tuple[str, ...] = (
    "worker_id",
    "gang_id",
    "gpus",
    "vram_mb",
    "memory_mb",
    "cpus",
    "expected_at",
)

DECLARED_SCHEMA: dict[str, tuple[str, ...]] = {
    "schema_migrations": ("version", "name", "applied_at"),
    "jobs": JOB_COLUMNS,
    "workers": WORKER_COLUMNS,
    "job_events": EVENT_COLUMNS,
    "idempotency_keys": IDEMPOTENCY_COLUMNS,
    "checkpoints": CHECKPOINT_COLUMNS,
    "holds": HOLD_COLUMNS,
}

DECLARED_INDEXES: frozenset[str] = frozenset(
    {
        "jobs_queue",
        "jobs_holding",
        "jobs_status_submitted",
        "jobs_submitted",
        "jobs_gang",
        "jobs_pool_submitted",
    }
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "initial",
        (
            """
            CREATE TABLE jobs (
                id TEXT PRIMARY KEY,
                name TEXT,
                command TEXT NOT NULL,
                env TEXT NOT NULL,
                status TEXT NOT NULL,
                gang_id TEXT,
                gang_size INTEGER NOT NULL,
                gang_index INTEGER,
                gpus INTEGER NOT NULL,
                vram_mb INTEGER NOT NULL,
                memory_mb INTEGER NOT NULL,
                cpus INTEGER NOT NULL,
                gpu_model TEXT,
                labels TEXT NOT NULL,
                pool TEXT NOT NULL,
                username TEXT,
                priority INTEGER NOT NULL,
                preemption_class INTEGER NOT NULL,
                checkpoint_mode TEXT NOT NULL,
                max_retries INTEGER NOT NULL,
                attempts INTEGER NOT NULL DEFAULT 0,
                watchdog_retries INTEGER NOT NULL DEFAULT 0,
                preempted_count INTEGER NOT NULL DEFAULT 0,
                queue_front INTEGER NOT NULL DEFAULT 0,
                worker_id TEXT,
                gpu_indices TEXT NOT NULL DEFAULT '',
                reservation_epoch BIGINT NOT NULL DEFAULT 0,
                reserved_at DOUBLE PRECISION,
                preemption_epoch BIGINT NOT NULL DEFAULT 0,
                drain_started_at DOUBLE PRECISION,
                cancel_requested INTEGER NOT NULL DEFAULT 0,
                submitted_at DOUBLE PRECISION NOT NULL,
                started_at DOUBLE PRECISION,
                finished_at DOUBLE PRECISION,
                last_heartbeat_at DOUBLE PRECISION,
                exit_code INTEGER,
                error TEXT,
                output_tail TEXT,
                reason_code TEXT,
                reason_message TEXT,
                has_checkpoint INTEGER NOT NULL DEFAULT 0,
                progress TEXT,
                budget_s DOUBLE PRECISION,
                walltime_s DOUBLE PRECISION,
                stall_timeout_s DOUBLE PRECISION,
                event_count INTEGER NOT NULL DEFAULT 0
            )
            """,
            # The claim query's ORDER BY, in the same order: only pending rows are in it.
            """
            CREATE INDEX jobs_queue ON jobs
                (preemption_class DESC, priority DESC, queue_front DESC, submitted_at, id)
                WHERE status = 'pending'
            """,
            # Capacity in use on a worker: every job that holds resources there.
            """
            CREATE INDEX jobs_holding ON jobs (worker_id)
                WHERE status IN ('reserved', 'running', 'preempting')
            """,
            "CREATE INDEX jobs_status_submitted ON jobs (status, submitted_at, id)",
            "CREATE INDEX jobs_submitted ON jobs (submitted_at, id)",
            "CREATE INDEX jobs_gang ON jobs (gang_id, gang_index) WHERE gang_id IS NOT NULL",
            "CREATE INDEX jobs_pool_submitted ON jobs (pool, submitted_at, id)",
            """
            CREATE TABLE workers (
                id TEXT PRIMARY KEY,
                address TEXT NOT NULL,
                gpus INTEGER NOT NULL,
                vram_mb INTEGER NOT NULL,
                memory_mb INTEGER NOT NULL,
                cpus INTEGER NOT NULL,
                gpu_model TEXT,
                labels TEXT NOT NULL,
                status TEXT NOT NULL,
                registered_at DOUBLE PRECISION NOT NULL,
                last_heartbeat_at DOUBLE PRECISION,
                flagged_dead_at DOUBLE PRECISION,
                gpu_stats TEXT
            )
            """,
            """
            CREATE TABLE job_events (
                job_id TEXT NOT NULL,
                seq INTEGER NOT NULL,
                at DOUBLE PRECISION NOT NULL,
                from_status TEXT,
                to_status TEXT NOT NULL,
                reason_code TEXT,
                reason_message TEXT,
                epoch BIGINT,
                worker_id TEXT,
                attempt INTEGER NOT NULL,
                PRIMARY KEY (job_id, seq)
            )
            """,
            """
            CREATE TABLE idempotency_keys (
                key TEXT PRIMARY KEY,
                fingerprint TEXT NOT NULL,
                result TEXT NOT NULL,
                created_at DOUBLE PRECISION NOT NULL
            )
            """,
        ),
        postgres_statements=(
            # A queue table churns: every claim and every finish leaves a dead row version behind.
            # Vacuum and analyze it after 2% of its rows change rather than the default 20%, so the
            # claim's index scan does not wade through dead entries and plans stay accurate.
            "ALTER TABLE jobs SET (autovacuum_vacuum_scale_factor = 0.02,"
            " autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000)",
        ),
    ),
    Migration(
        2,
        "unhealthy gpus",
        (
            # GPU indices a worker reported it will not use again (a killed job's process stuck in a
            # driver call): comma-separated, excluded from placement until the worker re-registers.
            "ALTER TABLE workers ADD COLUMN unhealthy_gpus TEXT NOT NULL DEFAULT ''",
        ),
    ),
    Migration(
        3,
        "gangs: rendezvous port, checkpoints, holds",
        (
            "ALTER TABLE jobs ADD COLUMN master_port INTEGER",
            # Attempts given back to drained peers. ``attempts`` only ever grows (it is the fence
            # every worker report is checked against); the retry rule reads attempts - refunds.
            "ALTER TABLE jobs ADD COLUMN refunds INTEGER NOT NULL DEFAULT 0",
            # Checkpoints are opaque bytes of any content, kept apart from the job row so that no
            # job listing ever carries them.
            """
            CREATE TABLE checkpoints (
                job_id TEXT PRIMARY KEY,
                data {blob} NOT NULL,
                size INTEGER NOT NULL,
                epoch BIGINT NOT NULL,
                saved_at DOUBLE PRECISION NOT NULL
            )
            """,
            # Capacity held for the gang at the head of the queue (written by the admission leader,
            # read by every claim on that worker).
            """
            CREATE TABLE holds (
                worker_id TEXT NOT NULL,
                gang_id TEXT NOT NULL,
                gpus INTEGER NOT NULL,
                vram_mb INTEGER NOT NULL,
                memory_mb INTEGER NOT NULL,
                cpus INTEGER NOT NULL,
                expected_at DOUBLE PRECISION,
                PRIMARY KEY (worker_id, gang_id)
            )
            """,
        ),
    ),
    Migration(
        4,
        "checkpoints from any end of an attempt",
        (
            # The attempt that saved the checkpoint: a checkpoint now comes from every end of an
            # attempt (a crash, done), not only from a stop the server asked for at an epoch.
            "ALTER TABLE checkpoints ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0",
        ),
    ),
    Migration(
        5,
        "what a job's heartbeat reports",
        (
            # The GPU utilisation and process-tree memory of a running job, from its heartbeats:
            # shown by `corral show` and the dashboard.
            "ALTER TABLE jobs ADD COLUMN gpu_util_pct DOUBLE PRECISION",
            "ALTER TABLE jobs ADD COLUMN rss_mb DOUBLE PRECISION",
        ),
    ),
)
