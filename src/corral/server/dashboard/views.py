"""What each dashboard page shows, read from the store: plain values for the templates.

Every page reads a bounded amount whatever the cluster's size: counts come from ``GROUP BY``
queries, the job list is one cursor page, a job page is one job and its events, the overview's
last 24 hours at most 1,440 samples read by their key. So the pages stay
fast on 10,000 jobs (``tests/browser`` and ``tests/api/test_dashboard.py`` check it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.core import topology
from corral.core.explain import explain
from corral.core.fairshare import FairShareState, dominant
from corral.domain.clock import to_rfc3339
from corral.domain.history import GAP_INTERVALS, SAMPLE_EVERY_S, ClusterSample
from corral.domain.pools import Starvation, ancestors, tree_order
from corral.domain.records import Job, JobEvent, Worker
from corral.domain.status import HOLDING, TERMINAL, Status, WorkerStatus
from corral.protocol.wire import gang_status, job_to_wire
from corral.server.auth import Principal, redact_job
from corral.store import Store
from corral.store.base import JobFilter
from corral.store.ports import Jobs, Usage, Workers

STATUS_ORDER = [status.value for status in Status]


@dataclass
class GpuCell:
    index: int
    state: str  # free / reserved / busy / unhealthy
    job_id: str | None = None
    util_pct: float | None = None
    mem_used_mb: float | None = None


@dataclass
class WorkerRow:
    worker: Worker
    gpus: list[GpuCell]
    running: list[str]
    cpus_used: int
    memory_used_mb: int
    last_heartbeat: str | None
    #: the worker's place, ``b1/r07`` (its topology labels, widest first); '' without any
    topology: str = ""


@dataclass
class Segment:
    """One bar of a job's timeline: a status from ``start`` for ``seconds``."""

    status: str
    start: str | None
    seconds: float
    reason: str = ""
    #: its place on the job page's chart (``CHART_WIDTH`` wide)
    x: float = 0.0
    width: float = 0.0


@dataclass
class GpuTotals:
    total: int = 0
    free: int = 0
    reserved: int = 0
    busy: int = 0
    unhealthy: int = 0
    by_model: dict[str, int] = field(default_factory=dict)


def gpu_cells(worker: Worker, holders: dict[int, tuple[str, Status]]) -> list[GpuCell]:
    readings = {reading.index: reading for reading in worker.gpu_stats}
    cells = []
    for index in range(worker.resources.gpus):
        reading = readings.get(index)
        holder = holders.get(index)
        if index in worker.unhealthy_gpus:
            state = "unhealthy"
        elif holder is None:
            state = "free"
        elif holder[1] == Status.RESERVED:
            state = "reserved"
        else:
            state = "busy"
        cells.append(
            GpuCell(
                index,
                state,
                holder[0] if holder else None,
                reading.util_pct if reading else None,
                reading.mem_used_mb if reading else None,
            )
        )
    return cells


def workers(store: Workers, levels: Sequence[str] = ()) -> list[WorkerRow]:
    """Every worker with one cell per GPU (who holds it, its last utilisation reading); grouped by
    topology (``levels``, widest first) when any worker carries a topology label, else by id."""
    holders: dict[str, dict[int, tuple[str, Status]]] = {}
    used: dict[str, tuple[int, int, list[str]]] = {}
    for allocation in store.allocations():
        for index in allocation.gpu_indices:
            holders.setdefault(allocation.worker_id, {})[index] = (allocation.job_id, allocation.status)
        cpus, memory, running = used.get(allocation.worker_id, (0, 0, []))
        used[allocation.worker_id] = (
            cpus + allocation.resources.cpus,
            memory + allocation.resources.memory_mb,
            [*running, allocation.job_id],
        )
    rows = []
    listed = sorted(store.workers(), key=lambda worker: worker.id)
    if topology.labelled(listed, levels):
        listed.sort(key=lambda worker: topology.sort_key(worker, levels))
    for worker in listed:
        cpus, memory, running = used.get(worker.id, (0, 0, []))
        rows.append(
            WorkerRow(
                worker,
                gpu_cells(worker, holders.get(worker.id, {})),
                running,
                cpus,
                memory,
                to_rfc3339(worker.last_heartbeat_at),
                "/".join(value or "-" for value in topology.sort_key(worker, levels))
                if any(level in worker.labels for level in levels)
                else "",
            )
        )
    return rows


