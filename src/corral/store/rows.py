"""Rows to records and back: the column lists, the shared SQL fragments, and the conversions every
store module uses. No queries run here."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any, Generic, Protocol, TypeVar

import orjson

from corral.domain.queue_order import order_by_sql
from corral.domain.records import (
    Allocation,
    Constraints,
    Dependency,
    GpuReading,
    Job,
    JobSpec,
    Reason,
    TopologyRequest,
    Worker,
)
from corral.domain.resources import Resources
from corral.domain.status import HOLDING, LEASED, NON_TERMINAL, TERMINAL, Status
from corral.domain.transitions import Transition
from corral.store.schema import DECLARED_INDEXES, EVENT_COLUMNS, JOB_COLUMNS, USAGE_COLUMNS, WORKER_COLUMNS

JOB_SELECT = ", ".join(JOB_COLUMNS)
WORKER_SELECT = ", ".join(WORKER_COLUMNS)

#: the readings a heartbeat writes (a job's every 5 s, a worker's every 15 s) that no scheduling
#: decision reads: the admission cycle selects them as NULL (``select_without``), so that a row
#: only renewed by heartbeats reads the same as before and its record can be kept
#: (``KeptConversions``). A job heartbeat's ``last_checkpoint_at`` is not among them: the
#: preemption planner weighs a victim's lost work by it.
JOB_HEARTBEAT_READINGS = frozenset({"last_heartbeat_at", "progress", "gpu_util_pct", "rss_mb"})
WORKER_HEARTBEAT_READINGS = frozenset({"last_heartbeat_at", "gpu_stats"})


def select_without(columns: Sequence[str], left_out: frozenset[str]) -> str:
    """A select list of ``columns`` in their order, each of ``left_out`` read as NULL instead (the
    row keeps its shape, so the usual conversion reads it)."""
    return ", ".join("NULL" if column in left_out else column for column in columns)


def _sql_set(statuses: frozenset[Status]) -> str:
    return "(" + ", ".join(f"'{status.value}'" for status in sorted(statuses)) + ")"


def _as_indexed(statuses: frozenset[Status], index: str) -> str:
    """``statuses`` as the partial ``index``'s predicate (``status IN (...)``) lists them, word for
    word: SQLite uses a partial index only for a query that writes its predicate as the DDL does,
    and a claim reads a worker's holdings through ``jobs_holding``."""
    where = DECLARED_INDEXES[index].where or ""
    listed = where.removeprefix("status IN ")
    if {part.strip(" '()") for part in listed.split(",")} != {status.value for status in statuses}:
        raise AssertionError(f"index {index} ({where}) does not cover exactly {sorted(statuses)}")
    return listed


#: jobs that hold resources on their worker (as the ``jobs_holding`` index lists them) / whose
#: heartbeats renew a lease / not yet ended (``domain.status``)
HOLDING_SQL = _as_indexed(HOLDING, "jobs_holding")
LEASED_SQL = _sql_set(LEASED)
NON_TERMINAL_SQL = _sql_set(NON_TERMINAL)
TERMINAL_SQL = _sql_set(TERMINAL)
QUEUE_ORDER = order_by_sql()
# The SQL pre-filter makes the first candidate fit almost always (only constraints can refuse it),
# so the claim reads one row first and widens the page only when constraints skip them.
CLAIM_FIRST_PAGE = 1
#: what a pending single job must also be for a claim or the admission cycle to take it: not
#: waiting on its dependencies, and not a task of an array that already holds its %N throttle's
#: worth of tasks (counted through ``jobs_array``: at most N rows). ``jobs`` is the candidate's row.
RUNNABLE_SQL = (
    "jobs.awaiting_dependencies = 0 AND (jobs.array_throttle IS NULL OR (SELECT COUNT(*) FROM jobs AS sibling"
    f" WHERE sibling.array_id = jobs.array_id AND sibling.status IN {HOLDING_SQL}) < jobs.array_throttle)"
)
CLAIM_MAX_PAGE = 512


