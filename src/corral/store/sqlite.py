"""SQLite backend: the embedded default (one file, WAL, one write transaction per change).

Writes take ``BEGIN IMMEDIATE`` so two writers never deadlock on a lock upgrade: the second waits
and then sees the first one's result, which is what makes the claim's compare-and-set safe without
row locks. The server calls the store from a pool of threads: each thread has its own connection
(WAL lets readers run beside the one writer), and the writers of this process take turns on one
lock first, taken in turn (first come, first served), so they queue in order instead of polling
SQLite's busy handler. A writer that cannot
get the lock, or the file (another process holding it), within ``busy_timeout_s`` raises
``StoreBusy`` (503 with ``Retry-After``) with nothing written.
"""

from __future__ import annotations

import collections
import contextlib
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from corral.domain import errors
from corral.store.base import WouldWait
from corral.store.composed import ComposedStore
from corral.store.dialect import SQLITE
from corral.store.schema import Column, Index
from corral.store.sql import PROBE_WRITE

T = TypeVar("T")

#: how long a change waits for the write lock (this process's writers, then the file's) by default
DEFAULT_BUSY_TIMEOUT_S = 5.0


#: SQLite's primary result codes of a lock in the way (an extended code keeps them in its low byte)
_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
#: ... and of a file that cannot be written now: ``database or disk is full``, ``disk I/O error``
#: (every ``SQLITE_IOERR_*``), a read-only file or file system, a file (the journal, the WAL's
#: index) that cannot be opened
_CANNOT_WRITE_CODES = frozenset(
    {sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN}
)


def _raise_if_busy(error: sqlite3.OperationalError) -> None:
    """SQLite's ``SQLITE_BUSY`` / ``SQLITE_LOCKED`` as ``StoreBusy``, and a write the file cannot
    take (``SQLITE_FULL``, ``SQLITE_IOERR``...) as ``StoreWriteFailed`` (by the error's result
    code, not its text): a 503, never a 500; the transaction is rolled back, nothing written. (A
    function for ``except`` clauses: the hot path's statements pay for no context manager.)"""
    code = getattr(error, "sqlite_errorcode", None)
    if code is None:
        return
    if code & 0xFF in _BUSY_CODES:
        raise errors.StoreBusy(f"the SQLite store is locked by another writer; retry: {error}") from error
    if code & 0xFF in _CANNOT_WRITE_CODES:
        message = f"the SQLite store cannot write; nothing was changed: {error}"
        raise errors.StoreWriteFailed(message) from error


@contextmanager
def _busy_is_503() -> Iterator[None]:
    try:
        yield
    except sqlite3.OperationalError as error:
        _raise_if_busy(error)
        raise


