"""The store object the server holds: the core it inherits (``SqlStore``: the jobs and their
transitions, checkpoints, the reaper's reads, leadership) and, as attributes, the parts composed
over the backend's ``Database`` and ``Dialect`` (the claim and the gangs over the core's
``Applier`` too): ``claims`` (``SqlClaims``), ``gangs`` (``SqlGangs``), ``workers``
(``SqlWorkers``), ``pools`` (``SqlPools``), ``logs`` (``SqlLogs``) and ``retention``
(``SqlRetention``). ``store.ports`` names what each one offers; a caller types against the one it
uses. A backend whose SQL differs for a part hands a part of its own (``workers_part``).
"""

from __future__ import annotations

from corral.store.claims import SqlClaims
from corral.store.gangs import SqlGangs
from corral.store.logs import SqlLogs
from corral.store.operations import SqlWorkers
from corral.store.pools import SqlPools
from corral.store.retention import SqlRetention
from corral.store.sql import SqlStore


class ComposedStore(SqlStore):
    """``SqlStore`` with its composed parts; a backend calls ``_compose`` once its connections
    are set up."""

    #: the workers' part (PostgreSQL's heartbeats a worker in one statement: its own)
    workers_part: type[SqlWorkers] = SqlWorkers

    claims: SqlClaims
    gangs: SqlGangs
    workers: SqlWorkers
    pools: SqlPools
    logs: SqlLogs
    retention: SqlRetention

    def _compose(self) -> None:
        self.claims = SqlClaims(self, self.sql_dialect, self)
        self.gangs = SqlGangs(self, self.sql_dialect, self)
        self.workers = self.workers_part(self, self.sql_dialect)
        self.pools = SqlPools(self, self.sql_dialect)
        self.logs = SqlLogs(self, self.sql_dialect)
        self.retention = SqlRetention(self, self.sql_dialect, self.size_bytes)

    def size_bytes(self) -> int:
        """What the store takes on disk (tables and indexes): the backend's."""
        raise NotImplementedError
