"""``bench/fleet.py --load-processes N``: what each load process recorded in a window, sent to the
parent as JSON and merged there, is the window one process recording every host would have made."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

_BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(_BENCH))  # fleet.py imports its neighbours, harness and machine
import fleet  # noqa: E402

sys.path.remove(str(_BENCH))


def _record(window: fleet.Window, replica: int, latency: float, status: int, worker: bool) -> None:
    """One heartbeat as ``simulate_host`` records it."""
    window.lag.append(latency / 10)
    window.statuses[status] = window.statuses.get(status, 0) + 1
    window.replica_latency.setdefault(replica, []).append(latency)
    if latency > fleet.SLOW_BEAT_S:
        window.slow_beats.append((100.0 + latency, latency, replica))
    (window.worker_latency if worker else window.job_latency).append(latency)
    if status == 409:
        window.stale += 1


BEATS = [(0, 0.01, 200, True), (1, 0.2, 200, False), (2, 0.03, 409, False), (0, 0.09, 503, True)]


def test_shares_merged_in_the_parent_make_the_window_of_one_process() -> None:
    whole = fleet.Window("load")
    shares = [fleet.Window("share"), fleet.Window("share")]
    for index, beat in enumerate(BEATS):
        _record(whole, *beat)
        _record(shares[index % 2], *beat)
    merged = fleet.Window("load")
    for share in shares:  # through JSON, as they come over the pipe
        fleet.merge_share(merged, orjson.loads(orjson.dumps(fleet.window_share(share))))
    assert sorted(merged.job_latency) == sorted(whole.job_latency)
    assert sorted(merged.worker_latency) == sorted(whole.worker_latency)
    assert sorted(merged.heartbeats) == sorted(whole.heartbeats)
    assert merged.statuses == whole.statuses == {200: 2, 409: 1, 503: 1}
    assert merged.stale == whole.stale == 1
    assert sorted(merged.lag) == sorted(whole.lag)
    assert {replica: sorted(values) for replica, values in merged.replica_latency.items()} == {
        replica: sorted(values) for replica, values in whole.replica_latency.items()
    }
    assert sorted(merged.slow_beats) == sorted(whole.slow_beats)
    assert all(isinstance(beat, tuple) for beat in merged.slow_beats)


@pytest.mark.parametrize(("cores", "processes"), [(None, 1), (2, 1), (4, 1), (16, 4), (64, 8)])
def test_the_default_takes_a_quarter_of_the_cores_one_to_eight(
    monkeypatch: pytest.MonkeyPatch, cores: int | None, processes: int
) -> None:
    monkeypatch.setattr(fleet.os, "cpu_count", lambda: cores)
    assert fleet.default_load_processes() == processes
