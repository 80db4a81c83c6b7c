"""The SQL store shared by both backends: the schema, the transactions and the one place a job's
row changes status, written once.

The store is ``SqlStore`` (here: migrations, the backend's transactions, applying the core's
transitions, leadership) -> ``ComposedStore`` (``store.composed``: the jobs, the claim, gangs and
reservations, workers, pools, logs and retention, each a part composed over the store's
``Database``, ``Dialect`` and ``Applier``) -> ``SqliteStore`` / ``PostgresStore``. A backend
supplies a connection, a transaction context and its ``Dialect`` (``store.dialect``: row locks,
index hints, the claim's first-page read, the DDL's blob type). Queries are written with ``?``
placeholders; the PostgreSQL backend rewrites them once.

The store decides nothing about a job's next status: its parts hand the rows a decision needs to a
decision function of ``corral.core`` and apply the plan it returns through ``_apply``, the one
place a job's row changes status: a compare-and-set on status and version, and the ``job_events``
row (and, where an attempt's hold of resources ends, its ``attempt_usage`` row), in the same
transaction.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from corral.domain import errors
from corral.domain.records import Job
from corral.domain.status import HOLDING, LEASED, is_allowed
from corral.domain.transitions import Outcome, Plan, Transition
from corral.store.base import (
    WouldWait,
)
from corral.store.dialect import Dialect
from corral.store.rows import (
    INSERT_EVENT,
    INSERT_USAGE,
    Transaction,
    changed_columns,
)
from corral.store.schema import MIGRATIONS

T = TypeVar("T")

#: a write that changes nothing, for ``Backend.ping(write=True)``: a row no migration uses, put in
#: and taken out again in the same transaction, whose commit still needs the disk (a full disk, a
#: read-only database refuse it), the way every real write does
PROBE_WRITE = (
    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (-1, 'readiness probe', 0)",
    "DELETE FROM schema_migrations WHERE version = -1",
)


class SqlStore(abc.ABC):
    """Everything but the connection. Subclasses: ``SqliteStore``, ``PostgresStore``."""

    dialect = "sql"
    #: the SQL that differs between the backends
    sql_dialect: Dialect

    @property
    def lock_clause(self) -> str:
        return self.sql_dialect.lock_clause

    @property
    def lock_clause_plain(self) -> str:
        return self.sql_dialect.lock_clause_plain

    @property
    def queue_index_hint(self) -> str:
        return self.sql_dialect.queue_index_hint

    @property
    def blob_type(self) -> str:
        return self.sql_dialect.blob_type

    def transaction(self) -> Any:
        """``Database.transaction``: the backend's transaction (``_transaction``)."""
        return self._transaction()

    def read(self) -> Transaction:
        """``Database.read``: the backend's reads (``_read``)."""
        return self._read()

    # --- backend hooks -------------------------------------------------------------------

    @abc.abstractmethod
    def _transaction(self) -> Any:
        """A context manager yielding a ``Transaction`` that commits on exit, rolls back on error."""

    @abc.abstractmethod
    def _read(self) -> Transaction:
        """A ``Transaction`` for reads outside any write transaction."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def run_inline(self, work: Callable[[], T]) -> T:
        """Never inline here: every statement is a round trip to a database server, a wait the event
        loop must not make. ``SqliteStore`` runs short work inline when no lock is in the way."""
        raise WouldWait("this store runs no work inline")

    @abc.abstractmethod
    def ping(self, timeout_s: float, write: bool = False) -> None:
        """Raise ``StoreUnavailable`` unless the store answers, and a writer could take it, within
        ``timeout_s``; ``write``: and a write commits (``PROBE_WRITE``)."""

    @abc.abstractmethod
    def table_columns(self) -> dict[str, tuple[str, ...]]:
        """The tables and columns the database holds (for the migration test)."""

    @abc.abstractmethod
    def index_names(self) -> set[str]: ...

    # --- schema --------------------------------------------------------------------------

    def migrate(self) -> None:
        """Apply every migration not yet applied, each in its own transaction."""
        with self._transaction() as tx:
            tx.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations"
                " (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
            )
        applied = {row[0] for row in self._read().execute("SELECT version FROM schema_migrations")}
        for migration in MIGRATIONS:
            if migration.version in applied:
                continue
            with self._transaction() as tx:
                for statement in migration.statements:
                    tx.execute(statement.replace("{blob}", self.blob_type))
                if self.dialect == "postgresql":
                    for statement in migration.postgres_statements:
                        tx.execute(statement)
                tx.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, 0)",
                    (migration.version, migration.name),
                )

    # --- applying the core's decisions ---------------------------------------------------

    def _apply(
        self, tx: Transaction, transition: Transition, guard: str = "", guard_params: Sequence[Any] = ()
    ) -> Job:
        """Write one transition: the one place a job's row changes status.

        A compare-and-set on the row's status and version (the event count): the decision was made
        on exactly that row, so it applies to exactly that row, and the row is then exactly
        ``transition.after``. A status change is checked against the status table and appends its
        ``job_events`` row; a change of fields alone writes none. A missed compare-and-set means the
        row moved under a decision that was supposed to hold it locked: it raises ``Conflict`` and
        the whole transaction rolls back. ``guard`` (a condition on the row, with ``guard_params``)
        narrows the compare-and-set further (``PostgresStore.change``: the row version it read).
        """
        if not self.applied(tx, transition, guard, guard_params):
            raise errors.Conflict(f"job {transition.before.id} changed while it was being decided on; retry")
        return transition.after

    def applied(
        self, tx: Transaction, transition: Transition, guard: str = "", guard_params: Sequence[Any] = ()
    ) -> bool:
        """``_apply``'s compare-and-set and event row; whether the row matched (a miss writes
        nothing)."""
        statement = self.compare_and_set(transition, guard, guard_params)
        return statement is None or self._write(tx, *statement)

    def _apply_all(self, tx: Transaction, transitions: Sequence[Transition]) -> None:
        """``_apply`` each, in order (PostgreSQL sends a run of like statements at once)."""
        for transition in transitions:
            self._apply(tx, transition)

    def compare_and_set(
        self, transition: Transition, guard: str = "", guard_params: Sequence[Any] = ()
    ) -> tuple[str, list[Any], tuple[Any, ...] | None, tuple[Any, ...] | None] | None:
        """The compare-and-set of ``transition``, its parameters, its event row and its usage row
        (None when the transition writes nothing)."""
        before, after = transition.before, transition.after
        moves = transition.changes_status
        if moves and not is_allowed(before.status, after.status):
            raise AssertionError(f"transition {before.status} -> {after.status} is not in the table")
        changes = changed_columns(transition)
        if not changes:
            return None
        assignments = [f"{column} = ?" for column in changes]
        if moves:
            assignments.append("event_count = event_count + 1")
        update = (
            f"UPDATE jobs SET {', '.join(assignments)} WHERE id = ? AND status = ? AND event_count = ?"
            f"{guard} RETURNING id"
        )
        params = [*changes.values(), before.id, before.status.value, before.version, *guard_params]
        return (
            update,
            params,
            self._event_values(transition) if moves else None,
            self.usage_values(transition),
        )

    @staticmethod
    def _event_values(transition: Transition) -> tuple[Any, ...]:
        """The ``job_events`` row of a status change, in ``EVENT_COLUMNS`` order."""
        after, reason = transition.after, transition.reason
        return (
            after.id, after.version, transition.at, transition.before.status.value, after.status.value,
            reason.code if reason else None, reason.message if reason else None,
            transition.epoch, after.worker_id, after.attempts,
        )  # fmt: skip

    @staticmethod
    def usage_values(transition: Transition) -> tuple[Any, ...] | None:
        """The ``attempt_usage`` row of a transition that ends an attempt's hold of resources (in
        ``USAGE_COLUMNS`` order), None for any other.

        An attempt holds its resources from its start (``started_at``: the claim) while it is
        running or preempting; the transition that takes it to a status that holds nothing (done,
        failed, preempted, cancelled, back to the queue) ends the hold, whatever ended it. A
        reservation that was never claimed ran no attempt and writes none. ``wait_s``: how long
        the job waited for its first attempt."""
        before, after = transition.before, transition.after
        if before.status not in LEASED or after.status in HOLDING or before.started_at is None:
            return None
        spec = before.spec
        return (
            before.id, before.attempts, spec.user, spec.pool, before.worker_id,
            spec.resources.gpus, spec.resources.cpus, before.submitted_at, before.started_at,
            transition.at,
            before.started_at - before.submitted_at if before.attempts == 1 else None,
            after.status.value,
        )  # fmt: skip

    def _write(
        self,
        tx: Transaction,
        update: str,
        params: list[Any],
        event: tuple[Any, ...] | None,
        usage: tuple[Any, ...] | None = None,
    ) -> bool:
        """Run the compare-and-set ``update`` and, when it matched, insert ``event`` and
        ``usage``; whether it matched. Several statements here; PostgreSQL makes them one."""
        if not tx.execute(update, params):
            return False
        if event is not None:
            tx.execute(INSERT_EVENT, event)
        if usage is not None:
            tx.execute(INSERT_USAGE, usage)
        return True

    # ``Applier``, for the composed parts (``store.dialect``)
    def apply_transition(self, tx: Transaction, transition: Transition) -> Job:
        return self._apply(tx, transition)

    def apply_transitions(self, tx: Transaction, transitions: Sequence[Transition]) -> None:
        self._apply_all(tx, transitions)

    def apply_plan(self, tx: Transaction, plan: Plan[Outcome]) -> Outcome:
        return self._apply_plan(tx, plan)

    def _apply_plan(self, tx: Transaction, plan: Plan[Outcome]) -> Outcome:
        for transition in plan.transitions:
            self._apply(tx, transition)
        return plan.outcome

    # --- leadership ----------------------------------------------------------------------

    def try_lead(self, loop: str) -> bool:
        """Whether this process runs ``loop`` now. One process per SQLite file: always."""
        return True
