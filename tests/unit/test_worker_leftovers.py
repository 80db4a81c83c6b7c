"""The worker's process records (``corral.worker.leftovers``): one journal line per start and per
end, what a restarted worker reads back, and the stop of a recorded group it finds alive."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import orjson

from corral.worker import leftovers
from corral.worker.leftovers import ProcessRecords


def keys(records: ProcessRecords) -> list[tuple[str, int]]:
    return sorted((record.job_id, record.attempt) for record in records.records())


def test_a_record_is_open_from_its_start_to_its_end(tmp_path: Path):
    records = ProcessRecords(tmp_path)
    records.record("j-1", 1, os.getpid())
    records.record("j-2", 3, os.getpid())
    records.forget("j-1", 1)
    # What a restarted worker (a new ProcessRecords on the same directory) reads back.
    found = ProcessRecords(tmp_path).records()
    assert [(record.job_id, record.attempt) for record in found] == [("j-2", 3)]
    assert found[0].pgid == os.getpgid(os.getpid())


def test_forgetting_an_attempt_never_recorded_writes_nothing(tmp_path: Path):
    records = ProcessRecords(tmp_path)
    records.forget("j-1", 1)
    assert not (tmp_path / leftovers.JOURNAL).exists()


def test_a_torn_line_is_skipped(tmp_path: Path):
    records = ProcessRecords(tmp_path)
    records.record("j-1", 1, os.getpid())
    with open(tmp_path / leftovers.JOURNAL, "ab") as journal:
        journal.write(b'{"job_id": "j-2", "att')
    assert keys(ProcessRecords(tmp_path)) == [("j-1", 1)]


def test_an_older_workers_record_files_are_still_read_and_cleared(tmp_path: Path):
    older = {"job_id": "j-9", "attempt": 2, "pid": 1, "pgid": 1, "started": 0.0}
    (tmp_path / "j-9-2.json").write_bytes(orjson.dumps(older))
    records = ProcessRecords(tmp_path)
    records.record("j-1", 1, os.getpid())
    assert keys(records) == [("j-1", 1), ("j-9", 2)]
    records.clear()
    assert keys(ProcessRecords(tmp_path)) == []


def test_compaction_keeps_the_open_records_only(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(leftovers, "COMPACT_BYTES", 2000)
    records = ProcessRecords(tmp_path)
    records.record("long", 1, os.getpid())
    for number in range(100):
        records.record(f"short-{number}", 1, os.getpid())
        records.forget(f"short-{number}", 1)
    assert (tmp_path / leftovers.JOURNAL).stat().st_size <= 2000
    records.record("after", 1, os.getpid())
    assert keys(ProcessRecords(tmp_path)) == [("after", 1), ("long", 1)]


def test_a_recorded_group_left_alive_is_stopped_at_start(tmp_path: Path):
    left = subprocess.Popen(["/bin/sh", "-c", "sleep 60"], start_new_session=True)
    try:
        ProcessRecords(tmp_path).record("j-1", 1, left.pid)
        # A restarted worker: it stops the group, then holds no record any more.
        restarted = ProcessRecords(tmp_path)
        stopped = restarted.stop_leftovers(grace_s=5.0)
        assert [(record.job_id, record.attempt) for record in stopped] == [("j-1", 1)]
        assert left.wait(10) != 0
        assert keys(ProcessRecords(tmp_path)) == []
    finally:
        if left.poll() is None:
            left.kill()
            left.wait()