class _TakingTurns:
    """A lock handed to its waiters first come, first served.

    ``threading.Lock`` lets the thread that releases it take it again at once, ahead of threads
    already waiting: an admission pass writing many small transactions in a row could keep a
    heartbeat waiting for the whole pass. Here a release hands the lock to the oldest waiter.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held = False
        self._waiters: collections.deque[threading.Lock] = collections.deque()

    def acquire(self, timeout: float) -> bool:
        with self._mutex:
            if not self._held:
                self._held = True
                return True
            if timeout <= 0:
                return False
            waiter = threading.Lock()
            waiter.acquire()
            self._waiters.append(waiter)
        if waiter.acquire(timeout=timeout):
            return True  # handed over by release()
        with self._mutex:
            try:
                self._waiters.remove(waiter)
            except ValueError:
                return True  # handed over between the timeout and now: ours after all
            return False

    def release(self) -> None:
        with self._mutex:
            if self._waiters:
                self._waiters.popleft().release()  # still held: by the next in line now
            else:
                self._held = False


#: each connection's page cache, in KiB (SQLite's default is 2 MiB). A claim and a ``done`` each
#: touch a job's row and the leaf pages of its half-dozen indexes; past ~4,000 jobs those no longer
#: fit in 2 MiB, and each compare-and-set read its pages back from the file and the WAL: 130-170 us
#: an ``UPDATE`` instead of 30-50 us (claims of 8 and their dones straight on the store, 4,000 jobs
#: queued first: 430-500 us of CPU per job in about half the runs, 220-250 us in every run with
#: this). Pages are allocated as they are read, so a connection holds at most the database's size,
#: and this bound per connection (the event loop's and each store thread's).
CACHE_KIB = 32 * 1024


class _SqliteTransaction:
    """Statements on one thread's connection."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._connection.execute(sql, params).fetchall()
        except sqlite3.OperationalError as error:
            _raise_if_busy(error)
            raise

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with _busy_is_503():
            self._connection.executemany(sql, rows)

    def execute_each(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[list[tuple[Any, ...]]]:
        return [self.execute(sql, params) for sql, params in statements]


class SqliteStore(ComposedStore):
    dialect = "sqlite"
    # Without statistics SQLite sorts every pending row through jobs_status_submitted; the queue
    # index serves the ORDER BY directly (1 ms -> 40 us per claim at 3,000 pending jobs): the
    # dialect's ``queue_index_hint``.
    sql_dialect = SQLITE

    def __init__(self, path: str, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> None:
        self.path = path
        self.busy_timeout_s = busy_timeout_s
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()
        self._write_lock = _TakingTurns()
        self._compose()
        with _busy_is_503():
            self._connection().execute("PRAGMA journal_mode = WAL")

    def _connection(self) -> sqlite3.Connection:
        """This thread's connection, opened at its first use."""
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            with _busy_is_503():
                connection = self._connect(self.path, self.busy_timeout_s)
            self._local.connection = connection
            self._local.tx = _SqliteTransaction(connection)
            self._local.waits = True
            with self._connections_lock:
                self._connections.append(connection)
        return connection

    @property
    def _tx(self) -> _SqliteTransaction:
        self._connection()
        tx: _SqliteTransaction = self._local.tx
        return tx

    @staticmethod
    def _connect(path: str, busy_timeout_s: float) -> sqlite3.Connection:
        # check_same_thread=False only so that close() may close every thread's connection.
        connection = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_s
        )
        connection.execute("PRAGMA synchronous = NORMAL")
        connection.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        connection.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        connection.execute("PRAGMA foreign_keys = ON")
        return connection

    def run_inline(self, work: Callable[[], T]) -> T:
        """``work()`` on the calling thread (the event loop's), provided it need not wait.

        A claim, a report or a heartbeat takes a few hundred microseconds: crossing to a store
        thread and back costs as much again, and the GIL handovers between the two threads more
        (``bench/protocol.py``: 1,671 -> 819 jobs/s with every call on a thread). So short work is
        tried here first, refusing to wait: this process's write lock taken only if free, SQLite's
        busy timeout 0. Held by anyone (a loop pass, a store thread, another process), the work
        stops with ``WouldWait`` before it has written anything, and the caller hands it to a
        store thread, where it waits its turn as usual: a locked store still never freezes the
        event loop. Once a transaction of ``work`` has committed it cannot be sent again, so its
        later transactions and reads wait as on a store thread (a short wait in practice: another writer of
        this process, FIFO).
        """
        local = self._local
        if getattr(local, "inline", False):
            return work()  # already inline (a work calling another)
        self._waits(self._connection(), False)
        local.inline, local.committed = True, False
        try:
            return work()
        except errors.StoreBusy as busy:
            if local.committed:
                raise
            raise WouldWait(str(busy)) from busy
        finally:
            local.inline = False

    def _refuses_to_wait(self) -> bool:
        """Inline work that has written nothing yet: it gives up rather than wait."""
        local = self._local
        return bool(getattr(local, "inline", False) and not local.committed)

    def _waits(self, connection: sqlite3.Connection, waits: bool) -> None:
        """SQLite's busy timeout on this thread's connection: ``busy_timeout_s``, or 0 while
        inline work refuses to wait. Set only when it changes: the event loop's connection stays
        at 0 from one inline call to the next."""
        if self._local.waits != waits:
            connection.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000) if waits else 0}")
            self._local.waits = waits

    @contextmanager
    def _transaction(self) -> Iterator[_SqliteTransaction]:
        connection = self._connection()
        local = self._local
        refuse_to_wait = self._refuses_to_wait()
        if not refuse_to_wait and not local.waits:
            self._waits(connection, True)
        if not self._write_lock.acquire(timeout=0 if refuse_to_wait else self.busy_timeout_s):
            raise errors.StoreBusy(f"the SQLite store stayed busy for {self.busy_timeout_s:g}s; retry")
        try:
            try:
                connection.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as error:
                _raise_if_busy(error)
                raise
            try:
                yield local.tx
                connection.execute("COMMIT")
            except BaseException as error:
                if connection.in_transaction:
                    with contextlib.suppress(sqlite3.OperationalError):  # the error above says why
                        connection.execute("ROLLBACK")
                if isinstance(error, sqlite3.OperationalError):
                    _raise_if_busy(error)
                raise
            if refuse_to_wait:
                local.committed = True  # written: its next transaction waits like any other
        finally:
            self._write_lock.release()

    def _read(self) -> _SqliteTransaction:
        tx = self._tx
        if not self._local.waits and not self._refuses_to_wait():
            self._waits(self._local.connection, True)
        return tx

    def close(self) -> None:
        with self._connections_lock:
            for connection in self._connections:
                connection.close()
            self._connections.clear()
        self._local = threading.local()

    def ping(self, timeout_s: float, write: bool = False) -> None:
        """Ready when the file answers a read and a writer could take it now (a fresh connection,
        so neither this process's lock nor its connections are involved): another process holding
        the write lock is a busy store, not a ready one. ``write``: and a write commits
        (``PROBE_WRITE``; a full disk lets the lock be taken, not the write)."""
        try:
            connection = sqlite3.connect(
                self.path, timeout=timeout_s, check_same_thread=False, isolation_level=None
            )
            try:
                connection.execute("SELECT 1 FROM schema_migrations LIMIT 1").fetchall()
                with _busy_is_503():
                    connection.execute("BEGIN IMMEDIATE")
                    if write:
                        for statement in PROBE_WRITE:
                            connection.execute(statement)
                        connection.execute("COMMIT")
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
            finally:
                connection.close()
        except sqlite3.Error as error:
            raise errors.StoreUnavailable(f"SQLite at {self.path} did not answer: {error}") from error

    def table_columns(self) -> dict[str, tuple[str, ...]]:
        tables = [
            row[0]
            for row in self._tx.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        return {
            table: tuple(row[1] for row in self._tx.execute(f"PRAGMA table_info({table})"))
            for table in tables
        }

    def size_bytes(self) -> int:
        """Pages of the database file (the write-ahead log is not counted)."""
        read = self._read()
        return int(read.execute("PRAGMA page_count")[0][0]) * int(read.execute("PRAGMA page_size")[0][0])

    def index_names(self) -> set[str]:
        rows = self._tx.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_%'"
        )
        return {row[0] for row in rows}

    # --- the catalogue in the declaration's terms (for the migration test) -------------------

    def _tables(self) -> list[str]:
        rows = self._tx.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
        )
        return [row[0] for row in rows]

    def column_definitions(self) -> dict[str, tuple[Column, ...]]:
        """Every table's columns in order, as ``schema.Column``.

        A primary-key column reads NOT NULL: SQLite lets a non-INTEGER key hold NULL (a legacy
        quirk; corral never writes one) where PostgreSQL forbids it, and the declaration states the
        intent once for both.
        """
        definitions = {}
        for table in self._tables():
            rows = self._tx.execute(f"PRAGMA table_info({table})")
            definitions[table] = tuple(
                Column(name, declared_type.upper(), bool(not_null) or key_position > 0, default)
                for _, name, declared_type, not_null, default, key_position in rows
            )
        return definitions

    def primary_keys(self) -> dict[str, tuple[str, ...]]:
        keys = {}
        for table in self._tables():
            rows = self._tx.execute(f"PRAGMA table_info({table})")
            keys[table] = tuple(row[1] for row in sorted(rows, key=lambda row: row[5]) if row[5] > 0)
        return keys

    def index_definitions(self) -> dict[str, Index]:
        """Every index made by ``CREATE INDEX`` (not the ones SQLite makes for keys), as
        ``schema.Index``: keys from ``PRAGMA index_xinfo``, the partial predicate from the stored
        DDL (SQLite keeps the statement's text, so only its whitespace is normalised)."""
        definitions = {}
        for table in self._tables():
            for _, name, unique, origin, _partial in self._tx.execute(f"PRAGMA index_list({table})"):
                if origin != "c":
                    continue
                keys = tuple(
                    column + (" DESC" if descending else "")
                    for _, _, column, descending, _, is_key in self._tx.execute(f"PRAGMA index_xinfo({name})")
                    if is_key
                )
                (ddl,) = self._tx.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,))[0]
                where = re.search(r"\bWHERE\b(.*)$", ddl, re.DOTALL | re.IGNORECASE)
                predicate = " ".join(where.group(1).split()) if where else None
                definitions[name] = Index(table, keys, predicate, bool(unique))
        return definitions