def gpu_totals(rows: list[WorkerRow]) -> GpuTotals:
    """GPUs of active workers by state (an unhealthy GPU counts as unhealthy, never as free)."""
    totals = GpuTotals()
    for row in rows:
        if row.worker.status != WorkerStatus.ACTIVE:
            continue
        for cell in row.gpus:
            totals.total += 1
            setattr(totals, cell.state, getattr(totals, cell.state) + 1)
        model = row.worker.gpu_model or "unknown"
        if row.gpus:
            totals.by_model[model] = totals.by_model.get(model, 0) + len(row.gpus)
    return totals


@dataclass
class PoolNode:
    """One row of the pools tree: a pool with its whole subtree's place in the fair share (dominant
    shares of the cluster, 0..1: what the scheduler compares) and its own jobs' GPUs."""

    path: str
    name: str
    depth: int
    weight: float
    #: the subtree's fair share and usage (dominant shares, 0..1)
    fair_share: float
    usage: float
    #: GPUs the pool's own jobs hold and wait for
    gpus_used: int
    gpus_waiting: int
    starvation: str
    jobs: dict[str, int]

    @property
    def ratio(self) -> float:
        """Usage over fair share (0 when the pool is entitled to nothing)."""
        return self.usage / self.fair_share if self.fair_share > 0 else 0.0

    @property
    def state(self) -> str:
        """over / under / at its share, by the starvation tolerance's 0.8 and its mirror 1.2."""
        if self.fair_share <= 0:
            return "idle" if self.usage <= 0 else "over"
        return "under" if self.ratio < 0.8 else "over" if self.ratio > 1.2 else "at"


def pool_tree(store: Jobs, fair: FairShareState) -> list[PoolNode]:
    """Every pool (declared, implied by a descendant, or named by a job), each right before its
    subtree, indented by its depth: a subtree's fair share against its usage, as the scheduler
    weighs siblings against each other."""
    counts = store.count_jobs_by_pool()
    paths = set(fair.pools) | set(counts)
    paths |= {ancestor for path in list(paths) for ancestor in ancestors(path)}
    nodes = []
    for path in sorted(paths, key=tree_order):
        by_status = counts.get(path, {})
        share = fair.shares.pools.get(path)
        starving = fair.starvation.get(path)
        pool = fair.pools.get(path)
        nodes.append(
            PoolNode(
                path=path,
                name=path.rsplit("/", 1)[-1],
                depth=path.count("/"),
                weight=pool.weight if pool is not None else 1.0,
                fair_share=share.fair_share if share is not None else 0.0,
                usage=dominant(share.usage) if share is not None else 0.0,
                gpus_used=sum(by_status.get(status.value, (0, 0))[1] for status in HOLDING),
                gpus_waiting=sum(by_status.get(status, (0, 0))[1] for status in ("pending", "blocked")),
                starvation=""
                if starving is None or starving.status == Starvation.NON_STARVING
                else starving.status.value.replace("_", " "),
                jobs={status: by_status[status][0] for status in STATUS_ORDER if status in by_status},
            )
        )
    return nodes


#: the overview's history charts: the last 24 hours, a tick every 3 hours (UTC), a line broken
#: where samples are missing for longer than ``GAP_INTERVALS`` sampling intervals (the servers
#: were down: nothing is known)
HISTORY_WINDOW_S = 86400.0
_HISTORY_TICK_S = 3 * 3600.0
#: a history chart's plot area in its own units (the SVG scales to the page)
PLOT_WIDTH = 560.0
PLOT_HEIGHT = 120.0


