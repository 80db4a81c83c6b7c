"""Files in, ``corral.sim.workload`` values out; a bad value stops the run before it starts, with
an ``InputError`` naming the file, the line and the column.

Formats (shared/API.md "The simulator's input"):

- a **workload** CSV with a header: ``job_id, submit_time, duration, gpus`` required; ``gang_size,
  pool, user, preemption_class, checkpoint, checkpoint_every_s, cpus, memory_mb, vram_mb, walltime``
  (seconds: the job's ``walltime_s``), ``array`` (``0-99%8``: one task per index, ``<job_id>.<index>``)
  and ``after`` (``ok:JOB any:JOB``, space- or semicolon-separated workload job ids) optional
  and ``topology`` (``required:topology.rack``, ``preferred:topology.block``) optional
  (a missing column or an empty cell takes the submit default);
- the **Alibaba GPU trace** (``shared/traces/alibaba-gpu-v2023/jobs.csv``, recognised by its
  header) as it is: ``num_gpu`` whole GPUs (a fractional ``gpu_milli`` share counts as one whole
  GPU: corral allocates whole GPUs), ``cpu_milli`` rounded up to whole CPUs, ``memory_mib`` as MB,
  ``qos`` as the preemption class (``QOS_CLASS``), no checkpoints (production pods have none);
  pods never scheduled in production have no duration and are reported apart;
- a **cluster** CSV: ``worker_id, gpus`` required; ``cpus, memory_mb, vram_mb, gpu_model``,
  ``rack`` and ``block`` (the worker's ``topology.rack`` and ``topology.block`` labels) and
  ``count`` (the row repeated as ``<worker_id>-0`` .. ``<worker_id>-<count-1>``) optional; or the
  Alibaba node list (``sn, cpu_milli, memory_mib, gpu, model``) as it is, one worker per node;
- a **pools** file: JSON ``{"pools": {"<path>": {<the PUT /pools body>}, ...}}``;
- **pool assignment** from the Helios Venus quotas (``cluster_gpu_number.csv``): each virtual
  cluster's mean quota over the file's days; jobs are drawn to pools in proportion to it with a
  seeded generator, and each pool gets a guarantee of its quota's share of the cluster's GPUs.
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from corral.core import dependencies
from corral.domain import errors
from corral.domain import pools as pool_rules
from corral.domain.arrays import parse_array
from corral.domain.pools import PoolKind, PoolMode, PoolSettings
from corral.domain.records import Worker
from corral.domain.resources import Resources
from corral.domain.status import WorkerStatus
from corral.sim.workload import CHECKPOINT_MODES, Cluster, Unscheduled, Workload, WorkloadJob

__all__ = [
    "InputError",
    "Workload",
    "WorkloadJob",
    "derived_walltime",
    "read_cluster",
    "read_pools",
    "read_workload",
    "with_walltimes",
]

T = TypeVar("T")

WORKLOAD_REQUIRED = ("job_id", "submit_time", "duration", "gpus")
WORKLOAD_OPTIONAL = (
    "gang_size", "pool", "user", "preemption_class", "checkpoint", "checkpoint_every_s",
    "cpus", "memory_mb", "vram_mb", "walltime", "array", "after", "topology",
)  # fmt: skip
ALIBABA_COLUMNS = ("job_id", "submit_time", "start_time", "duration", "num_gpu", "gpu_milli", "qos")
ALIBABA_NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
CLUSTER_REQUIRED = ("worker_id", "gpus")
CLUSTER_OPTIONAL = ("cpus", "memory_mb", "vram_mb", "gpu_model", "count", "rack", "block")
#: the cluster CSV's topology columns as the worker labels they become (API.md "Topology")
TOPOLOGY_COLUMNS = (("block", "topology.block"), ("rack", "topology.rack"))
#: the Alibaba trace's QoS as corral's preemption class: latency-sensitive work at 7 (never
#: preempted without a checkpoint), guaranteed 6, burstable 4, best-effort 2 (preempted first)
QOS_CLASS = {"LS": 7, "Guaranteed": 6, "Burstable": 4, "BE": 2}
POOL_FIELDS = {
    "weight", "guarantee", "limits", "mode", "kind", "starvation_timeout_s",
    "aggressive_starvation_timeout_s", "starvation_tolerance", "enable_aggressive_starvation",
    "allow_aggressive_preemption", "default_walltime_s", "max_walltime_s",
}  # fmt: skip


class InputError(Exception):
    """A file the simulator cannot read: where (file, line, column) and what is wrong."""

    def __init__(self, path: str | Path, line: int | None, column: int | str | None, message: str) -> None:
        self.path, self.line, self.column, self.message = str(path), line, column, message
        where = self.path
        if line is not None:
            where += f":{line}"
        if column is not None:
            where += f": column {column}"
        super().__init__(f"{where}: {message}")


# --- CSV plumbing ---------------------------------------------------------------------------------


class _Rows:
    """A CSV file's rows as dicts, each with its line number; cells are checked by ``cell``."""

    def __init__(self, path: Path, required: Sequence[str], known: Sequence[str] | None) -> None:
        self.path = path
        try:
            self._handle = path.open(newline="", encoding="utf-8")
        except OSError as error:
            raise InputError(path, None, None, f"cannot open: {error.strerror or error}") from None
        self._reader = csv.reader(self._handle)
        try:
            header = next(self._reader)
        except StopIteration:
            self._handle.close()
            raise InputError(path, 1, None, "empty file: expected a header line") from None
        self.header = [name.strip() for name in header]
        self.index = {name: position for position, name in enumerate(self.header)}
        for name in required:
            if name not in self.index:
                self._handle.close()
                raise InputError(
                    path, 1, None, f"missing required column {name!r} (have: {', '.join(self.header)})"
                )
        if known is not None:
            for position, name in enumerate(self.header):
                if name not in known:
                    self._handle.close()
                    raise InputError(
                        path, 1, f"{position + 1} ({name})", f"unknown column; expected {', '.join(known)}"
                    )

    def close(self) -> None:
        self._handle.close()

    def __iter__(self) -> Iterator[tuple[int, list[str]]]:
        with self._handle:
            for row in self._reader:
                line = self._reader.line_num
                if not row or all(not cell.strip() for cell in row):
                    continue
                if len(row) != len(self.header):
                    raise InputError(
                        self.path, line, None, f"{len(row)} fields, the header has {len(self.header)}"
                    )
                yield line, row

    def raw(self, row: list[str], name: str) -> str:
        position = self.index.get(name)
        return "" if position is None else row[position].strip()

    def cell(
        self, line: int, row: list[str], name: str, parse: Callable[[str], T], default: T | None = None
    ) -> T:
        """The cell of column ``name`` parsed, or ``default`` when absent or empty (an error when
        there is no default: the column is required)."""
        text = self.raw(row, name)
        if text == "":
            if default is not None:
                return default
            raise InputError(self.path, line, self._column(name), "empty; a value is required")
        try:
            return parse(text)
        except ValueError as error:
            raise InputError(self.path, line, self._column(name), f"{error} (got {text!r})") from None

    def _column(self, name: str) -> str:
        return f"{self.index.get(name, -1) + 1} ({name})"