class Transaction(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...
    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...
    def execute_each(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[list[tuple[Any, ...]]]:
        """Each statement's rows, run in order as ``execute`` would run them one after another
        (PostgreSQL sends them in one round trip; no statement's values may depend on an earlier
        one's rows)."""
        ...


def to_json(value: Any) -> str:
    return orjson.dumps(value).decode()


def indices_text(indices: Sequence[int]) -> str:
    return ",".join(str(index) for index in indices)


def parse_indices(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",")) if text else ()


def job_from_row(row: Sequence[Any]) -> Job:
    (
        job_id, name, command, env, status, gang_id, gang_size, gang_index, gpus, vram_mb, memory_mb,
        cpus, gpu_model, labels, pool, username, priority, preemption_class, checkpoint_mode,
        max_retries, attempts, watchdog_retries, preempted_count, queue_front, worker_id, gpu_indices,
        reservation_epoch, reserved_at, preemption_epoch, drain_started_at, cancel_requested,
        submitted_at, started_at, finished_at, last_heartbeat_at, exit_code, error, output_tail,
        reason_code, reason_message, has_checkpoint, progress, budget_s, walltime_s, stall_timeout_s,
        event_count, master_port, refunds, gpu_util_pct, rss_mb, preempted_for, victims_deadline,
        checkpoint_requested_at, checkpoint_deadline, checkpoint_extended, checkpoint_deferred_s,
        checkpoint_durations, last_checkpoint_at, checkpoint_failures, claim_key, workdir,
        array_id, array_index, array_size, array_throttle, depends_on, awaiting_dependencies,
        topology,
    ) = row  # fmt: skip
    spec = JobSpec(
        command=command,
        name=name,
        env=orjson.loads(env),
        gang_size=gang_size,
        resources=Resources(gpus, vram_mb, memory_mb, cpus),
        constraints=Constraints(gpu_model=gpu_model, labels=orjson.loads(labels)),
        pool=pool,
        user=username,
        priority=priority,
        preemption_class=preemption_class,
        checkpoint_mode=checkpoint_mode,
        max_retries=max_retries,
        budget_s=budget_s,
        walltime_s=walltime_s,
        stall_timeout_s=stall_timeout_s,
        workdir=workdir,
        after=parse_dependencies(depends_on),
        topology=parse_topology(topology),
    )
    return Job(
        id=job_id,
        spec=spec,
        status=Status(status),
        submitted_at=submitted_at,
        gang_id=gang_id,
        gang_index=gang_index,
        attempts=attempts,
        watchdog_retries=watchdog_retries,
        preempted_count=preempted_count,
        queue_front=bool(queue_front),
        worker_id=worker_id,
        gpu_indices=tuple(int(part) for part in gpu_indices.split(",")) if gpu_indices else (),
        reservation_epoch=reservation_epoch,
        reserved_at=reserved_at,
        preemption_epoch=preemption_epoch,
        drain_started_at=drain_started_at,
        cancel_requested=bool(cancel_requested),
        started_at=started_at,
        finished_at=finished_at,
        last_heartbeat_at=last_heartbeat_at,
        exit_code=exit_code,
        error=error,
        output_tail=output_tail,
        reason=Reason(reason_code, reason_message or "") if reason_code else None,
        has_checkpoint=bool(has_checkpoint),
        progress=orjson.loads(progress) if progress else None,
        master_port=master_port,
        refunds=refunds,
        version=event_count,
        gpu_util_pct=gpu_util_pct,
        rss_mb=rss_mb,
        preempted_for=preempted_for,
        victims_deadline=victims_deadline,
        checkpoint_requested_at=checkpoint_requested_at,
        checkpoint_deadline=checkpoint_deadline,
        checkpoint_extended=bool(checkpoint_extended),
        checkpoint_deferred_s=checkpoint_deferred_s,
        checkpoint_durations=_parse_durations(checkpoint_durations),
        last_checkpoint_at=last_checkpoint_at,
        checkpoint_failures=checkpoint_failures,
        claim_key=claim_key,
        array_id=array_id,
        array_index=array_index,
        array_size=array_size,
        array_throttle=array_throttle,
        awaiting_dependencies=bool(awaiting_dependencies),
    )


def dependencies_text(after: Sequence[Dependency]) -> str:
    """A job's ``after`` as stored: JSON, or '' for none (most jobs)."""
    return to_json([item.to_dict() for item in after]) if after else ""


def parse_dependencies(text: str) -> tuple[Dependency, ...]:
    return tuple(Dependency(item["id"], item["when"]) for item in orjson.loads(text)) if text else ()


def topology_text(topology: TopologyRequest | None) -> str:
    """A job's ``topology`` as stored: JSON, or '' for none (most jobs)."""
    return to_json(topology.to_dict()) if topology is not None else ""


def parse_topology(text: str) -> TopologyRequest | None:
    return TopologyRequest.from_dict(orjson.loads(text)) if text else None


def _parse_durations(text: str) -> tuple[float, ...]:
    return tuple(float(part) for part in text.split(",")) if text else ()


#: each field of ``Job`` a transition may set, and the columns (with their stored values) it is
#: written as; the spec never changes
_COLUMNS_OF_FIELD: dict[str, Callable[[Job], dict[str, Any]]] = {
    "status": lambda job: {"status": job.status.value},
    "attempts": lambda job: {"attempts": job.attempts},
    "watchdog_retries": lambda job: {"watchdog_retries": job.watchdog_retries},
    "preempted_count": lambda job: {"preempted_count": job.preempted_count},
    "queue_front": lambda job: {"queue_front": int(job.queue_front)},
    "worker_id": lambda job: {"worker_id": job.worker_id},
    "gpu_indices": lambda job: {"gpu_indices": indices_text(job.gpu_indices)},
    "reservation_epoch": lambda job: {"reservation_epoch": job.reservation_epoch},
    "reserved_at": lambda job: {"reserved_at": job.reserved_at},
    "preemption_epoch": lambda job: {"preemption_epoch": job.preemption_epoch},
    "drain_started_at": lambda job: {"drain_started_at": job.drain_started_at},
    "cancel_requested": lambda job: {"cancel_requested": int(job.cancel_requested)},
    "started_at": lambda job: {"started_at": job.started_at},
    "finished_at": lambda job: {"finished_at": job.finished_at},
    "last_heartbeat_at": lambda job: {"last_heartbeat_at": job.last_heartbeat_at},
    "exit_code": lambda job: {"exit_code": job.exit_code},
    "error": lambda job: {"error": job.error},
    "output_tail": lambda job: {"output_tail": job.output_tail},
    "reason": lambda job: {
        "reason_code": job.reason.code if job.reason else None,
        "reason_message": job.reason.message if job.reason else None,
    },
    "has_checkpoint": lambda job: {"has_checkpoint": int(job.has_checkpoint)},
    "progress": lambda job: {"progress": to_json(job.progress) if job.progress is not None else None},
    "master_port": lambda job: {"master_port": job.master_port},
    "refunds": lambda job: {"refunds": job.refunds},
    "gpu_util_pct": lambda job: {"gpu_util_pct": job.gpu_util_pct},
    "rss_mb": lambda job: {"rss_mb": job.rss_mb},
    "preempted_for": lambda job: {"preempted_for": job.preempted_for},
    "victims_deadline": lambda job: {"victims_deadline": job.victims_deadline},
    "checkpoint_requested_at": lambda job: {"checkpoint_requested_at": job.checkpoint_requested_at},
    "checkpoint_deadline": lambda job: {"checkpoint_deadline": job.checkpoint_deadline},
    "checkpoint_extended": lambda job: {"checkpoint_extended": int(job.checkpoint_extended)},
    "checkpoint_deferred_s": lambda job: {"checkpoint_deferred_s": job.checkpoint_deferred_s},
    "checkpoint_durations": lambda job: {
        "checkpoint_durations": ",".join(f"{value:.3f}" for value in job.checkpoint_durations)
    },
    "last_checkpoint_at": lambda job: {"last_checkpoint_at": job.last_checkpoint_at},
    "checkpoint_failures": lambda job: {"checkpoint_failures": job.checkpoint_failures},
    "claim_key": lambda job: {"claim_key": job.claim_key},
    "awaiting_dependencies": lambda job: {"awaiting_dependencies": int(job.awaiting_dependencies)},
    "version": lambda job: {},  # event_count, bumped by the store with the status change
}


def columns_of_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The columns, with their stored values, that setting ``fields`` (``Job`` fields and their
    values, no job at hand: ``domain.transitions.FencedReport``) writes, as ``changed_columns`` would."""
    values = SimpleNamespace(**fields)
    columns: dict[str, Any] = {}
    for name in fields:
        columns.update(_COLUMNS_OF_FIELD[name](values))  # type: ignore[arg-type]
    return columns


def changed_columns(transition: Transition) -> dict[str, Any]:
    """The columns ``transition`` writes, with their values: the fields it names, else every field
    whose value differs between its two records."""
    before, after = transition.before, transition.after
    fields = transition.fields
    if fields is None:
        fields = frozenset(
            name for name in _COLUMNS_OF_FIELD if getattr(before, name) != getattr(after, name)
        )
    columns: dict[str, Any] = {}
    for name in fields:
        columns.update(_COLUMNS_OF_FIELD[name](after))
    return columns


def worker_from_row(row: Sequence[Any]) -> Worker:
    (
        worker_id, address, gpus, vram_mb, memory_mb, cpus, gpu_model, labels, status, registered_at,
        last_heartbeat_at, flagged_dead_at, gpu_stats, unhealthy_gpus, enforcement,
    ) = row  # fmt: skip
    return Worker(
        id=worker_id,
        address=address,
        resources=Resources(gpus, vram_mb, memory_mb, cpus),
        gpu_model=gpu_model,
        labels=orjson.loads(labels),
        status=status,
        registered_at=registered_at,
        last_heartbeat_at=last_heartbeat_at,
        flagged_dead_at=flagged_dead_at,
        unhealthy_gpus=parse_indices(unhealthy_gpus),
        gpu_stats=tuple(
            GpuReading(reading["index"], reading.get("util_pct"), reading.get("mem_used_mb"))
            for reading in (orjson.loads(gpu_stats) if gpu_stats else ())
        ),
        enforcement=orjson.loads(enforcement) if enforcement else {},
    )


#: the columns a job's row is written with once, at submit (``insert_row``), and never again: its
#: spec and place in a gang (no transition writes them, ``changed_columns``; nor does a heartbeat).
#: The admission cycle compares rows without them (``KeptConversions``' changeable part): a column
#: that may change after the submit must not be here
JOB_SPEC_COLUMNS = frozenset({
    "name", "command", "env", "gang_id", "gang_size", "gang_index", "gpus", "vram_mb", "memory_mb",
    "cpus", "gpu_model", "labels", "pool", "username", "priority", "preemption_class",
    "checkpoint_mode", "max_retries", "submitted_at", "budget_s", "walltime_s", "stall_timeout_s",
    "workdir", "array_id", "array_index", "array_size", "array_throttle", "depends_on", "topology",
})  # fmt: skip


def insert_row(job: Job) -> tuple[Any, ...]:
    spec, resources = job.spec, job.spec.resources
    reason = job.reason
    return (
        job.id, spec.name, spec.command, to_json(spec.env), job.status.value,
        job.gang_id, spec.gang_size, job.gang_index,
        resources.gpus, resources.vram_mb, resources.memory_mb, resources.cpus,
        spec.constraints.gpu_model, to_json(spec.constraints.labels), spec.pool, spec.user,
        spec.priority, spec.preemption_class, spec.checkpoint_mode, spec.max_retries,
        job.submitted_at, spec.budget_s, spec.walltime_s, spec.stall_timeout_s,
        reason.code if reason else None, reason.message if reason else None, spec.workdir,
        job.array_id, job.array_index, job.array_size, job.array_throttle,
        dependencies_text(spec.after), int(job.awaiting_dependencies), topology_text(spec.topology),
    )  # fmt: skip


INSERT_JOB = (
    "INSERT INTO jobs (id, name, command, env, status, gang_id, gang_size, gang_index, gpus, vram_mb,"
    " memory_mb, cpus, gpu_model, labels, pool, username, priority, preemption_class, checkpoint_mode,"
    " max_retries, submitted_at, budget_s, walltime_s, stall_timeout_s, reason_code, reason_message,"
    " workdir, array_id, array_index, array_size, array_throttle, depends_on, awaiting_dependencies,"
    " topology, event_count)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
    " ?, ?, ?, ?, ?, ?, ?, 1)"
)
INSERT_EVENT = f"INSERT INTO job_events ({', '.join(EVENT_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
#: an attempt's usage row (``SqlStore.usage_values``); a row already there (none should be: an
#: attempt's hold ends once) is kept, never a reason to roll the transition back
INSERT_USAGE = (
    f"INSERT INTO attempt_usage ({', '.join(USAGE_COLUMNS)}) VALUES ({', '.join('?' for _ in USAGE_COLUMNS)})"
    " ON CONFLICT (job_id, attempt) DO NOTHING"
)


def allocation_from_row(row: Sequence[Any]) -> Allocation:
    return Allocation(
        job_id=row[0],
        worker_id=row[1],
        resources=Resources(row[2], row[3], row[4], row[5]),
        gpu_indices=tuple(int(part) for part in row[6].split(",")) if row[6] else (),
        status=Status(row[7]),
        reservation_epoch=int(row[8]) if len(row) > 8 else 0,
    )


def submit_event(job: Job) -> tuple[Any, ...]:
    reason = job.reason
    code, message = (reason.code, reason.message) if reason else (None, None)
    return (job.id, 1, job.submitted_at, None, job.status.value, code, message, None, None, 0)


Record = TypeVar("Record")
#: a record kept with what it was compared on: its whole row, or the changeable part of it
_Kept = tuple[Sequence[Any], Record]
#: the place of a row whose whole row was not there to read (``KeptConversionsRead.records``)
_LEFT_OUT = object()


class KeptConversions(Generic[Record]):
    """Records made from rows, kept from one read to the next, so that a read converts only the
    rows that changed since the last one: a row equal to the one a record was made from gives that
    same record (records are immutable values), any other row a new one. The admission cycle reads
    every holding job and every worker each pass (16,000 and 2,000 rows at 2,000 hosts), and
    almost none of them change between two passes; converting them was most of its snapshot's cost.

    The rows must carry every column the records' users read (a column left out cannot go stale,
    it is never there): the kept record is only ever reused for an equal row, so keeping hides no
    change. With ``changeable`` (the part of a whole row that may change once it is written, key
    first), a read may give only those parts and read the whole rows of the others alone
    (``KeptConversionsRead.records``): fetching the columns written once is most of a read's time
    too. Each ``read`` starts from what the last finished one kept and keeps only the rows it met:
    a record whose row is gone is dropped. Reads may run at once on several threads: each fills its
    own table and the last to finish is kept (either one is valid).
    """

    def __init__(
        self,
        convert: Callable[[Sequence[Any]], Record],
        changeable: Callable[[Sequence[Any]], Sequence[Any]] | None = None,
    ) -> None:
        self.convert = convert
        self.changeable = changeable
        self._kept: dict[Any, _Kept[Record]] = {}

    def read(self) -> KeptConversionsRead[Record]:
        """One read's conversions; ``finish`` it to keep them for the next read."""
        return KeptConversionsRead(self, self._kept)

    def keep(self, kept: dict[Any, _Kept[Record]]) -> None:
        """Keep ``kept`` (a finished read's records) for the next reads, in place of the last."""
        self._kept = kept


