"""The declared schema and the migrations that build it.

Both backends run the same migration list; the only dialect difference in DDL is the blob type,
written ``{blob}``. ``DECLARED_COLUMNS``, ``DECLARED_PRIMARY_KEYS`` and ``DECLARED_INDEXES`` are what
the migrations must produce: ``tests/contract/test_schema.py`` applies every migration to an empty
database of each backend and compares column types, nullability and defaults, keys and index
definitions with them, so a migration that drifts from the declaration (or builds something
different on one backend) fails CI. A new migration is appended (never edited) and the declaration
updated with it.

Timestamps are DOUBLE PRECISION seconds since the Unix epoch (UTC): exact to the microsecond, the
same on both backends, and cheap to compare in SQL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]
    #: run after ``statements`` on PostgreSQL only (storage tuning that SQLite has no words for)
    postgres_statements: tuple[str, ...] = ()


@dataclass(frozen=True)
class Column:
    """A column as both backends must report it.

    ``type`` is spelled as in the migrations' DDL (``TEXT``, ``INTEGER``, ``BIGINT``, ``DOUBLE
    PRECISION``, and ``BLOB`` for ``{blob}``); ``default`` is the SQL literal (``0``, ``''``) or
    None. The backends translate their own catalogue into this form (``column_definitions``).
    """

    name: str
    type: str
    not_null: bool = False
    default: str | None = None


@dataclass(frozen=True)
class Index:
    """An index as both backends must report it: its table, its keys in order (``"priority DESC"``
    for a descending key), the predicate of a partial index as written after ``WHERE`` in the
    DDL, and whether it is unique. Primary keys are declared per table, not here."""

    table: str
    keys: tuple[str, ...]
    where: str | None = None
    unique: bool = False


_COLUMN_DDL = re.compile(
    r"(?P<name>\w+) (?P<type>DOUBLE PRECISION|[A-Z]+)(?P<not_null> NOT NULL)?(?: DEFAULT (?P<default>\S+))?"
)


def columns(*definitions: str) -> tuple[Column, ...]:
    """Columns written as their line of a ``CREATE TABLE`` reads: ``"attempts INTEGER NOT NULL
    DEFAULT 0"``. Only that grammar is accepted, so a typo fails at import, not in a test."""
    parsed = []
    for definition in definitions:
        match = _COLUMN_DDL.fullmatch(definition)
        if match is None:
            raise ValueError(f"column declaration {definition!r} is not 'name TYPE [NOT NULL] [DEFAULT x]'")
        parsed.append(Column(match["name"], match["type"], match["not_null"] is not None, match["default"]))
    return tuple(parsed)