def _whole(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = float(text)
        if not value.is_integer():
            raise ValueError("expected a whole number")
        number = int(value)
        if number < minimum or (maximum is not None and number > maximum):
            bound = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
            raise ValueError(f"expected a whole number {bound}")
        return number

    return parse


def _seconds(minimum: float, strict: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError("expected a number of seconds") from None
        if not math.isfinite(value) or value < minimum or (strict and value == minimum):
            raise ValueError(f"expected seconds {'>' if strict else '>='} {minimum:g}")
        return value

    return parse


def _choice(options: Sequence[str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return text

    return parse


def _array(text: str) -> str:
    """An array expression, checked as a submit checks it."""
    try:
        parse_array(text)
    except errors.InvalidRequest as error:
        raise ValueError(str(error)) from None
    return text


def _after(text: str) -> tuple[tuple[str, str], ...]:
    """``ok:JOB any:JOB`` (or ``;``-separated) as (when, job id) conditions."""
    conditions = []
    for part in text.replace(";", " ").split():
        when, _, named = part.rpartition(":")
        when = when or "ok"
        if when not in dependencies.WHEN or not named:
            raise ValueError(f"{part!r} is not WHEN:JOB_ID with WHEN one of {', '.join(dependencies.WHEN)}")
        conditions.append((when, named))
    return tuple(conditions)


def _topology(text: str) -> tuple[str, str]:
    """``required:LEVEL`` or ``preferred:LEVEL`` (a gang's ``topology``)."""
    kind, _, level = text.strip().partition(":")
    if kind not in ("required", "preferred") or not level:
        raise ValueError(f"{text!r} is not required:LEVEL or preferred:LEVEL")
    return kind, level


def _pool_path(text: str) -> str:
    return pool_rules.check_path(text)


# --- workloads ------------------------------------------------------------------------------------


def read_workload(path: str | Path) -> Workload:
    """A workload CSV, or the Alibaba trace as it is (recognised by its header)."""
    file = Path(path)
    rows = _Rows(file, (), None)
    if all(name in rows.index for name in ALIBABA_COLUMNS):
        return _alibaba(rows)
    rows.close()
    rows = _Rows(file, WORKLOAD_REQUIRED, (*WORKLOAD_REQUIRED, *WORKLOAD_OPTIONAL))
    jobs: list[WorkloadJob] = []
    seen: dict[str, int] = {}
    for line, row in rows:
        job_id = rows.cell(line, row, "job_id", str)
        if job_id in seen:
            raise InputError(
                file, line, rows._column("job_id"), f"job_id {job_id!r} repeats line {seen[job_id]}"
            )
        seen[job_id] = line
        every = rows.raw(row, "checkpoint_every_s")
        walltime = rows.raw(row, "walltime")
        jobs.append(
            WorkloadJob(
                job_id=job_id,
                submit_time=rows.cell(line, row, "submit_time", _seconds(0)),
                duration=rows.cell(line, row, "duration", _seconds(0)),
                gpus=rows.cell(line, row, "gpus", _whole(0)),
                gang_size=rows.cell(line, row, "gang_size", _whole(1), 1),
                pool=rows.cell(line, row, "pool", _pool_path, pool_rules.DEFAULT_POOL),
                user=rows.raw(row, "user") or None,
                preemption_class=rows.cell(line, row, "preemption_class", _whole(0, 10), 5),
                checkpoint=rows.cell(line, row, "checkpoint", _choice(CHECKPOINT_MODES), "none"),
                checkpoint_every_s=(
                    rows.cell(line, row, "checkpoint_every_s", _seconds(0, strict=True)) if every else None
                ),
                cpus=rows.cell(line, row, "cpus", _whole(0), 0),
                memory_mb=rows.cell(line, row, "memory_mb", _whole(0), 0),
                vram_mb=rows.cell(line, row, "vram_mb", _whole(0), 0),
                walltime=rows.cell(line, row, "walltime", _seconds(0, strict=True)) if walltime else None,
                array=rows.cell(line, row, "array", _array) if rows.raw(row, "array") else None,
                after=rows.cell(line, row, "after", _after) if rows.raw(row, "after") else (),
                topology=rows.cell(line, row, "topology", _topology) if rows.raw(row, "topology") else None,
            )
        )
    return Workload(tuple(jobs), name=file.stem)


def _alibaba(rows: _Rows) -> Workload:
    jobs: list[WorkloadJob] = []
    unscheduled: list[Unscheduled] = []
    for line, row in rows:
        job_id = rows.cell(line, row, "job_id", str)
        submit = rows.cell(line, row, "submit_time", _seconds(0))
        gpus = rows.cell(line, row, "num_gpu", _whole(0))
        if rows.raw(row, "duration") == "":
            unscheduled.append(Unscheduled(job_id, submit, gpus))
            continue
        qos = rows.cell(line, row, "qos", _choice(tuple(QOS_CLASS)))
        jobs.append(
            WorkloadJob(
                job_id=job_id,
                submit_time=submit,
                duration=rows.cell(line, row, "duration", _seconds(0)),
                gpus=gpus,
                preemption_class=QOS_CLASS[qos],
                cpus=math.ceil(rows.cell(line, row, "cpu_milli", _whole(0), 0) / 1000),
                memory_mb=rows.cell(line, row, "memory_mib", _whole(0), 0),
                production_start=rows.cell(line, row, "start_time", _seconds(0)),
            )
        )
    return Workload(tuple(jobs), name=rows.path.parent.name or rows.path.stem, unscheduled=tuple(unscheduled))


#: a derived walltime is a whole number of these (users ask for round limits: 15 min, 1 h, 4 h)
WALLTIME_STEP_S = 900.0


def derived_walltime(duration: float, factor: float) -> float:
    """The ``walltime_s`` a user would have asked for a job that ran ``duration`` seconds: its
    runtime times ``factor``, rounded up to the next 15 minutes (at least 15 minutes).

    Why this shape: a trace records how long jobs ran, not what their owners asked for, and a
    scheduler that plans with limits needs the asks. Users over-ask (Slurm sites report requested
    limits several times the runtime) and ask in round steps; a factor above 1 keeps every job
    within its limit (none is ended by it), a factor below 1 ends the longest ones at it."""
    return max(1, math.ceil(duration * factor / WALLTIME_STEP_S)) * WALLTIME_STEP_S


def with_walltimes(workload: Workload, factor: float) -> Workload:
    """``workload`` with a ``derived_walltime`` for every job that declares none (the Alibaba
    trace has no limits; a workload CSV keeps the ones its ``walltime`` column gives)."""
    if not math.isfinite(factor) or factor <= 0:
        raise ValueError("the walltime factor must be a number > 0")
    jobs = tuple(
        job if job.walltime is not None else replace(job, walltime=derived_walltime(job.duration, factor))
        for job in workload.jobs
    )
    return replace(workload, jobs=jobs)


def alibaba_nodes_beside(workload_path: str | Path) -> Path | None:
    """The Alibaba node list next to its jobs.csv, the trace's own cluster."""
    candidate = Path(workload_path).parent / "openb_node_list_gpu_node.csv"
    return candidate if candidate.exists() else None


# --- clusters -------------------------------------------------------------------------------------


def read_cluster(path: str | Path) -> Cluster:
    """A cluster CSV, or the Alibaba node list as it is (recognised by its header)."""
    file = Path(path)
    rows = _Rows(file, (), None)
    workers: list[Worker] = []
    seen: dict[str, int] = {}

    def add(line: int, column: str, worker: Worker) -> None:
        if worker.id in seen:
            raise InputError(file, line, column, f"worker {worker.id!r} repeats line {seen[worker.id]}")
        seen[worker.id] = line
        workers.append(worker)

    if all(name in rows.index for name in ALIBABA_NODE_COLUMNS):
        for line, row in rows:
            resources = Resources(
                gpus=rows.cell(line, row, "gpu", _whole(0)),
                memory_mb=rows.cell(line, row, "memory_mib", _whole(0)),
                cpus=rows.cell(line, row, "cpu_milli", _whole(0)) // 1000,
            )
            model = rows.raw(row, "model") or None
            add(line, rows._column("sn"), _worker(rows.cell(line, row, "sn", str), resources, model))
        return Cluster(tuple(workers), name=file.stem)
    rows.close()
    rows = _Rows(file, CLUSTER_REQUIRED, (*CLUSTER_REQUIRED, *CLUSTER_OPTIONAL))
    for line, row in rows:
        name = rows.cell(line, row, "worker_id", str)
        resources = Resources(
            gpus=rows.cell(line, row, "gpus", _whole(0)),
            vram_mb=rows.cell(line, row, "vram_mb", _whole(0), 0),
            memory_mb=rows.cell(line, row, "memory_mb", _whole(0), 0),
            cpus=rows.cell(line, row, "cpus", _whole(0), 0),
        )
        model = rows.raw(row, "gpu_model") or None
        labels = {label: rows.raw(row, column) for column, label in TOPOLOGY_COLUMNS if rows.raw(row, column)}
        count = rows.cell(line, row, "count", _whole(1), 0)
        if count == 0:
            add(line, rows._column("worker_id"), _worker(name, resources, model, labels))
        else:
            width = len(str(count - 1))
            for index in range(count):
                worker = _worker(f"{name}-{index:0{width}d}", resources, model, labels)
                add(line, rows._column("worker_id"), worker)
    if not workers:
        raise InputError(file, None, None, "no workers")
    return Cluster(tuple(workers), name=file.stem)


def _worker(
    worker_id: str, resources: Resources, model: str | None, labels: dict[str, str] | None = None
) -> Worker:
    return Worker(worker_id, "sim", resources, model, dict(labels or {}), WorkerStatus.ACTIVE, 0.0, 0.0)


def uniform_cluster(workers: int, gpus: int, cpus: int = 0, memory_mb: int = 0) -> Cluster:
    width = len(str(workers - 1))
    return Cluster(
        tuple(
            _worker(f"w{index:0{width}d}", Resources(gpus=gpus, cpus=cpus, memory_mb=memory_mb), None)
            for index in range(workers)
        ),
        name=f"{workers}x{gpus}",
    )


# --- pools ----------------------------------------------------------------------------------------


def read_pools(path: str | Path) -> dict[str, PoolSettings]:
    """``{"pools": {"<path>": {<PUT /pools body>}}}``; errors name the pool and its field (JSON
    syntax errors their line and column)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as error:
        raise InputError(file, None, None, f"cannot open: {error.strerror or error}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(file, error.lineno, error.colno, error.msg) from None
    if not isinstance(document, dict) or not isinstance(document.get("pools"), dict):
        raise InputError(file, 1, 1, 'expected {"pools": {"<path>": {...}, ...}}')
    result: dict[str, PoolSettings] = {}
    for pool_path, body in document["pools"].items():
        line = _line_of(text, f'"{pool_path}"')
        try:
            pool_rules.check_path(pool_path)
            result[pool_path] = pool_settings(body)
        except ValueError as error:
            raise InputError(file, line, None, f"pool {pool_path!r}: {error}") from None
    return result


def _line_of(text: str, needle: str) -> int | None:
    position = text.find(needle)
    return None if position < 0 else text.count("\n", 0, position) + 1


def pool_settings(body: Any) -> PoolSettings:
    """A PUT /pools body as ``PoolSettings`` (the route's rules: positive weight, known mode and
    kind, tolerance in (0, 1], limits not below the guarantee)."""
    if not isinstance(body, dict):
        raise ValueError("expected an object of pool settings")
    unknown = sorted(set(body) - POOL_FIELDS)
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}")
    weight = body.get("weight")
    if weight is not None and (not isinstance(weight, int | float) or weight <= 0):
        raise ValueError("weight must be a number > 0")
    guarantee = _resources(body.get("guarantee"), "guarantee")
    limits = _resources(body.get("limits"), "limits", unlimited=True)
    if guarantee is not None and limits is not None:
        for name in ("gpus", "memory_mb", "cpus"):
            if getattr(limits, name) < getattr(guarantee, name):
                raise ValueError(f"limits.{name} is below the guarantee")
    tolerance = body.get("starvation_tolerance")
    if tolerance is not None and not (isinstance(tolerance, int | float) and 0 < tolerance <= 1):
        raise ValueError("starvation_tolerance must be in (0, 1]")
    try:
        mode = PoolMode(body["mode"]) if body.get("mode") is not None else None
        kind = PoolKind(body["kind"]) if body.get("kind") is not None else None
    except ValueError as error:
        raise ValueError(str(error)) from None
    timers: dict[str, float | None] = {}
    for name in (
        "starvation_timeout_s",
        "aggressive_starvation_timeout_s",
        "default_walltime_s",
        "max_walltime_s",
    ):
        value = body.get(name)
        if value is not None and (not isinstance(value, int | float) or value <= 0):
            raise ValueError(f"{name} must be a number of seconds > 0")
        timers[name] = None if value is None else float(value)
    default_walltime, max_walltime = timers["default_walltime_s"], timers["max_walltime_s"]
    if default_walltime is not None and max_walltime is not None and default_walltime > max_walltime:
        raise ValueError("default_walltime_s is above max_walltime_s")
    flags: dict[str, bool | None] = {}
    for name in ("enable_aggressive_starvation", "allow_aggressive_preemption"):
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false")
        flags[name] = value
    return PoolSettings(
        weight=None if weight is None else float(weight),
        guarantee=guarantee,
        limits=limits,
        mode=mode,
        kind=kind,
        starvation_tolerance=None if tolerance is None else float(tolerance),
        starvation_timeout_s=timers["starvation_timeout_s"],
        aggressive_starvation_timeout_s=timers["aggressive_starvation_timeout_s"],
        enable_aggressive_starvation=flags["enable_aggressive_starvation"],
        allow_aggressive_preemption=flags["allow_aggressive_preemption"],
        default_walltime_s=timers["default_walltime_s"],
        max_walltime_s=timers["max_walltime_s"],
    )


def _resources(value: Any, name: str, unlimited: bool = False) -> Resources | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be an object of resources")
    result = {}
    for key, amount in value.items():
        if key not in ("gpus", "vram_mb", "memory_mb", "cpus"):
            raise ValueError(f"{name}: unknown resource {key!r}")
        if amount is None and unlimited:
            amount = pool_rules.UNLIMITED
        if not isinstance(amount, int) or isinstance(amount, bool) or amount < 0:
            raise ValueError(f"{name}.{key} must be a whole number >= 0")
        result[key] = amount
    if unlimited:
        for key in ("gpus", "vram_mb", "memory_mb", "cpus"):
            result.setdefault(key, pool_rules.UNLIMITED)
    return Resources.from_mapping(result)


# --- pool assignment from the Helios Venus quotas -------------------------------------------------------


def venus_quotas(path: str | Path) -> dict[str, float]:
    """Each virtual cluster's mean GPU quota over the file's days (those with a quota)."""
    file = Path(path)
    rows = _Rows(file, ("date",), None)
    names = [name for name in rows.header if name not in ("date", "total")]
    totals = dict.fromkeys(names, 0.0)
    days = 0
    for line, row in rows:
        days += 1
        for name in names:
            totals[name] += rows.cell(line, row, name, _seconds(0), 0.0)
    if days == 0:
        raise InputError(file, None, None, "no days of quotas")
    return {name: total / days for name, total in totals.items() if total > 0}


def assign_pools(
    workload: Workload, cluster: Cluster, quotas: Mapping[str, float], seed: int, prefix: str = "venus"
) -> tuple[Workload, dict[str, PoolSettings]]:
    """Every job drawn to a pool ``<prefix>/<vc>`` in proportion to the VCs' quotas (seeded), and
    the pools: each guaranteed its quota's share of the cluster's GPUs (rounded down), weighted by
    its quota."""
    names = sorted(quotas)
    weights = [quotas[name] for name in names]
    generator = random.Random(seed)
    total = sum(weights)
    jobs = tuple(
        replace(job, pool=f"{prefix}/{generator.choices(names, weights)[0]}") for job in workload.jobs
    )
    pools = {
        f"{prefix}/{name}": PoolSettings(
            weight=quotas[name], guarantee=Resources(gpus=int(cluster.gpus * quotas[name] / total))
        )
        for name in names
    }
    return replace(workload, jobs=jobs), pools
