"""Fixtures shared by every test: stores on both backends, a fake clock, a live server.

PostgreSQL: ``CORRAL_TEST_POSTGRES`` (default ``postgresql://postgres@127.0.0.1:5432/test``). Each
test gets its own schema, dropped afterwards. Without a reachable server the PostgreSQL tests skip
with a message saying how to enable them; with ``CORRAL_REQUIRE_POSTGRES=1`` (CI) they fail instead.

Hypothesis: the ``ci`` profile (derandomized, so every run draws the same examples; no example
database written into the checkout) unless ``CORRAL_HYPOTHESIS_PROFILE=thorough`` asks for ten
times the examples with fresh randomness. Per-test budgets (``tests.helpers.examples``) scale with it.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import Phase
from hypothesis import settings as hypothesis_settings

from corral.config import ServerSettings
from corral.store import Store, open_store
from corral.testing.clock import FakeClock
from corral.testing.server import ServerThread

POSTGRES_URL = os.environ.get("CORRAL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REQUIRE_POSTGRES = os.environ.get("CORRAL_REQUIRE_POSTGRES") == "1"
_postgres_error: str | None = None
_postgres_checked = False

#: no explain phase: on the long draws of the simulator's properties it takes minutes
PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]
hypothesis_settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=100, print_blob=True, database=None, phases=PHASES
)
hypothesis_settings.register_profile(
    "thorough",
    derandomize=False,
    deadline=None,
    max_examples=1000,
    print_blob=True,
    database=None,
    phases=PHASES,
)
hypothesis_settings.load_profile(os.environ.get("CORRAL_HYPOTHESIS_PROFILE", "ci"))


def _postgres_unavailable() -> str | None:
    global _postgres_checked, _postgres_error
    if not _postgres_checked:
        _postgres_checked = True
        try:
            import psycopg

            with psycopg.connect(POSTGRES_URL, connect_timeout=3) as connection:
                connection.execute("SELECT 1")
        except Exception as error:
            _postgres_error = f"{type(error).__name__}: {error}"
    return _postgres_error


def postgres_schema_url() -> Iterator[str]:
    """A fresh schema on the test database, as a URL whose search_path points at it."""
    problem = _postgres_unavailable()
    if problem is not None:
        message = (
            f"PostgreSQL at {POSTGRES_URL} is unreachable ({problem}); start it or set "
            "CORRAL_TEST_POSTGRES=postgresql://user@host:port/db to run these tests"
        )
        if REQUIRE_POSTGRES:
            pytest.fail(message)
        pytest.skip(message)
    import psycopg

    schema = "t_" + secrets.token_hex(6)
    with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    separator = "&" if "?" in POSTGRES_URL else "?"
    try:
        yield f"{POSTGRES_URL}{separator}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store URL for each backend: the same test runs on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'corral.db'}"
    else:
        yield from postgres_schema_url()


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = open_store(store_url)
    yield opened
    opened.close()


@pytest.fixture
def postgres_store() -> Iterator[Store]:
    """A PostgreSQL store only (for PostgreSQL-specific guards such as query plans)."""
    for url in postgres_schema_url():
        opened = open_store(url)
        yield opened
        opened.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def settings() -> ServerSettings:
    return ServerSettings(heartbeat_timeout_s=30, preempt_timeout_s=45, worker_offline_s=60)


@pytest.fixture
def server(store_url: str, clock: FakeClock, settings: ServerSettings) -> Iterator[ServerThread]:
    """A live server on its own store connection, with the test's clock and no loops running."""
    server_store = open_store(store_url)
    with ServerThread(server_store, settings, clock) as running:
        yield running
    server_store.close()
