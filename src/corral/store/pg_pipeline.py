"""PostgreSQL's statements on the wire: a transaction's ``BEGIN`` and deferred compare-and-sets sent
with its next statement (``OpenTransaction``), several statements in one round trip with every value
a bound parameter (``Pipeline``: libpq's pipeline mode), and a lost or busy database told apart
(``unavailable_on_connection_loss``). ``store.postgres`` is the store built on them.
"""

from __future__ import annotations

import itertools
import math
import re
import select
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from corral.domain import errors
from corral.store import on_loop

try:  # the driver is an optional extra: corral[postgres]
    import psycopg
    from psycopg import pq
    from psycopg.adapt import PyFormat, Transformer
    from psycopg.waiting import READY_R, READY_RW, READY_W, WAIT_R, WAIT_RW, WAIT_W

    TUPLES_OK = pq.ExecStatus.TUPLES_OK
    _FATAL_ERROR = pq.ExecStatus.FATAL_ERROR
    _PIPELINE_SYNC = pq.ExecStatus.PIPELINE_SYNC
    _TEXT = PyFormat.TEXT
    _COMMAND_OK = pq.ExecStatus.COMMAND_OK
    _CONNECTION_BAD = pq.ConnStatus.BAD
    #: a connection's transaction status while a statement is in flight, or once it is lost
    _MID_STATEMENT = (pq.TransactionStatus.ACTIVE, pq.TransactionStatus.UNKNOWN)
    #: psycopg's waits as poll's events, and the readiness each answers with
    _POLL = {WAIT_R: select.POLLIN, WAIT_W: select.POLLOUT, WAIT_RW: select.POLLIN | select.POLLOUT}
    _READY = {select.POLLIN: READY_R, select.POLLOUT: READY_W, select.POLLIN | select.POLLOUT: READY_RW}
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]

_Connection: Any = psycopg.Connection if psycopg is not None else object


class LoopConnection(_Connection):  # type: ignore[misc]
    """A psycopg connection whose waits, in work running on the event loop (``on_loop``), are the
    loop's: the statements psycopg sends itself (a transaction's, ``executemany``) then wait as the
    pipeline's do. Anywhere else it waits as psycopg does."""

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        if on_loop.session() is None:
            return super().wait(gen, interval, timeout)
        pgconn = self.pgconn
        fileno = pgconn.socket
        try:
            waiting = next(gen)
            while True:
                ready = on_loop.wait_socket(fileno, _POLL[waiting], pgconn)
                waiting = gen.send(_READY[ready & (select.POLLIN | select.POLLOUT)])
        except StopIteration as finished:
            return finished.value
        except BaseException as error:
            if _left_mid_statement(self.pgconn, error):
                self.close()  # a statement left half-answered: the session's next work reconnects
            raise


def _left_mid_statement(pgconn: Any, error: BaseException) -> bool:
    """Whether ``error``, raised from psycopg's wait on ``pgconn``, leaves the connection unusable:
    anything but the database's own answer to a statement (a lock timeout, a deadlock, ``1/0``:
    read whole, the session fine, as a store thread keeps it), or a connection lost, or one left
    in the middle of a statement (the work's caller went away while it waited)."""
    if not isinstance(error, psycopg.Error) or getattr(error, "sqlstate", None) is None:
        return True
    return bool(pgconn.status == _CONNECTION_BAD or pgconn.transaction_status in _MID_STATEMENT)


#: the answer of a compare-and-set sent without waiting for it (``checked``): one divided by the
#: count of rows it matched, so that a miss fails the statement with ``division_by_zero`` (SQLSTATE
#: 22012) and the transaction it was sent in aborts before its ``COMMIT`` takes effect
CHECKED_ANSWER = "SELECT 1 / count(*) FROM moved"