@dataclass
class HistoryChart:
    """One series of the cluster's history over the window, as an SVG draws it: polylines (one per
    run of samples without a gap), an optional ceiling line (the GPUs there were), axis ticks."""

    title: str
    unit: str  # of the latest value: "1 job waiting", "2 jobs waiting"
    lines: list[str]
    ceiling: list[str]
    x_ticks: list[Tick]
    y_ticks: list[tuple[float, str]]
    latest: int | None
    peak: int
    samples: int


def _nice_ceiling(value: float) -> float:
    """The axis top for ``value``: 1, 2 or 5 times a power of ten, at least ``value``."""
    top = 1.0
    while top < value:
        for factor in (2.0, 2.5, 2.0):
            top *= factor
            if top >= value:
                break
    return top


def history_chart(
    samples: Sequence[ClusterSample],
    now: float,
    title: str,
    unit: tuple[str, str],
    value: str,
    ceiling: str | None = None,
    every_s: float = SAMPLE_EVERY_S,
) -> HistoryChart:
    """The ``value`` attribute of ``samples`` (and ``ceiling``'s, drawn as a dashed limit) over the
    24 hours before ``now`` (``unit``: singular and plural, as the latest value reads), scaled to the
    plot: time to x, the value to y from a round top; the line broken where more than
    ``GAP_INTERVALS`` intervals of ``every_s`` have no sample."""
    start = now - HISTORY_WINDOW_S
    gap_s = GAP_INTERVALS * every_s
    shown = [sample for sample in samples if start <= sample.at <= now]
    values = [int(getattr(sample, value)) for sample in shown]
    ceilings = [int(getattr(sample, ceiling)) for sample in shown] if ceiling else []
    top = _nice_ceiling(max([*values, *ceilings, 1]))

    def point(sample: ClusterSample, amount: int) -> str:
        x = PLOT_WIDTH * (sample.at - start) / HISTORY_WINDOW_S
        return f"{x:.1f},{PLOT_HEIGHT - PLOT_HEIGHT * amount / top:.1f}"

    def lines(amounts: list[int]) -> list[str]:
        runs: list[list[str]] = []
        previous: float | None = None
        for sample, amount in zip(shown, amounts, strict=True):
            if previous is None or sample.at - previous > gap_s:
                runs.append([])
            runs[-1].append(point(sample, amount))
            previous = sample.at
        # a run of one sample is drawn as a short flat stroke, so that it shows
        return [" ".join(run) if len(run) > 1 else f"{run[0]} {_nudged(run[0])}" for run in runs]

    first_tick = start - start % _HISTORY_TICK_S + _HISTORY_TICK_S
    x_ticks = []
    at = first_tick
    while at <= now:
        x_ticks.append(Tick(PLOT_WIDTH * (at - start) / HISTORY_WINDOW_S, (to_rfc3339(at) or "")[11:16]))
        at += _HISTORY_TICK_S
    y_ticks = [(PLOT_HEIGHT - PLOT_HEIGHT * part, f"{top * part:g}") for part in (0.0, 0.5, 1.0)]
    latest = values[-1] if values else None
    return HistoryChart(
        title,
        unit[0] if latest == 1 else unit[1],
        lines(values),
        lines(ceilings) if ceiling else [],
        x_ticks,
        y_ticks,
        latest,
        max(values, default=0),
        len(shown),
    )


def _nudged(point: str) -> str:
    x, y = point.split(",")
    return f"{float(x) + 2:.1f},{y}"


def interval_words(seconds: float) -> str:
    """The sampling interval as the overview says it: ``minute``, ``5 minutes``, ``30 s``."""
    if seconds % 60:
        return f"{seconds:g} s"
    minutes = seconds / 60
    return "minute" if minutes == 1 else f"{minutes:g} minutes"


