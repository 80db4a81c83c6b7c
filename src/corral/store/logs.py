"""Job logs: each attempt's output (stdout and stderr, interleaved as written), in the store so that
any replica serves them.

An attempt's log is a byte stream; the worker sends it in chunks, each at the offset of the stream
it starts at (``POST /jobs/{id}/logs?offset=B``). The invariants:

1. The stored stream is contiguous: an append starts at or before its end (``size``). A chunk that
   starts past the end would leave a hole, and is refused (``Conflict``).
2. Appends are idempotent by offset: the part of a chunk below ``size`` is already stored (a retry
   after a lost answer) and is skipped, only what lies past ``size`` is written, once.
3. At most ``max_bytes`` per attempt are kept: past it the oldest bytes go (``dropped`` says how
   many, and a read from an offset below it starts at it).

The fence (``check``, the core's ``check_fence``) is read on the job's row inside the append's
transaction: a chunk from a stale worker or attempt changes nothing (409 ``stale_attempt``).
"""

from __future__ import annotations

from collections.abc import Callable

from corral.domain import errors
from corral.domain.records import Job
from corral.domain.status import Status
from corral.store.base import LogAppended, LogSlice
from corral.store.dialect import Database, Dialect, find_job, load_job
from corral.store.rows import Transaction

_TERMINAL_SQL = "('done', 'failed', 'cancelled')"
assert {Status.DONE.value, Status.FAILED.value, Status.CANCELLED.value} == {"done", "failed", "cancelled"}


class SqlLogs:
    """The ``Logs`` port over a ``Database``: the log tables (migration 8)."""

    def __init__(self, db: Database, dialect: Dialect) -> None:
        self.db = db
        self.dialect = dialect

    def append_log(
        self,
        job_id: str,
        offset: int,
        data: bytes,
        now: float,
        max_bytes: int,
        check: Callable[[Job], None],
    ) -> LogAppended:
        """Append ``data`` at ``offset`` of the current attempt's stream, in one transaction.

        1. Read the job and check the fence (a stale chunk raises and writes nothing).
        2. Take the attempt's log row (created empty on the first chunk), locked: two retries of
           one chunk racing on two replicas are applied one after the other.
        3. Skip what is already stored, refuse a hole, insert the rest as one chunk.
        4. Trim to ``max_bytes``: delete the chunks wholly below the new start, cut the one across it.
        """
        with self.db.transaction() as tx:
            job = load_job(tx, self.dialect, job_id)
            check(job)
            attempt = job.attempts
            tx.execute(
                "INSERT INTO job_logs (job_id, attempt, size, dropped, updated_at) VALUES (?, ?, 0, 0, ?)"
                " ON CONFLICT (job_id, attempt) DO NOTHING",
                (job_id, attempt, now),
            )
            lock = self.dialect.lock_clause_plain
            key = (job_id, attempt)
            size, dropped = tx.execute(
                f"SELECT size, dropped FROM job_logs WHERE job_id = ? AND attempt = ?{lock}", key
            )[0]
            if offset > size:
                raise errors.Conflict(
                    f"log offset {offset} is past the end of attempt {attempt}'s log ({size} bytes):"
                    f" send from {size}"
                )
            fresh = data[size - offset :]
            if not fresh:
                return LogAppended(job_id, attempt, size, 0, dropped)
            tx.execute(
                "INSERT INTO job_log_chunks (job_id, attempt, start_offset, end_offset, data)"
                " VALUES (?, ?, ?, ?, ?)",
                (job_id, attempt, size, size + len(fresh), fresh),
            )
            size += len(fresh)
            start = max(dropped, size - max_bytes)
            trimmed = start - dropped
            if trimmed:
                self._trim(tx, job_id, attempt, start)
            tx.execute(
                "UPDATE job_logs SET size = ?, dropped = ?, updated_at = ? WHERE job_id = ? AND attempt = ?",
                (size, start, now, job_id, attempt),
            )
            return LogAppended(job_id, attempt, size, len(fresh), start, trimmed)

    @staticmethod
    def _trim(tx: Transaction, job_id: str, attempt: int, start: int) -> None:
        """Drop the bytes of the attempt's stream below ``start``."""
        key = (job_id, attempt)
        tx.execute(
            "DELETE FROM job_log_chunks WHERE job_id = ? AND attempt = ? AND end_offset <= ?", (*key, start)
        )
        rows = tx.execute(
            "SELECT start_offset, data FROM job_log_chunks WHERE job_id = ? AND attempt = ?"
            " AND start_offset < ?",
            (*key, start),
        )
        for chunk_start, chunk in rows:  # at most one: chunks do not overlap
            tx.execute(
                "DELETE FROM job_log_chunks WHERE job_id = ? AND attempt = ? AND start_offset = ?",
                (*key, chunk_start),
            )
            rest = bytes(chunk)[start - chunk_start :]
            tx.execute(
                "INSERT INTO job_log_chunks (job_id, attempt, start_offset, end_offset, data)"
                " VALUES (?, ?, ?, ?, ?)",
                (*key, start, start + len(rest), rest),
            )

    def read_log(self, job_id: str, attempt: int | None, offset: int, limit: int) -> LogSlice:
        """Up to ``limit`` stored bytes of an attempt's log from ``offset`` (the latest attempt when
        ``attempt`` is None). An attempt that wrote nothing (or does not exist) reads empty."""
        job = find_job(self.db.read(), job_id)
        if job is None:
            raise errors.NotFound(f"job {job_id} not found")
        which = job.attempts if attempt is None else attempt
        # Plain reads, no write transaction (a follow polls this): a trim between the two reads
        # can only have removed the first bytes asked for, and the slice then starts where the
        # stored bytes do.
        rows = self.db.read().execute(
            "SELECT size, dropped FROM job_logs WHERE job_id = ? AND attempt = ?", (job_id, which)
        )
        if not rows:
            return LogSlice(job, which, 0, 0, 0, b"")
        size, dropped = int(rows[0][0]), int(rows[0][1])
        start = min(max(offset, dropped), size)
        end = min(size, start + limit)
        chunks = self.db.read().execute(
            "SELECT start_offset, data FROM job_log_chunks WHERE job_id = ? AND attempt = ?"
            " AND end_offset > ? AND start_offset < ? ORDER BY start_offset",
            (job_id, which, start, end),
        )
        if chunks and chunks[0][0] > start:
            start = dropped = int(chunks[0][0])
        parts = [
            bytes(chunk)[max(0, start - chunk_start) : end - chunk_start] for chunk_start, chunk in chunks
        ]
        return LogSlice(job, which, start, size, dropped, b"".join(parts))

    def log_sizes(self, job_id: str) -> dict[int, tuple[int, int]]:
        """Attempt -> (size, dropped) for every attempt of the job that wrote output."""
        rows = self.db.read().execute(
            "SELECT attempt, size, dropped FROM job_logs WHERE job_id = ? ORDER BY attempt", (job_id,)
        )
        return {int(row[0]): (int(row[1]), int(row[2])) for row in rows}

    def purge_logs(self, finished_before: float) -> int:
        """Delete the logs of jobs that ended before ``finished_before`` (the retention); how many
        attempts' logs went."""
        ended = f"SELECT id FROM jobs WHERE status IN {_TERMINAL_SQL} AND finished_at < ?"
        with self.db.transaction() as tx:
            tx.execute(f"DELETE FROM job_log_chunks WHERE job_id IN ({ended})", (finished_before,))
            gone = tx.execute(
                f"DELETE FROM job_logs WHERE job_id IN ({ended}) RETURNING job_id", (finished_before,)
            )
        return len(gone)