# What the migrations must build, table by table, columns in their order in the table (a column a
# migration adds comes last). Adding a column is one line here, beside its ALTER TABLE in a new
# migration below; the column-name tuples the SQL is built from (JOB_COLUMNS, ...) follow from
# it. A primary-key column is declared NOT NULL (PostgreSQL enforces it; SQLite only for INTEGER
# keys, so its catalogue is read the same way).
DECLARED_COLUMNS: dict[str, tuple[Column, ...]] = {
    "schema_migrations": columns(
        "version INTEGER NOT NULL",
        "name TEXT NOT NULL",
        "applied_at DOUBLE PRECISION NOT NULL",
    ),
    "jobs": columns(
        "id TEXT NOT NULL",
        "name TEXT",
        "command TEXT NOT NULL",
        "env TEXT NOT NULL",
        "status TEXT NOT NULL",
        "gang_id TEXT",
        "gang_size INTEGER NOT NULL",
        "gang_index INTEGER",
        "gpus INTEGER NOT NULL",
        "vram_mb INTEGER NOT NULL",
        "memory_mb INTEGER NOT NULL",
        "cpus INTEGER NOT NULL",
        "gpu_model TEXT",
        "labels TEXT NOT NULL",
        "pool TEXT NOT NULL",
        "username TEXT",
        "priority INTEGER NOT NULL",
        "preemption_class INTEGER NOT NULL",
        "checkpoint_mode TEXT NOT NULL",
        "max_retries INTEGER NOT NULL",
        "attempts INTEGER NOT NULL DEFAULT 0",
        "watchdog_retries INTEGER NOT NULL DEFAULT 0",
        "preempted_count INTEGER NOT NULL DEFAULT 0",
        "queue_front INTEGER NOT NULL DEFAULT 0",
        "worker_id TEXT",
        "gpu_indices TEXT NOT NULL DEFAULT ''",
        "reservation_epoch BIGINT NOT NULL DEFAULT 0",
        "reserved_at DOUBLE PRECISION",
        "preemption_epoch BIGINT NOT NULL DEFAULT 0",
        "drain_started_at DOUBLE PRECISION",
        "cancel_requested INTEGER NOT NULL DEFAULT 0",
        "submitted_at DOUBLE PRECISION NOT NULL",
        "started_at DOUBLE PRECISION",
        "finished_at DOUBLE PRECISION",
        "last_heartbeat_at DOUBLE PRECISION",
        "exit_code INTEGER",
        "error TEXT",
        "output_tail TEXT",
        "reason_code TEXT",
        "reason_message TEXT",
        "has_checkpoint INTEGER NOT NULL DEFAULT 0",
        "progress TEXT",
        "budget_s DOUBLE PRECISION",
        "walltime_s DOUBLE PRECISION",
        "stall_timeout_s DOUBLE PRECISION",
        "event_count INTEGER NOT NULL DEFAULT 0",
        "master_port INTEGER",  # migration 3
        "refunds INTEGER NOT NULL DEFAULT 0",  # migration 3
        "gpu_util_pct DOUBLE PRECISION",  # migration 5
        "rss_mb DOUBLE PRECISION",  # migration 5
        "preempted_for TEXT",  # migration 7
        "victims_deadline DOUBLE PRECISION",  # migration 7
        "checkpoint_requested_at DOUBLE PRECISION",  # migration 7
        "checkpoint_deadline DOUBLE PRECISION",  # migration 7
        "checkpoint_extended INTEGER NOT NULL DEFAULT 0",  # migration 7
        "checkpoint_deferred_s DOUBLE PRECISION NOT NULL DEFAULT 0",  # migration 7
        "checkpoint_durations TEXT NOT NULL DEFAULT ''",  # migration 7
        "last_checkpoint_at DOUBLE PRECISION",  # migration 7
        "checkpoint_failures INTEGER NOT NULL DEFAULT 0",  # migration 7
        "claim_key TEXT",  # migration 11
        "workdir TEXT",  # migration 12
        "array_id TEXT",  # migration 17
        "array_index INTEGER",  # migration 17
        "array_size INTEGER",  # migration 17
        "array_throttle INTEGER",  # migration 17
        "depends_on TEXT NOT NULL DEFAULT ''",  # migration 17
        "awaiting_dependencies INTEGER NOT NULL DEFAULT 0",  # migration 17
        "topology TEXT NOT NULL DEFAULT ''",  # migration 18
    ),
    "workers": columns(
        "id TEXT NOT NULL",
        "address TEXT NOT NULL",
        "gpus INTEGER NOT NULL",
        "vram_mb INTEGER NOT NULL",
        "memory_mb INTEGER NOT NULL",
        "cpus INTEGER NOT NULL",
        "gpu_model TEXT",
        "labels TEXT NOT NULL",
        "status TEXT NOT NULL",
        "registered_at DOUBLE PRECISION NOT NULL",
        "last_heartbeat_at DOUBLE PRECISION",
        "flagged_dead_at DOUBLE PRECISION",
        "gpu_stats TEXT",
        "unhealthy_gpus TEXT NOT NULL DEFAULT ''",  # migration 2
        "enforcement TEXT NOT NULL DEFAULT '{}'",  # migration 12
    ),
    "job_events": columns(
        "job_id TEXT NOT NULL",
        "seq INTEGER NOT NULL",
        "at DOUBLE PRECISION NOT NULL",
        "from_status TEXT",
        "to_status TEXT NOT NULL",
        "reason_code TEXT",
        "reason_message TEXT",
        "epoch BIGINT",
        "worker_id TEXT",
        "attempt INTEGER NOT NULL",
    ),
    "idempotency_keys": columns(  # migration 14: one user's key is not another's
        "owner TEXT NOT NULL",
        "key TEXT NOT NULL",
        "fingerprint TEXT NOT NULL",
        "result TEXT NOT NULL",
        "created_at DOUBLE PRECISION NOT NULL",
    ),
    "checkpoints": columns(  # migration 3
        "job_id TEXT NOT NULL",
        "data BLOB NOT NULL",
        "size INTEGER NOT NULL",
        "epoch BIGINT NOT NULL",
        "saved_at DOUBLE PRECISION NOT NULL",
        "attempt INTEGER NOT NULL DEFAULT 0",  # migration 4
    ),
    "holds": columns(  # migration 3
        "worker_id TEXT NOT NULL",
        "gang_id TEXT NOT NULL",
        "gpus INTEGER NOT NULL",
        "vram_mb INTEGER NOT NULL",
        "memory_mb INTEGER NOT NULL",
        "cpus INTEGER NOT NULL",
        "expected_at DOUBLE PRECISION",
    ),
    "pools": columns(  # migration 6
        "path TEXT NOT NULL",
        "weight DOUBLE PRECISION",
        "guarantee_gpus INTEGER",
        "guarantee_vram_mb INTEGER",
        "guarantee_memory_mb INTEGER",
        "guarantee_cpus INTEGER",
        "limit_gpus INTEGER",
        "limit_vram_mb INTEGER",
        "limit_memory_mb INTEGER",
        "limit_cpus INTEGER",
        "mode TEXT",
        "kind TEXT",
        "starvation_timeout_s DOUBLE PRECISION",
        "aggressive_starvation_timeout_s DOUBLE PRECISION",
        "starvation_tolerance DOUBLE PRECISION",
        "enable_aggressive_starvation INTEGER",
        "allow_aggressive_preemption INTEGER",
        "created_at DOUBLE PRECISION NOT NULL",
        "updated_at DOUBLE PRECISION NOT NULL",
        "default_walltime_s DOUBLE PRECISION",  # migration 13
        "max_walltime_s DOUBLE PRECISION",  # migration 13
    ),
    "job_logs": columns(  # migration 8
        "job_id TEXT NOT NULL",
        "attempt INTEGER NOT NULL",
        "size BIGINT NOT NULL",
        "dropped BIGINT NOT NULL",
        "updated_at DOUBLE PRECISION NOT NULL",
    ),
    "job_log_chunks": columns(  # migration 8
        "job_id TEXT NOT NULL",
        "attempt INTEGER NOT NULL",
        "start_offset BIGINT NOT NULL",
        "end_offset BIGINT NOT NULL",
        "data BLOB NOT NULL",
    ),
    "pool_starvation": columns(  # migration 10
        "path TEXT NOT NULL",
        "status TEXT NOT NULL",
        "below_since DOUBLE PRECISION",
        "since DOUBLE PRECISION",
    ),
    "attempt_usage": columns(  # migration 16
        "job_id TEXT NOT NULL",
        "attempt INTEGER NOT NULL",
        "username TEXT",
        "pool TEXT NOT NULL",
        "worker_id TEXT",
        "gpus INTEGER NOT NULL",
        "cpus INTEGER NOT NULL",
        "submitted_at DOUBLE PRECISION NOT NULL",
        "started_at DOUBLE PRECISION NOT NULL",
        "ended_at DOUBLE PRECISION NOT NULL",
        "wait_s DOUBLE PRECISION",
        "status TEXT NOT NULL",
    ),
    "cluster_samples": columns(  # migration 19
        "at DOUBLE PRECISION NOT NULL",
        "queued_jobs INTEGER NOT NULL",
        "running_jobs INTEGER NOT NULL",
        "gpus_total INTEGER NOT NULL",
        "gpus_allocated INTEGER NOT NULL",
    ),
}

