"""Store faults to inject from outside the server, for the chaos tests and ``bench/soak.py``: another
process holding SQLite's write lock, a disk with no room left (issue 24 item 2)."""

from __future__ import annotations

import contextlib
import errno
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

#: the holder's program: take the write lock, say so, hold it until stdin closes, let go
_HOLD_THE_WRITE_LOCK = """\
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
connection.execute('BEGIN IMMEDIATE')
print('locked', flush=True)
sys.stdin.read()
connection.execute('ROLLBACK')
"""


@contextlib.contextmanager
def sqlite_write_lock_held(db_path: Path) -> Iterator[None]:
    """A process of its own holding SQLite's write lock (``BEGIN IMMEDIATE``) on ``db_path`` from
    the block's start to its end (its stdin closes then): another process, so that neither the
    server's own lock nor its connections are involved. ``RuntimeError`` when it cannot take the
    lock within 30 s."""
    holder = subprocess.Popen(  # noqa: S603 (this interpreter, a fixed program, no shell)
        [sys.executable, "-c", _HOLD_THE_WRITE_LOCK, str(db_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        if holder.stdout.readline().strip() != b"locked":
            raise RuntimeError(f"the lock holder could not take the write lock of {db_path}")
        yield
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
        holder.stdout.close()


def fill_disk(disk: Path) -> Path:
    """A file in ``disk`` that takes every free byte of its file system (written in ever smaller
    pieces to the last byte); removing it frees them."""
    filler = disk / "filler"
    chunk = b"\0" * (1 << 20)
    with filler.open("wb", buffering=0) as out:
        for size in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    out.write(chunk[:size])
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
    return filler
