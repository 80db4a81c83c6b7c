"""The store object the server holds: the database it inherits (``SqlStore``: the schema, the
transactions, the one compare-and-set per transition, leadership) and, as attributes, the parts
composed over the backend's ``Database`` and ``Dialect`` (the jobs, the claim and the gangs over the
store's ``Applier`` too): ``jobs`` (``SqlJobs``), ``claims`` (``SqlClaims``), ``gangs``
(``SqlGangs``), ``workers`` (``SqlWorkers``), ``pools`` (``SqlPools``), ``logs`` (``SqlLogs``),
``retention`` (``SqlRetention``), ``usage`` (``SqlUsage``) and ``history`` (``SqlHistory``).
``store.ports`` names what each one offers; a caller types against the one it uses. A backend whose
SQL differs for a part hands a part of its own (``workers_part``, ``_jobs_part``).
"""

from __future__ import annotations

from corral.store.claims import SqlClaims
from corral.store.gangs import SqlGangs
from corral.store.history import SqlHistory
from corral.store.jobs import SqlJobs
from corral.store.logs import SqlLogs
from corral.store.operations import SqlWorkers
from corral.store.pools import SqlPools
from corral.store.retention import SqlRetention
from corral.store.sql import SqlStore
from corral.store.usage import SqlUsage


class ComposedStore(SqlStore):
    """``SqlStore`` with its composed parts; a backend calls ``_compose`` once its connections
    are set up."""

    #: the workers' part (PostgreSQL's heartbeats a worker in one statement: its own)
    workers_part: type[SqlWorkers] = SqlWorkers

    jobs: SqlJobs
    claims: SqlClaims
    gangs: SqlGangs
    workers: SqlWorkers
    pools: SqlPools
    logs: SqlLogs
    retention: SqlRetention
    usage: SqlUsage
    history: SqlHistory

    def _compose(self) -> None:
        self.jobs = self._jobs_part()
        self.claims = SqlClaims(self, self.sql_dialect, self)
        self.gangs = SqlGangs(self, self.sql_dialect, self)
        self.workers = self.workers_part(self, self.sql_dialect, self.jobs)
        self.pools = SqlPools(self, self.sql_dialect)
        self.logs = SqlLogs(self, self.sql_dialect)
        self.retention = SqlRetention(self, self.sql_dialect, self.size_bytes)
        self.usage = SqlUsage(self, self.sql_dialect)
        self.history = SqlHistory(self, self.sql_dialect)

    def _jobs_part(self) -> SqlJobs:
        """The jobs' part (PostgreSQL settles a report in one statement: its own)."""
        return SqlJobs(self, self.sql_dialect, self)

    def size_bytes(self) -> int:
        """What the store takes on disk (tables and indexes): the backend's."""
        raise NotImplementedError
