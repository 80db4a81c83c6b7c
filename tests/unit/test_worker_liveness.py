"""The liveness rules of ``corral.core.workers`` on plain values: when a silent worker goes
offline and when one is flagged dead. The store's side (candidates, the locked row, the write) is
in tests/contract/test_store.py."""

from __future__ import annotations

from dataclasses import replace

from corral.core.workers import flagged_dead, goes_offline, silent_since
from corral.domain.records import Worker, WorkerContact
from corral.domain.resources import Resources
from corral.domain.status import WorkerStatus

NOW = 1_000.0
IDLE = WorkerContact(leased_jobs=0, last_job_heartbeat_at=None)


def worker(last_heartbeat_at: float | None = NOW - 100, status: str = WorkerStatus.ACTIVE) -> Worker:
    return Worker(
        id="w1",
        address="http://w1",
        resources=Resources(gpus=8),
        gpu_model=None,
        labels={},
        status=status,
        registered_at=0.0,
        last_heartbeat_at=last_heartbeat_at,
    )


def test_silence_counts_the_worker_and_its_jobs_heartbeats():
    assert silent_since(worker(NOW - 100), IDLE, NOW - 60)
    assert not silent_since(worker(NOW - 60), IDLE, NOW - 60)  # a beat at the cutoff is contact
    assert not silent_since(worker(NOW - 100), WorkerContact(2, NOW - 10), NOW - 60)
    assert silent_since(worker(NOW - 100), WorkerContact(2, NOW - 70), NOW - 60)
    assert not silent_since(worker(None), IDLE, NOW - 60)  # never heartbeated: not silent


def test_an_active_silent_worker_goes_offline():
    offline = goes_offline(worker(NOW - 61), IDLE, now=NOW, after_s=60)
    assert offline is not None and offline.status == WorkerStatus.OFFLINE
    assert goes_offline(worker(NOW - 59), IDLE, now=NOW, after_s=60) is None


def test_only_an_active_worker_goes_offline():
    for status in (WorkerStatus.OFFLINE, WorkerStatus.DRAINING):
        assert goes_offline(worker(NOW - 600, status=status), IDLE, now=NOW, after_s=60) is None


def test_a_worker_whose_jobs_beat_stays_online():
    assert goes_offline(worker(NOW - 600), WorkerContact(1, NOW - 5), now=NOW, after_s=60) is None


def test_a_silent_worker_holding_jobs_is_flagged_dead_once():
    holding = WorkerContact(leased_jobs=2, last_job_heartbeat_at=NOW - 40)
    flagged = flagged_dead(worker(NOW - 31), holding, now=NOW, after_s=30)
    assert flagged is not None and flagged.flagged_dead_at == NOW
    assert flagged_dead(flagged, holding, now=NOW + 5, after_s=30) is None  # once per episode


def test_an_idle_or_beating_worker_is_not_flagged():
    assert flagged_dead(worker(NOW - 600), IDLE, now=NOW, after_s=30) is None
    assert flagged_dead(worker(NOW - 600), WorkerContact(1, NOW - 1), now=NOW, after_s=30) is None
    assert flagged_dead(worker(NOW - 29), WorkerContact(1, None), now=NOW, after_s=30) is None


def test_a_heartbeat_clears_the_flag_so_silence_flags_again():
    cleared = replace(worker(NOW - 31), flagged_dead_at=None)
    assert flagged_dead(cleared, WorkerContact(1, None), now=NOW, after_s=30) is not None
