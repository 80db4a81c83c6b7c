"""What a worker's previous run left running: found from records in its state directory, and stopped.

A worker killed with ``kill -9`` cannot stop its jobs: each runs in a process group of its own
(``start_new_session``) and lives on, re-parented to init. The server re-queues the job when the
lease lapses, and the restarted worker (same id) may be handed attempt 2 while attempt 1 still
holds the GPU. So every started job leaves a record (``<job>-<attempt>.json``: pid, process group,
the leader's start time) in the worker's state directory, removed when the attempt ends; at start
the worker stops every group a record names before it claims anything.

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
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
import psutil

logger = logging.getLogger("corral.worker.leftovers")

POLL_S = 0.05
_PLAIN = re.compile(r"[A-Za-z0-9._-]+")


def default_state_dir(worker_id: str) -> Path:
    """``<tmp>/corral-<uid>/worker-<id>``: one per worker id and user on a host."""
    safe = "".join(char if char.isalnum() or char in "-_." else "_" for char in worker_id)
    return Path(tempfile.gettempdir()) / f"corral-{os.getuid()}" / f"worker-{safe}"


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
        # Server ids are plain ASCII: they are kept as they are without a walk over their characters.
        safe = (
            job_id
            if _PLAIN.fullmatch(job_id)
            else "".join(char if char.isalnum() or char in "-_." else "_" for char in job_id)
        )
        return self.directory / f"{safe}-{attempt}.json"

    def record(self, job_id: str, attempt: int, pid: int) -> None:
        """Note a started job's process group (written atomically: a torn record is worse than none)."""
        try:
            started = self._started(pid)
            pgid = os.getpgid(pid)
        except (psutil.Error, ProcessLookupError):
            return  # already gone: nothing to leave behind
        record = ProcessRecord(job_id, attempt, pid, pgid, started)
        path = self._path(job_id, attempt)
        temporary = path.with_suffix(".tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(descriptor, orjson.dumps(_fields(record)))
        finally:
            os.close(descriptor)
        os.replace(temporary, path)

    def forget(self, job_id: str, attempt: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(job_id, attempt).unlink()

    def records(self) -> list[ProcessRecord]:
        found = []
        for path in sorted(self.directory.glob("*.json")):
            try:
                data = orjson.loads(path.read_bytes())
                found.append(ProcessRecord(**data))
            except (OSError, orjson.JSONDecodeError, TypeError):
                logger.warning("unreadable process record removed", extra={"path": str(path)})
                path.unlink(missing_ok=True)
        return found

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
        for record in self.records():
            self.forget(record.job_id, record.attempt)
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