class OpenTransaction:
    """The transaction open on one thread's connection, begun lazily: its ``BEGIN`` travels with
    its first statement, and the compare-and-sets whose only answer is "matched, else roll back"
    (``defer``) travel with the statement after them or with the ``COMMIT``, in one pipeline
    (``Pipeline``: one round trip, every value a bound parameter). Each is a round trip the server
    no longer waits for (a claim: five round trips become three; two once its first two reads go
    together, ``_PostgresTransaction.execute_each``)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.connection = pipeline.connection
        self.begun = False
        #: statements to send before the next one, in order, each raising if it matched no row
        self.deferred: list[tuple[str, Sequence[Any]]] = []

    def waiting(self) -> bool:
        """Whether a ``BEGIN`` or deferred writes wait to be sent."""
        return not self.begun or bool(self.deferred)

    def prefix(self) -> list[tuple[str, Sequence[Any]]]:
        """What must run before the next statement (and clear it): ``BEGIN``, the deferred writes."""
        prefix = ([] if self.begun else [("BEGIN", ())]) + self.deferred
        self.begun, self.deferred = True, []
        return prefix

    def send_prefix(self) -> None:
        """Send what is waiting alone (before a statement that cannot carry it)."""
        if self.waiting():
            self.pipeline.last(self.prefix())

    def commit(self) -> None:
        """``COMMIT``, with the deferred writes in front of it: one round trip."""
        if self.begun or self.deferred:  # else nothing was sent: nothing to commit
            self.pipeline.last([*self.prefix(), ("COMMIT", ())])

    def rollback(self) -> None:
        """Roll back what was sent (``roll_back``)."""
        self.deferred = []
        if self.begun:
            roll_back(self.connection)


def _next_result(pgconn: Any) -> Any:
    """The next result on ``pgconn``, waiting for it without holding the interpreter (on the event
    loop, the loop's wait: ``on_loop.wait_socket``)."""
    while True:
        pgconn.consume_input()
        if not pgconn.is_busy():
            return pgconn.get_result()
        _wait(pgconn, select.POLLIN)


def _flush(pgconn: Any) -> None:
    """Everything queued on ``pgconn`` sent, waiting as ``_next_result`` does."""
    while pgconn.flush():
        _wait(pgconn, select.POLLIN | select.POLLOUT)
        pgconn.consume_input()


def _wait(pgconn: Any, events: int) -> None:
    if pgconn.status == _CONNECTION_BAD:
        raise psycopg.OperationalError("lost the connection")
    on_loop.wait_socket(pgconn.socket, events, pgconn)


def roll_back(connection: Any) -> None:
    """``ROLLBACK`` sent past psycopg (libpq's own calls, waited for as ``Pipeline`` waits, so on
    the event loop too): psycopg answers a ``ROLLBACK`` it sees by dropping every prepared
    statement of the session (``DEALLOCATE ALL``, its own and the pipeline's), though PostgreSQL
    keeps a session's prepared statements through a rollback. A connection that cannot roll back
    is closed (the next call reconnects)."""
    if connection.closed:
        return
    pgconn = connection.pgconn
    try:
        pgconn.send_query(b"ROLLBACK")
        _flush(pgconn)
        status = None
        while (result := _next_result(pgconn)) is not None:
            status = result.status if status is None else status
    except psycopg.Error:
        connection.close()
        return
    except BaseException:
        connection.close()
        raise
    if status != _COMMAND_OK:
        connection.close()


class Pipeline:
    """Several statements in one round trip on one connection, each with its values bound: libpq's
    pipeline mode, driven here rather than through psycopg's ``Connection.pipeline`` (whose
    generators cost a claim and a ``done`` about 0.5 ms more of the server's CPU). Each statement
    with values is prepared once per connection (a ``Parse`` in the pipeline that first sends it,
    with no parameter types: only statements whose parameters PostgreSQL infers from their
    context come here, the compare-and-sets and ``_PostgresTransaction.pipelined``); its values
    are sent as text, dumped by psycopg, its rows loaded by psycopg's loaders. The waits let go of
    the interpreter (``poll``), as libpq's own blocking calls would not."""

    _numbers = itertools.count(1)

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.pgconn = connection.pgconn
        #: SQL -> the name it is prepared under on this connection
        self.names: dict[str, bytes] = {}
        self.encoding = connection.info.encoding
        self.dumper = Transformer(connection)
        self.loader = Transformer(connection)

    def run(
        self, statements: Sequence[tuple[str, Sequence[Any]]], apart: bool = False
    ) -> list[list[tuple[Any, ...]]]:
        """Each statement's rows, in order. The first that fails raises (as ``_answer_to`` says).

        Outside a transaction the statements are one implicit transaction (one sync at the end):
        a lock the first takes is held until the last has run, and PostgreSQL skips every one
        after a failure. ``apart``: a sync after each, so each commits (and lets go of its locks)
        before the next begins, still one round trip; one that fails does not stop the rest."""
        pgconn = self.pgconn
        prepared: dict[str, bytes] = {}
        #: per message: the name it prepares the statement under (else None: it runs it), the
        #: statement's SQL, its prepared name and its values (dumped before anything is sent)
        messages: list[tuple[bytes | None, str, bytes, Sequence[Any]]] = []
        for sql, params in statements:
            if not params:  # BEGIN, COMMIT: unnamed, so that psycopg's DEALLOCATE ALL cannot drop them
                messages.append((None, sql, b"", ()))
                continue
            name = self.names.get(sql) or prepared.get(sql)
            if name is None:
                name = prepared[sql] = f"corral_{next(self._numbers)}".encode()
                messages.append((name, sql, name, ()))
            messages.append((None, sql, name, self.dumper.dump_sequence(params, [_TEXT] * len(params))))
        pgconn.enter_pipeline_mode()
        try:
            for preparing, sql, name, values in messages:
                if preparing is not None:
                    pgconn.send_prepare(preparing, to_numbered(sql).encode(self.encoding))
                elif not name:
                    pgconn.send_query_params(to_numbered(sql).encode(self.encoding), None)
                else:
                    pgconn.send_query_prepared(name, values)
                if apart and preparing is None:
                    pgconn.pipeline_sync()
            if not apart:
                pgconn.pipeline_sync()
            _flush(self.pgconn)
            sent = [(preparing is not None, sql) for preparing, sql, _, _ in messages]
            rows, failure = self._results(sent, prepared, apart)
            pgconn.exit_pipeline_mode()
        except BaseException:
            self.connection.close()  # a pipeline left half-read cannot be used again
            raise
        if failure is not None:
            raise failure
        return rows

    def last(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[tuple[Any, ...]]:
        """The last statement's rows."""
        return self.run(statements)[-1]

    def _results(
        self, sent: list[tuple[bool, str]], prepared: dict[str, bytes], apart: bool = False
    ) -> tuple[list[list[tuple[Any, ...]]], Exception | None]:
        """Every result up to the pipeline's sync (``apart``: each statement's own sync after it):
        the rows of each statement, the first failure."""
        rows: list[list[tuple[Any, ...]]] = []
        failure: Exception | None = None
        for preparing, sql in sent:
            result = _next_result(self.pgconn)
            if result is None:
                raise psycopg.OperationalError("the pipeline ended early: connection lost")
            while _next_result(self.pgconn) is not None:  # each result is followed by a None
                pass
            status = result.status
            if status == _FATAL_ERROR and failure is None:
                error = psycopg.errors.error_from_result(result, self.encoding)
                failure = self._answer_to(error, checked=sql.endswith(CHECKED_ANSWER))
            if preparing:
                if status == _COMMAND_OK:
                    self.names[sql] = prepared[sql]
            elif status == TUPLES_OK:
                self.loader.set_pgresult(result)
                rows.append(self.loader.load_rows(0, result.ntuples, tuple))
            else:
                rows.append([])
            if apart and not preparing:
                self._synced()
        if not apart:
            self._synced()
        return rows, failure

    def _synced(self) -> None:
        """The next result is a sync's, else the connection is lost."""
        synced = _next_result(self.pgconn)
        if synced is None or synced.status != _PIPELINE_SYNC:
            raise psycopg.OperationalError("the pipeline's sync did not come back: connection lost")

    def _answer_to(self, error: psycopg.Error, checked: bool) -> Exception:
        """The error a failed statement raises: ``Conflict`` for a checked compare-and-set that
        missed (``checked``: the statement that failed is one, and its SQLSTATE is
        ``CHECKED_ANSWER``'s); "busy, retry" when the session's prepared statements were dropped
        (psycopg's ``DEALLOCATE ALL`` after a ``ROLLBACK TO``, a ``DROP`` or an ``ALTER`` it saw;
        prepared again next time: the transaction was rolled back whole); else the driver's own."""
        if checked and isinstance(error, psycopg.errors.DivisionByZero):
            return errors.Conflict("a job changed while it was being claimed; retry")
        if isinstance(error, psycopg.errors.InvalidSqlStatementName):
            self.names.clear()
            return errors.StoreBusy(f"the database dropped a prepared statement; retry: {error}")
        return error


def to_numbered(sql: str) -> str:
    """``?`` placeholders as ``$1``, ``$2``... (a prepared statement's parameters; a statement
    without any has no ``?`` and its ``%%`` is psycopg's escape of ``%``)."""
    if "?" not in sql:
        return sql.replace("%%", "%")
    numbers = itertools.count(1)
    return re.sub(r"\?", lambda _: f"${next(numbers)}", sql)


def text_array(values: Sequence[str | None]) -> str:
    """``values`` as the text of a PostgreSQL array (``{"a","b",NULL}``), for a ``?::text[]``
    parameter: psycopg's list dumper inspects every element for its type first (a worker
    heartbeat with 8 leases: ~240 us of store CPU with lists, ~190 us with texts). Each element
    is quoted, its ``"`` and ``\\`` escaped, as the array input syntax wants."""
    return "{" + ",".join("NULL" if value is None else _quoted_element(value) for value in values) + "}"


def _quoted_element(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def number_array(values: Sequence[float | None]) -> str:
    """``text_array`` for a ``?::bigint[]`` or ``?::double precision[]`` parameter (``repr`` is
    a float's exact text; ``inf`` and ``nan`` are PostgreSQL's ``Infinity`` and ``NaN``)."""
    return "{" + ",".join(_number_element(value) for value in values) + "}"


def _number_element(value: float | None) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return repr(value)


#: SQLSTATE classes and codes of a database that cannot write now: class 53, insufficient
#: resources (53100 disk full, 53200 out of memory...); class 58, a system error (58030 an I/O
#: error); 25006, a read-only transaction (a standby, a database set read-only). The statement and
#: its transaction failed whole.
_CANNOT_WRITE_CLASSES = ("53", "58")
_CANNOT_WRITE_STATES = frozenset({"25006"})


def cannot_write(error: BaseException) -> bool:
    """Whether ``error`` is the database refusing a write it cannot make now (by its SQLSTATE)."""
    state = getattr(error, "sqlstate", None)
    return isinstance(state, str) and (state[:2] in _CANNOT_WRITE_CLASSES or state in _CANNOT_WRITE_STATES)


@contextmanager
def unavailable_on_connection_loss() -> Iterator[None]:
    """PostgreSQL's faults of its own as a 503, never a 500: busy (``StoreBusy``), unable to
    write (``StoreWriteFailed``), or gone (``StoreUnavailable``)."""
    try:
        yield
    except (
        psycopg.errors.DeadlockDetected,
        psycopg.errors.SerializationFailure,
        psycopg.errors.LockNotAvailable,
        psycopg.errors.QueryCanceled,
    ) as error:
        # Rolled back whole (a lock or statement timeout, a deadlock): safe to send again.
        raise errors.StoreBusy(f"the database is busy and aborted the transaction; retry: {error}") from error
    except psycopg.Error as error:
        if cannot_write(error):
            message = f"the database cannot write; nothing was changed: {error}"
            raise errors.StoreWriteFailed(message) from error
        if isinstance(error, psycopg.OperationalError):
            raise errors.StoreUnavailable(f"lost the PostgreSQL connection: {error}") from error
        raise
