"""What a worker's previous run left running: found from records in its state directory, and stopped.

A worker killed with ``kill -9`` cannot stop its jobs: each runs in a process group of its own
(``start_new_session``) and lives on, re-parented to init. The server re-queues the job when the
lease lapses, and the restarted worker (same id) may be handed attempt 2 while attempt 1 still
holds the GPU. So every started job leaves a record (pid, process group, the leader's start time)
in the worker's state directory, ended when the attempt ends; at start the worker stops every group
a record names before it claims anything.

The records are one append-only journal (``records.jsonl``): a line when an attempt starts, a line
when it ends. A short job used to cost five file-system calls for its record (a file written to a
temporary name, renamed, later unlinked), about a tenth of the worker's CPU per job; two appends
to a file kept open cost two. Each line is one ``write`` of an ``O_APPEND`` descriptor, so lines
never interleave; a line torn by a host crash is skipped when read (the host's processes died with
it). Past ``COMPACT_BYTES`` the journal is rewritten with the open records alone.
Records of an older worker (one ``<job>-<attempt>.json`` file each) are still read and stopped.

A record is trusted only as far as the kernel agrees: a live process with the recorded pid but
another start time is not ours (the pid was reused) and is left alone; a group whose leader is gone
still holds our processes (Linux gives no new process a pid equal to a live group's id).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
import psutil

logger = logging.getLogger("corral.worker.leftovers")

POLL_S = 0.05
JOURNAL = "records.jsonl"
#: the journal is rewritten with its open records alone once it holds more than this
COMPACT_BYTES = 1024 * 1024
_PLAIN = re.compile(r"[A-Za-z0-9._-]+")


def default_state_dir(worker_id: str) -> Path:
    """``<tmp>/corral-<uid>/worker-<id>``: one per worker id and user on a host."""
    safe = "".join(char if char.isalnum() or char in "-_." else "_" for char in worker_id)
    return Path(tempfile.gettempdir()) / f"corral-{os.getuid()}" / f"worker-{safe}"


def state_directory(setting: str | None, worker_id: str) -> Path:
    """The worker's state directory: ``--state-dir`` when given, else the default for its id."""
    return Path(setting) if setting else default_state_dir(worker_id)


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    job_id: str
    attempt: int
    pid: int
    pgid: int
    started: float  # the leader's start time (psutil), to tell a reused pid apart


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22); None where
    it cannot be read (gone, or not Linux)."""
    try:
        # os.open and one read: open() adds an fstat, an ioctl and a seek per file.
        descriptor = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            text = os.read(descriptor, 4096)
        finally:
            os.close(descriptor)
        return int(text.rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


class ProcessRecords:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._boot_time: float | None = None
        self._ticks = 100
        with contextlib.suppress(AttributeError, ValueError, OSError):
            self._ticks = os.sysconf("SC_CLK_TCK")
        self._lock = threading.Lock()
        self._journal: int | None = None  # the journal's descriptor, opened at the first record
        self._open: dict[tuple[str, int], bytes] = {}  # the open records' journal lines
        self._written = 0  # the journal's size

    def _started(self, pid: int) -> float:
        """The leader's start time as ``psutil.Process(pid).create_time()`` says it (which
        ``_ours`` compares with), from one read of ``/proc/PID/stat``: psutil's own way reads it
        and ``/proc/stat`` (the boot time) twice, a fifth of a short job's cost to the worker.
        Raises ``ProcessLookupError`` or ``psutil.Error`` when the process is gone."""
        ticks = _start_ticks(pid)
        if ticks is None:
            return float(psutil.Process(pid).create_time())
        if self._boot_time is None:
            self._boot_time = psutil.boot_time()
        return ticks / self._ticks + self._boot_time

    def _path(self, job_id: str, attempt: int) -> Path:
        """An older worker's record file of the attempt (one file per attempt)."""
        # Server ids are plain ASCII: they are kept as they are without a walk over their characters.
        safe = (
            job_id
            if _PLAIN.fullmatch(job_id)
            else "".join(char if char.isalnum() or char in "-_." else "_" for char in job_id)
        )
        return self.directory / f"{safe}-{attempt}.json"

    def _append(self, line: bytes) -> None:
        """Append one journal line (called with the lock held); once the journal has grown past
        ``COMPACT_BYTES``, it is rewritten with the open records alone."""
        if self._journal is None:
            self._journal = self._open_journal()
        os.write(self._journal, line)
        self._written += len(line)
        if self._written > COMPACT_BYTES:
            self._compact()

    def _open_journal(self) -> int:
        return os.open(self.directory / JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def _compact(self) -> None:
        """The journal rewritten with the open records only (written aside, then renamed over it:
        a crash meanwhile leaves the old journal whole)."""
        lines = b"".join(self._open.values())
        path = self.directory / JOURNAL
        temporary = path.with_suffix(".tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(descriptor, lines)
        finally:
            os.close(descriptor)
        os.replace(temporary, path)
        if self._journal is not None:
            os.close(self._journal)
        self._journal = self._open_journal()
        self._written = len(lines)

    def record(self, job_id: str, attempt: int, pid: int) -> None:
        """Note a started job's process group (one journal line: a torn one is skipped when read)."""
        try:
            started = self._started(pid)
            pgid = os.getpgid(pid)
        except (psutil.Error, ProcessLookupError):
            return  # already gone: nothing to leave behind
        record = ProcessRecord(job_id, attempt, pid, pgid, started)
        line = orjson.dumps(_fields(record), option=orjson.OPT_APPEND_NEWLINE)
        with self._lock:
            self._open[(job_id, attempt)] = line
            self._append(line)

    def forget(self, job_id: str, attempt: int) -> None:
        """The attempt ended: its record is closed (nothing is written for one never recorded)."""
        with self._lock:
            if self._open.pop((job_id, attempt), None) is None:
                return
            self._append(
                orjson.dumps(
                    {"job_id": job_id, "attempt": attempt, "ended": True}, option=orjson.OPT_APPEND_NEWLINE
                )
            )

    def records(self) -> list[ProcessRecord]:
        """The open records: the journal's started attempts that have not ended, and the files an
        older worker left."""
        found = self._journal_records()
        for path in sorted(self.directory.glob("*.json")):
            try:
                data = orjson.loads(path.read_bytes())
                found.append(ProcessRecord(**data))
            except (OSError, orjson.JSONDecodeError, TypeError):
                logger.warning("unreadable process record removed", extra={"path": str(path)})
                path.unlink(missing_ok=True)
        return found

    def _journal_records(self) -> list[ProcessRecord]:
        try:
            text = (self.directory / JOURNAL).read_bytes()
        except FileNotFoundError:
            return []
        opened: dict[tuple[str, int], ProcessRecord] = {}
        for line in text.splitlines():
            try:
                data = orjson.loads(line)
                key = (data["job_id"], data["attempt"])
                if data.get("ended"):
                    opened.pop(key, None)
                else:
                    opened[key] = ProcessRecord(**data)
            except (orjson.JSONDecodeError, TypeError, KeyError):
                logger.warning(
                    "unreadable process record line skipped",
                    extra={"line": line[:200].decode(errors="replace")},
                )
        return list(opened.values())

    def clear(self) -> None:
        """Remove every record: the journal's and an older worker's files."""
        with self._lock:
            if self._journal is not None:
                os.ftruncate(self._journal, 0)
            else:
                with contextlib.suppress(FileNotFoundError):
                    (self.directory / JOURNAL).unlink()
            self._open.clear()
            self._written = 0
        for path in self.directory.glob("*.json"):
            path.unlink(missing_ok=True)

    def stop_leftovers(self, grace_s: float) -> list[ProcessRecord]:
        """Stop every process group a record names (SIGTERM, then SIGKILL after ``grace_s``) and
        remove the records; the records whose groups were still alive."""
        alive = [record for record in self.records() if _members(record)]
        for record in alive:
            logger.warning(
                "stopping a job left running by this worker's previous run",
                extra={"job_id": record.job_id, "attempt": record.attempt, "pgid": record.pgid},
            )
            _signal(record, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(_members(record) for record in alive) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        for record in alive:
            if _members(record):
                _signal(record, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while any(_members(record) for record in alive) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        self.clear()
        return alive


def _fields(record: ProcessRecord) -> dict[str, object]:
    return {name: getattr(record, name) for name in ProcessRecord.__slots__}


def _ours(record: ProcessRecord) -> bool:
    """Whether the group still is the recorded one: its leader alive with the recorded start time,
    or its leader gone (then no new process can have taken the group's id while members remain)."""
    try:
        leader = psutil.Process(record.pgid)
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False
    try:
        return leader.status() == psutil.STATUS_ZOMBIE or abs(leader.create_time() - record.started) < 0.01
    except psutil.Error:
        return True


def _members(record: ProcessRecord) -> list[int]:
    """Live (non-zombie) processes of the recorded group, when the group is still ours."""
    if not _ours(record):
        return []
    members = []
    for process in psutil.process_iter(["pid", "status"]):
        try:
            if process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(process.info["pid"]) == record.pgid:
                members.append(process.info["pid"])
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def _signal(record: ProcessRecord, number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(record.pgid, number)
