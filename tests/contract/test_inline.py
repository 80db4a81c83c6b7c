"""``Backend.run_inline``: short work on the caller's thread (the event loop's) only when it need not
wait; otherwise ``WouldWait`` with nothing written, for the server to send it to a store thread.

No timings: a wait would end in ``StoreBusy`` after the busy timeout, never in ``WouldWait``, so the
exception type alone says the call did not wait.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.domain.records import JobSpec
from corral.store import Store, open_store
from corral.store.base import JobFilter, WouldWait
from tests.contract import protocol

NOW = 1_800_000_000.0


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "inline.db"


@pytest.fixture
def sqlite_store(sqlite_path: Path) -> Iterator[Store]:
    opened = open_store(f"sqlite:///{sqlite_path}")
    yield opened
    opened.close()


def submit(store: Store) -> str:
    return protocol.submit(store, [JobSpec(command="true")], NOW).items[0].job.id


def jobs(store: Store) -> int:
    return len(store.jobs.list_jobs(JobFilter(), 100, None))


def test_free_sqlite_runs_the_work_here(sqlite_store: Store) -> None:
    here = threading.current_thread()
    ran_on: list[threading.Thread] = []

    def work() -> str:
        ran_on.append(threading.current_thread())
        return submit(sqlite_store)

    assert sqlite_store.run_inline(work).startswith("j-")
    assert ran_on == [here]
    assert jobs(sqlite_store) == 1


def test_a_file_locked_by_another_process_is_would_wait_with_nothing_written(
    sqlite_store: Store, sqlite_path: Path
) -> None:
    other = sqlite3.connect(sqlite_path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(WouldWait):
            sqlite_store.run_inline(lambda: submit(sqlite_store))
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert jobs(sqlite_store) == 0
    # the same connection waits again outside inline work, and inline work runs again once free
    submit(sqlite_store)
    sqlite_store.run_inline(lambda: submit(sqlite_store))
    assert jobs(sqlite_store) == 2


def test_a_writer_of_this_process_in_the_way_is_would_wait(sqlite_store: Store) -> None:
    inside, leave = threading.Event(), threading.Event()

    def hold_a_transaction() -> None:
        with sqlite_store._transaction():  # type: ignore[attr-defined]
            inside.set()
            leave.wait(30)

    holder = threading.Thread(target=hold_a_transaction)
    holder.start()
    try:
        assert inside.wait(30)
        with pytest.raises(WouldWait):
            sqlite_store.run_inline(lambda: submit(sqlite_store))
    finally:
        leave.set()
        holder.join(30)
    assert jobs(sqlite_store) == 0


def test_after_a_commit_the_work_waits_its_turn_instead_of_giving_up(sqlite_store: Store) -> None:
    """Written once, the work cannot be sent again: its next transaction waits for the writer
    that came in between, and the whole work completes here."""
    inside, leave = threading.Event(), threading.Event()

    def hold_a_transaction() -> None:
        with sqlite_store._transaction():  # type: ignore[attr-defined]
            inside.set()
            leave.wait(30)

    holder = threading.Thread(target=hold_a_transaction)

    def two_transactions() -> list[str]:
        first = submit(sqlite_store)
        holder.start()
        assert inside.wait(30)
        threading.Timer(0.2, leave.set).start()
        return [first, submit(sqlite_store)]

    try:
        assert len(sqlite_store.run_inline(two_transactions)) == 2
    finally:
        leave.set()
        holder.join(30)
    assert jobs(sqlite_store) == 2


@pytest.mark.postgres
def test_postgresql_never_runs_work_inline() -> None:
    from tests.conftest import postgres_schema_url

    urls = postgres_schema_url()
    store = open_store(next(urls))
    try:
        with pytest.raises(WouldWait):
            store.run_inline(lambda: submit(store))
        assert jobs(store) == 0
    finally:
        store.close()
        urls.close()
