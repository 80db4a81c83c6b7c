"""What each dashboard page shows, read from the store: plain values for the templates.

Every page reads a bounded amount whatever the cluster's size: counts come from ``GROUP BY``
queries, the job list is one cursor page, a job page is one job and its events. So the pages stay
fast on 10,000 jobs (``tests/browser`` and ``tests/api/test_dashboard.py`` check it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.core import topology
from corral.core.explain import explain
from corral.core.fairshare import FairShareState
from corral.domain.clock import to_rfc3339
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
    percent: float
    reason: str = ""


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


def pools(store: Jobs, fair: FairShareState) -> list[dict[str, Any]]:
    """Each pool with jobs: GPUs used and waited for, its fair share of the GPUs (the part of its
    own jobs, ``corral.core.fairshare``), used over share, and its starvation."""
    counts = store.count_jobs_by_pool()
    total = fair.shares.total
    rows = []
    for pool in sorted(counts):
        by_status = counts[pool]
        holding = sum(by_status.get(status.value, (0, 0))[1] for status in HOLDING)
        waiting = sum(by_status.get(status, (0, 0))[1] for status in ("pending", "blocked"))
        share = fair.shares.own.get(pool)
        fair_gpus = share.fair[0] * total.gpus if share is not None else 0.0
        starving = fair.starvation.get(pool)
        rows.append(
            {
                "pool": pool,
                "jobs": {status: by_status[status][0] for status in STATUS_ORDER if status in by_status},
                "gpus_used": holding,
                "gpus_waiting": waiting,
                "share": fair_gpus,
                "ratio": (holding / fair_gpus) if fair_gpus else 0.0,
                "starvation": starving.status.value.replace("_", " ") if starving is not None else "",
            }
        )
    return rows


#: the overview's usage window: the last seven days
USAGE_WINDOW_S = 7 * 86400.0


def gpu_hours_by_pool(store: Usage, now: float, user: str | None) -> list[tuple[str, float]]:
    """Each pool's GPU-hours over the last seven days (``user``: that user's only), most first."""
    totals = store.usage_totals(now - USAGE_WINDOW_S, now, ("pool",), now, user)
    rows = [(row.pool or "", row.gpu_seconds / 3600) for row in totals]
    return sorted(rows, key=lambda row: (-row[1], row[0]))


def timeline(events: list[JobEvent], now: float) -> list[Segment]:
    """The job's history as consecutive bars, one per status, sized by time spent in it (the last
    one, unless terminal, up to ``now``)."""
    if not events:
        return []
    spans = []
    for index, event in enumerate(events):
        end = events[index + 1].at if index + 1 < len(events) else None
        if end is None:
            end = event.at if event.to_status in TERMINAL else max(now, event.at)
        spans.append((event, max(0.0, end - event.at)))
    total = sum(seconds for _, seconds in spans) or 1.0
    return [
        Segment(
            event.to_status.value,
            to_rfc3339(event.at),
            seconds,
            max(0.5, 100.0 * seconds / total),
            f"{event.reason.code}: {event.reason.message}" if event.reason else "",
        )
        for event, seconds in spans
    ]


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
    return {
        "job": job,
        "wire": redact_job(job_to_wire(job), principal),
        "events": events,
        "timeline": timeline(events, now),
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
