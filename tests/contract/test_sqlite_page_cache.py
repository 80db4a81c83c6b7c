"""SQLite's page cache: every connection of the store (the event loop's and each store thread's)
holds ``CACHE_KIB`` of pages, not SQLite's 2 MiB, which a queue of a few thousand jobs outgrows
(each claim's and report's compare-and-set then read its index pages back from the file)."""

from __future__ import annotations

import threading
from pathlib import Path

from corral.store import open_store
from corral.store.sqlite import CACHE_KIB, SqliteStore


def test_every_connection_has_the_larger_page_cache(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'cache.db'}")
    assert isinstance(store, SqliteStore)
    try:
        sizes = [store._connection().execute("PRAGMA cache_size").fetchone()[0]]

        def on_a_store_thread() -> None:
            sizes.append(store._connection().execute("PRAGMA cache_size").fetchone()[0])

        thread = threading.Thread(target=on_a_store_thread)
        thread.start()
        thread.join()
        assert sizes == [-CACHE_KIB, -CACHE_KIB], "negative: KiB, as SQLite reads it"
        assert CACHE_KIB > 2000, "larger than SQLite's default of 2,000 KiB"
    finally:
        store.close()
