"""Every ``corral_`` metric, declared once (names and labels as ``shared/API.md`` lists them).

Each server owns a ``Metrics`` with its own registry, so tests can run many servers in one process.
Gauges that describe the whole cluster (jobs by status, workers, GPUs) are read from the store at
scrape time by ``StoreCollector`` rather than kept in step by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

# ``*_created`` series double the exposition and no dashboard of ours reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400)
_DURATION_BUCKETS = (0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600, 7200, 14400, 43200, 86400)
_CYCLE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2.5, 5)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.jobs_submitted = Counter(
            "corral_jobs_submitted_total", "Jobs submitted (a gang counts each task)", registry=registry
        )
        self.jobs_claimed = Counter("corral_jobs_claimed_total", "Jobs claimed by workers", registry=registry)
        self.jobs_completed = Counter(
            "corral_jobs_completed_total", "Jobs that ended done", registry=registry
        )
        self.jobs_failed = Counter(
            "corral_jobs_failed_total", "Jobs that ended failed after /fail", registry=registry
        )
        self.jobs_retried = Counter(
            "corral_jobs_retried_total", "Failed attempts that were re-queued", registry=registry
        )
        self.jobs_cancelled = Counter(
            "corral_jobs_cancelled_total", "Jobs that ended cancelled", registry=registry
        )
        self.jobs_reaped = Counter(
            "corral_jobs_reaped_total", "Running jobs whose lease expired", ["outcome"], registry=registry
        )
        self.preemptions = Counter(
            "corral_preemptions_total",
            "Running jobs told to stop, by reason and the victim's pool",
            ["reason", "pool"],
            registry=registry,
        )
        self.preemption_checkpoint_duration = Histogram(
            "corral_preemption_checkpoint_duration_seconds",
            "From a preemption's checkpoint request to the checkpoint received",
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 900, 1800),
            registry=registry,
        )
        self.preemption_victim_requeue = Counter(
            "corral_preemption_victim_requeue_total",
            "Preempted jobs and gangs put back in the queue",
            registry=registry,
        )
        self.preemption_failed_checkpoint = Counter(
            "corral_preemption_failed_checkpoint_total",
            "Preemption checkpoint phases that ended without a checkpoint (late, or the job stopped first)",
            registry=registry,
        )
        self.queue_wait = Histogram(
            "corral_job_queue_wait_seconds", "Submission to claim", buckets=_WAIT_BUCKETS, registry=registry
        )
        self.execution_duration = Histogram(
            "corral_job_execution_duration_seconds",
            "Start to done",
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        self.cycle_seconds = Histogram(
            "corral_scheduling_cycle_seconds",
            "Duration of one pass of a background loop",
            ["loop"],
            buckets=_CYCLE_BUCKETS,
            registry=registry,
        )
        self.loop_leader = Gauge(
            "corral_loop_leader", "1 where this replica runs the loop", ["loop"], registry=registry
        )
        self.backfill_reservations = Gauge(
            "corral_backfill_reservations",
            "Waiting gangs and jobs with a reservation (a planned start) after the last admission cycle",
            registry=registry,
        )
        self.backfill_started = Counter(
            "corral_backfill_started_total",
            "Jobs started on a worker with a reservation, ending before it starts (backfill)",
            registry=registry,
        )
        self.gangs_preempted = Counter(
            "corral_gangs_preempted_total", "Gang drains started", registry=registry
        )
        self.gang_force_drained = Counter(
            "corral_gang_preemptions_force_drained_total",
            "Preempting gang tasks force-drained after the preempt timeout",
            registry=registry,
        )
        self.gang_drains_completed = Counter(
            "corral_gang_preemptions_completed_total",
            "Gang drains completed, by outcome (blocked / failed)",
            ["outcome"],
            registry=registry,
        )
        self.gang_drain_seconds = Histogram(
            "corral_gang_preemption_drain_seconds",
            "Drain start to completion",
            buckets=(0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 30, 45, 60, 120),
            registry=registry,
        )
        self.gangs_reserved = Counter(
            "corral_gangs_reserved_total",
            "Gangs reserved, by the admission cycle or by a preemption on its victims' room",
            registry=registry,
        )
        self.watchdog_trips = Counter(
            "corral_watchdog_trips_total",
            "Watchdog trips reported by workers, by kind and outcome (requeued / failed)",
            ["kind", "outcome"],
            registry=registry,
        )
        self.dead_workers_flagged = Counter(
            "corral_dead_workers_flagged_total",
            "Workers flagged dead: heartbeat frozen while holding running jobs",
            registry=registry,
        )
        self.retention_removed = Counter(
            "corral_retention_removed_total",
            "Rows removed past their retention, by kind (jobs / idempotency_keys / usage)",
            ["kind"],
            registry=registry,
        )
        self.loop_errors = Counter(
            "corral_loop_errors_total", "Passes of a background loop that raised", ["loop"], registry=registry
        )
        self.log_bytes_stored = Counter(
            "corral_log_bytes_stored_total",
            "Bytes of job output stored (retries not counted)",
            registry=registry,
        )
        self.log_bytes_dropped = Counter(
            "corral_log_bytes_dropped_total",
            "Bytes of job output dropped to stay under CORRAL_LOG_MAX_BYTES per attempt",
            registry=registry,
        )

    def watch_store(self, read: Callable[[], tuple[dict[str, int], dict[str, int], dict[str, int]]]) -> None:
        """Expose the cluster gauges, read through ``read`` at every scrape."""
        self.registry.register(StoreCollector(read))

    def watch_connections(self, read: Callable[[], tuple[int, int, dict[str, int]]]) -> None:
        """Expose the open connections and the refusals, read through ``read`` at every scrape."""
        self.registry.register(ConnectionsCollector(read))

    def watch_store_size(self, read: Callable[[], tuple[int, float | None]]) -> None:
        """Expose the store's size and its oldest kept job, read through ``read`` at every scrape."""
        self.registry.register(StoreSizeCollector(read))


