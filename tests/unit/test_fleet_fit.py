"""``bench/fleet_fit.py``: the least-squares line, the cells it reads from ``bench/fleet.py --json``,
and the projection it draws from them (synthetic results whose per-host cost is known)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import orjson
import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "fleet_fit.py"
_SPEC = importlib.util.spec_from_file_location("fleet_fit", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
fleet_fit = importlib.util.module_from_spec(_SPEC)
sys.modules["fleet_fit"] = fleet_fit  # dataclasses look their module up by name
_SPEC.loader.exec_module(fleet_fit)


def test_a_line_through_exact_points_is_found() -> None:
    line = fleet_fit.fit([1000, 2000, 5000], [0.3, 0.5, 1.1])
    assert line.slope == pytest.approx(0.0002)
    assert line.intercept == pytest.approx(0.1)
    assert line.r_squared == pytest.approx(1.0)
    assert line.at(10_000) == pytest.approx(2.1)


def test_scattered_points_give_the_least_squares_line_and_its_r_squared() -> None:
    line = fleet_fit.fit([0, 1, 2, 3], [1, 3, 2, 4])
    assert line.slope == pytest.approx(0.8)
    assert line.intercept == pytest.approx(1.3)
    assert line.r_squared == pytest.approx(0.64)


def test_a_line_needs_two_fleet_sizes() -> None:
    with pytest.raises(ValueError, match="two distinct"):
        fleet_fit.fit([1000, 1000], [0.3, 0.4])


def _run(replicas: int, hosts: int, served: float, per_host: float, **extra: object) -> dict[str, object]:
    """One ``bench/fleet.py --json`` line: a 10 s idle window whose servers answered ``served``
    hosts' heartbeats (one per 5 s) at ``per_host`` CPU seconds per second each, split evenly."""
    seconds = 10.0
    main = [0.05 * seconds + per_host * served * seconds / replicas for _ in range(replicas)]
    window = {
        "name": "idle",
        "seconds": seconds,
        "beats": int(served / 5 * seconds),
        "p50_ms": 5.0,
        "p99_ms": 20.0,
        "max_ms": 40.0,
        "lag_max_ms": 10.0,
        "missed": 0,
        "failures": {},
        "server_cpu_s": sum(main) + 0.5,
        "replica_cpu_s": [main[0] + 0.5, *main[1:]],
        "replica_main_cpu_s": main,
        "postgres_cpu_s": None,
        "postgres_own_cpu_s": 0.5 * per_host * served * seconds,
        "driver_cpu_s": 0.1,
        "load_average": 1.0,
        "admission_passes": 2.0,
        "admission_seconds": 0.4,
        **extra,
    }
    return {
        "when": "2026-11-27T13:00:00Z",
        "db": "postgres",
        "replicas": replicas,
        "workers": hosts,
        "jobs_per_worker": 8,
        "batched": True,
        "heartbeat_s": 5.0,
        "cores": 2,
        "windows": [window],
    }


def _write(path: Path, runs: list[dict[str, object]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(run) + b"\n" for run in runs))
    return path


def test_cells_read_cores_and_the_hosts_served(tmp_path: Path) -> None:
    results = _write(tmp_path / "r.jsonl", [_run(2, 2000, 1500.0, 1e-4)])
    (cell,) = fleet_fit.read_cells([results], "idle")
    assert cell.served == pytest.approx(1500.0)
    assert cell.main == pytest.approx((0.125, 0.125))
    assert cell.mains == pytest.approx(0.25)
    assert cell.total == pytest.approx(0.3)
    assert cell.postgres_own == pytest.approx(0.075)
    assert cell.postgres_all != cell.postgres_all  # not recorded: NaN
    assert cell.admission_ms == pytest.approx(200.0)
    assert fleet_fit.read_cells([results], "load") == []


def test_a_cheap_heartbeat_projects_under_the_bar_and_a_dear_one_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cheap = _write(tmp_path / "cheap.jsonl", [_run(3, n, n, 1e-4) for n in (1000, 2000)])
    assert fleet_fit.main([str(cheap), "--window", "idle"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the figures, not their columns
    assert "main processes' CPU per heartbeat 0.50 ms" in out
    assert "main processes, all replicas 1.15 cores" in out
    assert "-> heartbeat p99 < 100 ms plausible on 3 replicas" in out

    dear = _write(tmp_path / "dear.jsonl", [_run(3, n, n, 4e-4) for n in (1000, 2000)])
    assert fleet_fit.main([str(dear), "--window", "idle"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the figures, not their columns
    assert "saturated: no p99" in out
    assert "-> heartbeat p99 < 100 ms not shown on 3 replicas" in out


def test_cells_whose_servers_fell_behind_are_left_out_of_the_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [_run(3, 1000, 1000, 1e-4), _run(3, 2000, 2000, 1e-4), _run(3, 5000, 2500, 4e-4)]
    assert fleet_fit.main([str(_write(tmp_path / "r.jsonl", runs)), "--window", "idle"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the figures, not their columns
    assert "left out of the fit" in out and "5000 on 3" in out
    assert "main processes' CPU per heartbeat 0.50 ms" in out


def test_a_client_is_saturated_when_one_load_process_is_not_when_all_of_them_together_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spread = {"driver_cpu_s": 20.0, "driver_each_cpu_s": [5.0, 5.0, 5.0, 5.0]}  # 2 cores, 0.5 each
    one = {"driver_cpu_s": 9.0}  # before the split: one load process, 0.9 of a core
    runs = [
        _run(3, 1000, 1000, 1e-4, **spread),
        _run(3, 2000, 2000, 1e-4, **spread),
        _run(3, 5000, 5000, 1e-4, **one),
    ]
    results = _write(tmp_path / "r.jsonl", runs)
    cells = fleet_fit.read_cells([results], "idle")
    assert [cell.driver_busiest for cell in cells] == pytest.approx([0.5, 0.5, 0.9])
    assert [cell.driver for cell in cells] == pytest.approx([2.0, 2.0, 0.9])
    assert fleet_fit.main([str(results), "--window", "idle"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "left out of the fit" in out and "5000 on 3" in out
    assert "1000 on 3" not in out.split("left out of the fit")[1].split("==")[0]
