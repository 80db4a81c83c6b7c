"""One server per SQLite file: a second one would run every loop beside the first, both leaders.

SQLite has no session to hold a leader lock across processes the way PostgreSQL's advisory locks
do, so ``corral server`` takes an exclusive ``flock`` on ``<db>.server.lock`` before it serves and
keeps it while it lives. The kernel drops the lock when the process ends however it ends
(``kill -9`` included), so a stale file never blocks a restart.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import IO


class HeldByAnother(Exception):
    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(
            f"another corral server{holder} is serving this SQLite database (lock {path}); stop it "
            "first, or use PostgreSQL (CORRAL_DB=postgresql://...) to run several replicas"
        )


def lock_path(db_url: str) -> Path | None:
    """The lock file of a ``sqlite:///`` URL; None for any other store."""
    if not db_url.startswith("sqlite:///"):
        return None
    return Path(db_url.removeprefix("sqlite:///") + ".server.lock").resolve()


def acquire(db_url: str) -> IO[str] | None:
    """Take the lock (kept until the returned file is closed or the process ends); None when the
    store is not SQLite. Raises ``HeldByAnother`` when a live server holds it."""
    path = lock_path(db_url)
    if path is None:
        return None
    handle = path.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        pid = handle.read().strip()
        handle.close()
        raise HeldByAnother(path, f" (pid {pid})" if pid.isdigit() else "") from None
    with contextlib.suppress(OSError):
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
    return handle