class ConnectionsCollector(Collector):
    """``corral_http_connections`` (open now, and the limit in force) and
    ``corral_http_connections_refused_total{reason}``: ``full`` (503), ``client_share`` (429),
    ``dropped`` (closed at accept, past the room kept for answering)."""

    def __init__(self, read: Callable[[], tuple[int, int, dict[str, int]]]) -> None:
        self._read = read

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        open_now, limit, refused = self._read()
        gauge = GaugeMetricFamily("corral_http_connections", "HTTP connections", labels=["state"])
        gauge.add_metric(["open"], open_now)
        gauge.add_metric(["limit"], limit)
        yield gauge
        counter = CounterMetricFamily(
            "corral_http_connections_refused", "HTTP connections refused, by reason", labels=["reason"]
        )
        for reason, count in sorted(refused.items()):
            counter.add_metric([reason], count)
        yield counter


class StoreSizeCollector(Collector):
    """``corral_store_size_bytes`` and ``corral_oldest_job_submitted_timestamp_seconds`` (absent
    while the store holds no job): what retention keeps in check."""

    def __init__(self, read: Callable[[], tuple[int, float | None]]) -> None:
        self._read = read

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        size, oldest = self._read()
        yield GaugeMetricFamily("corral_store_size_bytes", "What the store takes on disk", value=size)
        if oldest is not None:
            yield GaugeMetricFamily(
                "corral_oldest_job_submitted_timestamp_seconds",
                "Submission time of the oldest job the store keeps (Unix seconds)",
                value=oldest,
            )


class StoreCollector(Collector):
    """``corral_jobs{status}``, ``corral_workers{status}``, ``corral_gpus{state}`` at scrape time."""

    JOB_STATUSES = (
        "pending",
        "blocked",
        "reserved",
        "running",
        "preempting",
        "preempted",
        "done",
        "failed",
        "cancelled",
    )
    WORKER_STATUSES = ("active", "offline", "draining")
    GPU_STATES = ("free", "reserved", "busy")

    def __init__(self, read: Callable[[], tuple[dict[str, int], dict[str, int], dict[str, int]]]) -> None:
        self._read = read

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs, workers, gpus = self._read()
        for name, help_text, label, keys, values in (
            ("corral_jobs", "Jobs by status", "status", self.JOB_STATUSES, jobs),
            ("corral_workers", "Workers by status", "status", self.WORKER_STATUSES, workers),
            ("corral_gpus", "GPUs of active workers by state", "state", self.GPU_STATES, gpus),
        ):
            family = GaugeMetricFamily(name, help_text, labels=[label])
            for key in keys:
                family.add_metric([key], values.get(key, 0))
            yield family