class KeptConversionsRead(Generic[Record]):
    """The conversions of one read (``KeptConversions.read``), keyed by the row's first column."""

    def __init__(self, owner: KeptConversions[Record], previous: dict[Any, _Kept[Record]]) -> None:
        self._owner = owner
        self._previous = previous
        self._kept: dict[Any, _Kept[Record]] = {}

    def records(
        self,
        rows: Iterable[Sequence[Any]],
        whole_rows: Callable[[list[Any]], Iterable[Sequence[Any]]] | None = None,
    ) -> list[Record]:
        """The record of each row, in order: the kept one where the row is unchanged.

        Without ``whole_rows``, ``rows`` are whole rows. With it, they are only their
        ``changeable`` parts, and ``whole_rows(keys)`` reads the whole rows of the keys whose
        parts differ from the kept ones (or that have none), as the same query would read them
        now: a record is made from the row it answers, and a key it leaves out (the row left the
        query's result meanwhile) is left out of the answer.
        """
        owner = self._owner
        convert, changeable = owner.convert, owner.changeable
        if whole_rows is not None and changeable is None:
            raise ValueError("whole_rows needs the changeable part of a row (KeptConversions)")
        # what a row is compared on: the rows as given where they are parts, or whole and kept whole
        parts_of = changeable if changeable is not None and whole_rows is None else None
        kept = self._kept
        # bound once: this loop runs once a row (80,000 holding jobs a pass at 10,000 hosts x 8)
        kept_get, previous_get = kept.get, self._previous.get
        made: list[Any] = []
        add = made.append
        wanted: list[tuple[int, Any]] = []  # (position in made, key) of the rows not kept
        for row in rows:
            key = row[0]
            compared = row if parts_of is None else parts_of(row)
            found = kept_get(key)
            if found is None:
                found = previous_get(key)
            if found is not None and found[0] == compared:
                kept[key] = found
                add(found[1])
            elif whole_rows is None:
                found = (compared, convert(row))
                kept[key] = found
                add(found[1])
            else:
                wanted.append((len(made), key))
                add(_LEFT_OUT)
        if not wanted:
            return made
        if whole_rows is not None and changeable is not None:
            whole = {row[0]: row for row in whole_rows([key for _, key in wanted])}
            for position, key in wanted:
                whole_row = whole.get(key)
                if whole_row is not None:
                    found = (changeable(whole_row), convert(whole_row))
                    kept[key] = found
                    made[position] = found[1]
        return [record for record in made if record is not _LEFT_OUT]

    def finish(self) -> None:
        """Keep this read's records, and only them, for the next read."""
        self._owner.keep(self._kept)