DECLARED_PRIMARY_KEYS: dict[str, tuple[str, ...]] = {
    "schema_migrations": ("version",),
    "jobs": ("id",),
    "workers": ("id",),
    "job_events": ("job_id", "seq"),
    "idempotency_keys": ("owner", "key"),
    "checkpoints": ("job_id",),
    "holds": ("worker_id", "gang_id"),
    "pools": ("path",),
    "job_logs": ("job_id", "attempt"),
    "job_log_chunks": ("job_id", "attempt", "start_offset"),
    "pool_starvation": ("path",),
    "attempt_usage": ("job_id", "attempt"),
    "cluster_samples": ("at",),
}

DECLARED_INDEXES: dict[str, Index] = {
    "jobs_queue": Index(
        "jobs",
        ("preemption_class DESC", "priority DESC", "queue_front DESC", "submitted_at", "id"),
        where="status = 'pending'",
    ),
    "jobs_holding": Index("jobs", ("worker_id",), where="status IN ('reserved', 'running', 'preempting')"),
    "jobs_status_submitted": Index("jobs", ("status", "submitted_at", "id")),
    "jobs_submitted": Index("jobs", ("submitted_at", "id")),
    "jobs_gang": Index("jobs", ("gang_id", "gang_index"), where="gang_id IS NOT NULL"),
    "jobs_pool_submitted": Index("jobs", ("pool", "submitted_at", "id")),
    "jobs_user_submitted": Index("jobs", ("username", "submitted_at", "id")),
    "jobs_finished": Index("jobs", ("finished_at",), where="finished_at IS NOT NULL"),
    "jobs_claim_key": Index("jobs", ("claim_key",), where="claim_key IS NOT NULL"),
    "idempotency_keys_created": Index("idempotency_keys", ("created_at",)),
    "attempt_usage_ended": Index("attempt_usage", ("ended_at",)),
    "jobs_array": Index("jobs", ("array_id", "status"), where="array_id IS NOT NULL"),  # migration 17
    "jobs_awaiting": Index("jobs", ("submitted_at", "id"), where="awaiting_dependencies = 1"),  # migration 17
}