def cluster_history(
    samples: Sequence[ClusterSample], now: float, every_s: float = SAMPLE_EVERY_S
) -> list[HistoryChart]:
    """The overview's two charts: the queue's length, and the GPUs allocated under the GPUs there
    were (samples taken once per ``every_s``: ``CORRAL_HISTORY_INTERVAL_S``)."""
    return [
        history_chart(
            samples, now, "Queue length", ("job waiting", "jobs waiting"), "queued_jobs", every_s=every_s
        ),
        history_chart(
            samples, now, "GPUs allocated", ("GPU held", "GPUs held"), "gpus_allocated", "gpus_total", every_s
        ),
    ]


#: the overview's usage window: the last seven days
USAGE_WINDOW_S = 7 * 86400.0


def gpu_hours_by_pool(store: Usage, now: float, user: str | None) -> list[tuple[str, float]]:
    """Each pool's GPU-hours over the last seven days (``user``: that user's only), most first."""
    totals = store.usage_totals(now - USAGE_WINDOW_S, now, ("pool",), now, user)
    rows = [(row.pool or "", row.gpu_seconds / 3600) for row in totals]
    return sorted(rows, key=lambda row: (-row[1], row[0]))


#: the width of the dashboard's SVG charts in their own units (they scale to the page's width)
CHART_WIDTH = 1000.0
#: tick steps a time axis picks from (seconds): the smallest that keeps it to eight ticks or fewer
_TICK_STEPS = (
    0.1,
    0.2,
    0.5,
    1,
    2,
    5,
    10,
    15,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    10800,
    21600,
    43200,
    86400,
)


@dataclass
class Tick:
    x: float
    label: str


@dataclass
class TimelineChart:
    """A job's history drawn on a time axis: one bar per status, from its event to the next."""

    segments: list[Segment]
    ticks: list[Tick]
    start: str
    span_s: float


def axis_label(seconds: float, step: float) -> str:
    """``45 s``, ``12 min``, ``1.5 h``, ``2 d``: a tick's time in its axis's unit (the step's: one
    axis never mixes seconds and minutes)."""
    if step < 60:
        return f"{seconds:g} s"
    if step < 3600:
        return f"{seconds / 60:g} min"
    if step < 86400:
        return f"{seconds / 3600:g} h"
    return f"{seconds / 86400:g} d"


