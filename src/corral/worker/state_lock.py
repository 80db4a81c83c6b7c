"""One worker per id and state directory on a host: a lock on a file in the state directory.

Why: the state directory holds the records of the jobs a worker runs (``corral.worker.leftovers``),
and a worker starting up stops every job those records name, as what a killed run of itself left.
A second worker started with the same id (and so, by default, the same directory) would stop the
first one's running jobs, counted as their failed attempts. So the worker takes an exclusive
``flock`` on ``worker.lock`` before it reads any record, and holds it while it lives: the kernel
drops it when the process ends, however it ends, so a killed worker never leaves it behind. The
file holds the holder's pid, which a refused worker names. The descriptor is close-on-exec: a job
never inherits it (a job left running by a killed worker must not keep its successor out).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_FILE = "worker.lock"


class StateDirectoryInUse(Exception):
    """Another live worker holds this state directory."""

    def __init__(self, directory: Path, pid: int | None) -> None:
        self.directory = directory
        self.pid = pid
        holder = f"worker pid {pid}" if pid is not None else "another worker"
        super().__init__(
            f"{holder} already runs with the state directory {directory} (the same worker id on this "
            "host); refusing to start, so as not to touch its jobs"
        )


def _holder(descriptor: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        os.lseek(descriptor, 0, os.SEEK_SET)
        return int(os.read(descriptor, 32).decode("ascii").strip())
    return None


def hold(directory: Path) -> int:
    """Take the directory's lock for this process; its descriptor (keep it open while the worker
    runs). Raises ``StateDirectoryInUse`` naming the holder's pid when another process has it."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    descriptor = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        pid = _holder(descriptor)
        os.close(descriptor)
        raise StateDirectoryInUse(directory, pid) from error
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, f"{os.getpid()}\n".encode("ascii"), 0)
    return descriptor