#: table -> column names in order (what the migration test compared before types were declared)
DECLARED_SCHEMA: dict[str, tuple[str, ...]] = {
    table: tuple(column.name for column in declared) for table, declared in DECLARED_COLUMNS.items()
}
JOB_COLUMNS = DECLARED_SCHEMA["jobs"]
WORKER_COLUMNS = DECLARED_SCHEMA["workers"]
EVENT_COLUMNS = DECLARED_SCHEMA["job_events"]
POOL_COLUMNS = DECLARED_SCHEMA["pools"]
USAGE_COLUMNS = DECLARED_SCHEMA["attempt_usage"]

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
    Migration(
        6,
        "pools",
        (
            # One row per configured pool (``PUT /pools/{path}``, or created by a submit that names
            # an unknown pool). Every setting is nullable: NULL inherits from the parent pool or
            # the server's defaults (``corral.domain.pools.resolve``). A guarantee or a limit is
            # NULL in all four of its columns when not set; a resource a limit leaves free holds
            # ``pools.UNLIMITED``. Booleans are 0/1.
            """
            CREATE TABLE pools (
                path TEXT PRIMARY KEY,
                weight DOUBLE PRECISION,
                guarantee_gpus INTEGER,
                guarantee_vram_mb INTEGER,
                guarantee_memory_mb INTEGER,
                guarantee_cpus INTEGER,
                limit_gpus INTEGER,
                limit_vram_mb INTEGER,
                limit_memory_mb INTEGER,
                limit_cpus INTEGER,
                mode TEXT,
                kind TEXT,
                starvation_timeout_s DOUBLE PRECISION,
                aggressive_starvation_timeout_s DOUBLE PRECISION,
                starvation_tolerance DOUBLE PRECISION,
                enable_aggressive_starvation INTEGER,
                allow_aggressive_preemption INTEGER,
                created_at DOUBLE PRECISION NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL
            )
            """,
            # ``default`` always exists; the pools of jobs submitted before this migration get a
            # row each (their ancestors are implied by ``resolve`` and made rows by the next PUT).
            "INSERT INTO pools (path, created_at, updated_at) VALUES ('default', 0, 0)",
            "INSERT INTO pools (path, created_at, updated_at)"
            " SELECT DISTINCT pool, 0, 0 FROM jobs WHERE pool <> 'default'",
        ),
    ),
    Migration(
        7,
        "class-based preemption",
        (
            # A victim: the job or gang it is being stopped for. A preemptor reserved on capacity
            # its victims still hold: its reservation does not expire before this time.
            "ALTER TABLE jobs ADD COLUMN preempted_for TEXT",
            "ALTER TABLE jobs ADD COLUMN victims_deadline DOUBLE PRECISION",
            # The checkpoint phase of a victim (seed 003): asked at, ends at (once extended by
            # 50%, plus the deferrals the job asked for), and what past phases took (for the cost).
            "ALTER TABLE jobs ADD COLUMN checkpoint_requested_at DOUBLE PRECISION",
            "ALTER TABLE jobs ADD COLUMN checkpoint_deadline DOUBLE PRECISION",
            "ALTER TABLE jobs ADD COLUMN checkpoint_extended INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE jobs ADD COLUMN checkpoint_deferred_s DOUBLE PRECISION NOT NULL DEFAULT 0",
            "ALTER TABLE jobs ADD COLUMN checkpoint_durations TEXT NOT NULL DEFAULT ''",
            # When the job last saved a checkpoint on its worker (its heartbeats say), and how many
            # checkpoint phases ended without one.
            "ALTER TABLE jobs ADD COLUMN last_checkpoint_at DOUBLE PRECISION",
            "ALTER TABLE jobs ADD COLUMN checkpoint_failures INTEGER NOT NULL DEFAULT 0",
        ),
    ),
    Migration(
        8,
        "job logs",
        (
            # One row per attempt that wrote output: where its stream ends (``size``, the offset the
            # next chunk starts at) and how many of its first bytes were dropped to stay under
            # CORRAL_LOG_MAX_BYTES. Kept apart from the job row, like checkpoints: no listing reads it.
            """
            CREATE TABLE job_logs (
                job_id TEXT NOT NULL,
                attempt INTEGER NOT NULL,
                size BIGINT NOT NULL,
                dropped BIGINT NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (job_id, attempt)
            )
            """,
            # The bytes, as the chunks the worker sent: [start_offset, end_offset) of the attempt's
            # stream. A chunk is written once (an append at a stored offset is a retry); trimming
            # deletes the oldest chunks and cuts the one that straddles the new start.
            """
            CREATE TABLE job_log_chunks (
                job_id TEXT NOT NULL,
                attempt INTEGER NOT NULL,
                start_offset BIGINT NOT NULL,
                end_offset BIGINT NOT NULL,
                data {blob} NOT NULL,
                PRIMARY KEY (job_id, attempt, start_offset)
            )
            """,
        ),
    ),
    Migration(
        9,
        "retention",
        (
            # The retention loop finds finished jobs oldest first, and expired idempotency keys.
            "CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL",
            "CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at)",
        ),
    ),
    Migration(
        10,
        "pool_starvation",
        (
            # The starvation timers of the pools below their fair share (``core.fairshare``), kept
            # by the admission loop's leader: a new leader, or another replica's ``GET /pools``,
            # sees the timers where the last cycle left them. A pool with no row is not starving.
            """
            CREATE TABLE pool_starvation (
                path TEXT PRIMARY KEY,
                status TEXT NOT NULL,
                below_since DOUBLE PRECISION,
                since DOUBLE PRECISION
            )
            """,
        ),
    ),
    Migration(
        11,
        "claim keys",
        (
            # The Idempotency-Key of the claim that started the job's run: a worker that lost the
            # claim's answer retries with the same key and is handed the same run again. Every
            # claim asks whether its key is known: one index lookup, not a scan of the running.
            "ALTER TABLE jobs ADD COLUMN claim_key TEXT",
            "CREATE INDEX jobs_claim_key ON jobs (claim_key) WHERE claim_key IS NOT NULL",
        ),
    ),
    Migration(
        12,
        "containment",
        (
            # API.md "A job is contained on its host". Where the job starts on its worker
            # (``workdir``): the submitter's directory, or NULL for a fresh per-job directory.
            "ALTER TABLE jobs ADD COLUMN workdir TEXT",
            # What the worker holds its jobs to (``enforcement``, JSON), as it registered.
            "ALTER TABLE workers ADD COLUMN enforcement TEXT NOT NULL DEFAULT '{}'",
        ),
    ),
    Migration(
        13,
        "time limits",
        (
            # API.md "Time limits": the walltime_s a job of the pool's subtree gets when it sets
            # none, and the most a submit may ask for. NULL inherits (the parent pool, else
            # CORRAL_DEFAULT_WALLTIME_S / CORRAL_MAX_WALLTIME_S).
            "ALTER TABLE pools ADD COLUMN default_walltime_s DOUBLE PRECISION",
            "ALTER TABLE pools ADD COLUMN max_walltime_s DOUBLE PRECISION",
        ),
    ),
    Migration(
        14,
        "idempotency keys per user",
        (
            # An Idempotency-Key is its submitter's: another user's same key is a key of their own,
            # neither answered with the first user's jobs nor told (by a 409) that the key exists.
            # The owner is the token's name ('' without auth). The table is built again with the
            # owner in its primary key (SQLite cannot change a primary key in place); the keys
            # stored before are kept as keys of no one's (''): a retry that crosses the upgrade on
            # a server with auth makes its job again, as a retry after the key expired would.
            "CREATE TABLE idempotency_keys_before_14 AS"
            " SELECT key, fingerprint, result, created_at FROM idempotency_keys",
            "DROP TABLE idempotency_keys",
            """
            CREATE TABLE idempotency_keys (
                owner TEXT NOT NULL,
                key TEXT NOT NULL,
                fingerprint TEXT NOT NULL,
                result TEXT NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (owner, key)
            )
            """,
            "INSERT INTO idempotency_keys (owner, key, fingerprint, result, created_at)"
            " SELECT '', key, fingerprint, result, created_at FROM idempotency_keys_before_14",
            "DROP TABLE idempotency_keys_before_14",
            "CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at)",
        ),
    ),
    Migration(
        15,
        "jobs by user",
        (
            # ``GET /jobs?user=`` (``corral jobs --mine``): one user's jobs in submission order,
            # either way, without a scan of everyone's.
            "CREATE INDEX jobs_user_submitted ON jobs (username, submitted_at, id)",
        ),
    ),
    Migration(
        16,
        "usage accounting",
        (
            # API.md "Usage": one row per attempt that held resources, written in the transaction
            # that ended its hold (``SqlStore.compare_and_set``), kept CORRAL_USAGE_RETENTION_DAYS
            # whatever job retention removes. A window's sums read the attempts that ended in or
            # after it (``ended_at``); the retention loop removes the oldest by the same index.
            """
            CREATE TABLE attempt_usage (
                job_id TEXT NOT NULL,
                attempt INTEGER NOT NULL,
                username TEXT,
                pool TEXT NOT NULL,
                worker_id TEXT,
                gpus INTEGER NOT NULL,
                cpus INTEGER NOT NULL,
                submitted_at DOUBLE PRECISION NOT NULL,
                started_at DOUBLE PRECISION NOT NULL,
                ended_at DOUBLE PRECISION NOT NULL,
                wait_s DOUBLE PRECISION,
                status TEXT NOT NULL,
                PRIMARY KEY (job_id, attempt)
            )
            """,
            "CREATE INDEX attempt_usage_ended ON attempt_usage (ended_at)",
        ),
    ),
    Migration(
        17,
        "arrays and dependencies",
        (
            # API.md "Arrays and dependencies". A task of an array: the array's id, the task's index,
            # the array's size and its %N throttle (the claim counts the array's holding tasks
            # through jobs_array: at most N rows per candidate).
            "ALTER TABLE jobs ADD COLUMN array_id TEXT",
            "ALTER TABLE jobs ADD COLUMN array_index INTEGER",
            "ALTER TABLE jobs ADD COLUMN array_size INTEGER",
            "ALTER TABLE jobs ADD COLUMN array_throttle INTEGER",
            "CREATE INDEX jobs_array ON jobs (array_id, status) WHERE array_id IS NOT NULL",
            # The job's after conditions (JSON, '' for none), and whether it still waits on them:
            # the claim and admission pass it over, the dependency loop reads the waiting ones.
            "ALTER TABLE jobs ADD COLUMN depends_on TEXT NOT NULL DEFAULT ''",
            "ALTER TABLE jobs ADD COLUMN awaiting_dependencies INTEGER NOT NULL DEFAULT 0",
            "CREATE INDEX jobs_awaiting ON jobs (submitted_at, id) WHERE awaiting_dependencies = 1",
        ),
    ),
    Migration(
        18,
        "topology",
        (
            # API.md "Topology": where a gang's ranks may sit, as JSON ({"required": LEVEL} or
            # {"preferred": LEVEL}), '' for anywhere. Written at submit, read by the admission.
            "ALTER TABLE jobs ADD COLUMN topology TEXT NOT NULL DEFAULT ''",
        ),
    ),
    Migration(
        19,
        "cluster history",
        (
            # The dashboard overview's last 24 hours (``domain.history``): one row a minute, the
            # minute's start its key, so replicas and a new leader sampling the same minute write
            # it once. The samples loop removes rows past eight days by the key.
            """
            CREATE TABLE cluster_samples (
                at DOUBLE PRECISION NOT NULL,
                queued_jobs INTEGER NOT NULL,
                running_jobs INTEGER NOT NULL,
                gpus_total INTEGER NOT NULL,
                gpus_allocated INTEGER NOT NULL,
                PRIMARY KEY (at)
            )
            """,
        ),
    ),
)