def axis_ticks(span_s: float) -> list[tuple[float, float, float]]:
    """Ticks for an axis of ``span_s`` seconds: ``(seconds from its start, x, step)`` at a round
    step (the smallest that keeps eight ticks or fewer)."""
    step = next((step for step in _TICK_STEPS if span_s / step <= 8), _TICK_STEPS[-1])
    count = int(span_s // step)
    return [(index * step, CHART_WIDTH * index * step / span_s, step) for index in range(count + 1)]


def timeline(events: list[JobEvent], now: float) -> TimelineChart:
    """The job's history on a time axis: one bar per status, from its event to the next (the last
    one, unless terminal, up to ``now``), and round ticks counted from its submission."""
    if not events:
        return TimelineChart([], [], "", 0.0)
    spans = []
    for index, event in enumerate(events):
        end = events[index + 1].at if index + 1 < len(events) else None
        if end is None:
            end = event.at if event.to_status in TERMINAL else max(now, event.at)
        spans.append((event, max(0.0, end - event.at)))
    first = events[0].at
    span = max(1.0, sum(seconds for _, seconds in spans))
    segments = [
        Segment(
            event.to_status.value,
            to_rfc3339(event.at),
            seconds,
            f"{event.reason.code}: {event.reason.message}" if event.reason else "",
            x=CHART_WIDTH * (event.at - first) / span,
            width=max(2.0, CHART_WIDTH * seconds / span),
        )
        for event, seconds in spans
    ]
    ticks = [
        Tick(x, "0" if seconds == 0 else "+" + axis_label(seconds, step))
        for seconds, x, step in axis_ticks(span)
    ]
    return TimelineChart(segments, ticks, to_rfc3339(first) or "", span)


#: the job page's field groups: wire keys in the order they read best; a key no group names
#: (a field added later) shows under "more", so the page never hides one
FIELD_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "Identity",
        ("id", "name", "command", "user", "pool", "workdir", "env", "gang_id", "gang_size", "gang_index",
         "array_id", "array_index", "array_size", "after"),
    ),
    (
        "Resources",
        ("resources", "constraints", "topology", "worker_id", "gpu_indices", "gpu_util_pct", "rss_mb",
         "progress"),
    ),
    (
        "Scheduling",
        ("status", "reason", "priority", "preemption_class", "max_retries", "attempts", "attempt",
         "watchdog_retries", "preempted_count", "reservation_epoch", "preemption_epoch", "cancel_requested",
         "preempted_for", "estimated_start_at", "planned_workers", "checkpoint_mode", "has_checkpoint",
         "checkpoint_failures"),
    ),
    (
        "Timing",
        ("submitted_at", "reserved_at", "started_at", "drain_started_at", "last_heartbeat_at",
         "last_checkpoint_at", "checkpoint_deadline", "finished_at", "deadline_at", "walltime_s", "budget_s",
         "stall_timeout_s"),
    ),
    ("Outcome", ("exit_code", "error", "output_tail")),
)  # fmt: skip


def field_groups(wire: dict[str, Any]) -> list[tuple[str, list[tuple[str, Any]]]]:
    """The job's wire fields in ``FIELD_GROUPS``, each group's empty fields left out (a job that
    never ran has no exit code to show), the fields no group names under "More"."""
    named = {key for _, keys in FIELD_GROUPS for key in keys}
    groups = [
        (title, [(key, wire[key]) for key in keys if key in wire and wire[key] not in (None, [], {}, "")])
        for title, keys in FIELD_GROUPS
    ]
    groups.append(
        ("More", [(key, value) for key, value in wire.items() if key not in named and value is not None])
    )
    return [(title, fields) for title, fields in groups if fields]


def job_page(store: Store, job: Job, now: float, principal: Principal | None) -> dict[str, Any]:
    """A job's page. Its fields are the API's job object as ``principal`` may see it: the same
    redaction (``auth.redact_job``) hides the environment values of someone else's job."""
    events = store.jobs.job_events(job.id)
    workers_list, allocations, holds = [], [], []
    if job.status == Status.PENDING:
        workers_list = store.workers.workers()
        allocations = store.workers.allocations()
        holds = store.gangs.list_holds()
    reasons = explain(job, workers_list, allocations, holds, now)
    wire = redact_job(job_to_wire(job), principal)
    return {
        "job": job,
        "wire": wire,
        "events": events,
        "timeline": timeline(events, now),
        "field_groups": field_groups(wire),
        "why": reasons,
        "logs": store.logs.log_sizes(job.id),
        "terminal": job.status in TERMINAL,
        "attempt": job.attempts,
    }


def gang_page(store: Jobs, gang_id: str) -> dict[str, Any] | None:
    tasks = store.gang_tasks(gang_id)
    if not tasks:
        return None
    story = [(event.at, task.gang_index, event) for task in tasks for event in store.job_events(task.id)]
    story.sort(key=lambda item: (item[0], item[1] or 0))
    return {
        "gang_id": gang_id,
        "gang_state": gang_status(tasks),
        "tasks": tasks,
        "story": [(to_rfc3339(at), rank, event) for at, rank, event in story],
        "terminal": all(task.status in TERMINAL for task in tasks),
    }


def job_list(store: Jobs, filters: JobFilter, limit: int, after: tuple[float, str] | None) -> list[Job]:
    return store.list_jobs(filters, limit, after)
