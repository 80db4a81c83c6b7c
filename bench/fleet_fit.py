"""The per-host cost of a fleet, fitted from ``bench/fleet.py --json`` results, and projected.

Reads the JSON lines that ``bench/fleet.py --json FILE`` appends (one per fleet size and replica
count), prints per cell the heartbeat latencies and the CPU of every party in cores (CPU seconds
over the window's seconds: more robust than latencies on a shared machine), then fits each CPU as a
straight line (least squares, per replica count) in the hosts *served*: heartbeats answered per
second x the interval, which is the fleet size where the servers kept up and less where, starved
of CPU by the machine's other tenants, they fell behind. Projected to ``--hosts`` (10,000) on
``--replicas`` (3):

- the servers' total (with the planner and reader processes), their main processes' total (the
  interpreters that answer heartbeats) and the busiest main process;
- PostgreSQL: the backends serving the bench's servers (``pg own``), pooled over the replica
  counts (the database's work per heartbeat does not depend on which replica sends it);
- a queueing estimate of the heartbeat p99 on the busiest main process: with S the CPU one
  heartbeat costs (the main processes' slope x the interval) and rho that process's projected
  share of its core, an M/M/1 server answers 99% within S x ln(100) / (1 - rho). It is a floor: a
  replica is not M/M/1, and it says nothing once rho nears 1.

    .venv/bin/python bench/fleet_fit.py results.jsonl [--window load] [--hosts 10000] [--replicas 3]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

#: utilisation of one core under which a replica keeps its queue short (the issue's bar)
UTILISATION_BAR = 0.65


@dataclass(frozen=True)
class Line:
    """``y = intercept + slope x``, and how well it fits (R^2)."""

    slope: float
    intercept: float
    r_squared: float
    points: int

    def at(self, x: float) -> float:
        return self.intercept + self.slope * x


def fit(xs: Sequence[float], ys: Sequence[float]) -> Line:
    """Ordinary least squares of ys on xs (at least two distinct xs)."""
    pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if y == y]  # drop NaN
    count = len(pairs)
    if len({x for x, _ in pairs}) < 2:
        raise ValueError("a line needs at least two distinct fleet sizes")
    mean_x = sum(x for x, _ in pairs) / count
    mean_y = sum(y for _, y in pairs) / count
    spread = sum((x - mean_x) ** 2 for x, _ in pairs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in pairs) / spread
    intercept = mean_y - slope * mean_x
    residual = sum((y - intercept - slope * x) ** 2 for x, y in pairs)
    total = sum((y - mean_y) ** 2 for _, y in pairs)
    return Line(slope, intercept, 1 - residual / total if total else 1.0, count)


@dataclass(frozen=True)
class Cell:
    """One window of one run, its CPU in cores."""

    replicas: int
    hosts: int
    #: the hosts the servers kept up with: heartbeats answered per second x the interval (below
    #: ``hosts`` where the servers, starved of CPU on a shared machine, fell behind)
    served: float
    when: str
    p50_ms: float
    p99_ms: float
    max_ms: float
    lag_max_ms: float
    missed: int
    total: float
    replica: tuple[float, ...]
    #: each replica's main process alone (no planner or reader process): the interpreter that
    #: answers the heartbeats (empty in results from before it was recorded)
    main: tuple[float, ...]
    postgres_own: float
    postgres_all: float
    #: the load processes' CPU together (cores): the client's cost
    driver: float
    load_average: float
    admission_ms: float
    heartbeat_s: float
    #: the busiest load process's CPU (cores; ``driver`` in results from before ``bench/fleet.py``
    #: split the hosts over several): near a core, the client saturated
    driver_busiest: float = float("nan")

    @property
    def mains(self) -> float:
        """The main processes' total (NaN in results from before they were recorded: such a
        cell counts in the servers' fit, not in the main processes')."""
        return sum(self.main) if self.main else float("nan")

    @property
    def busiest_main(self) -> float:
        return max(self.main) if self.main else float("nan")


def _number(value: object) -> float:
    return float("nan") if value is None else float(value)  # type: ignore[arg-type]


def read_cells(paths: Sequence[Path], window: str) -> list[Cell]:
    cells = []
    for path in paths:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            run = orjson.loads(line)
            for seen in run["windows"]:
                if seen["name"] != window:
                    continue
                seconds = seen["seconds"]
                passes = seen["admission_passes"]
                cells.append(
                    Cell(
                        replicas=run["replicas"],
                        hosts=run["workers"],
                        served=seen["beats"] / seconds * run["heartbeat_s"],
                        when=run["when"],
                        p50_ms=_number(seen["p50_ms"]),
                        p99_ms=_number(seen["p99_ms"]),
                        max_ms=_number(seen["max_ms"]),
                        lag_max_ms=_number(seen["lag_max_ms"]),
                        missed=seen["missed"],
                        total=seen["server_cpu_s"] / seconds,
                        replica=tuple(cpu / seconds for cpu in seen["replica_cpu_s"]),
                        main=tuple(cpu / seconds for cpu in seen.get("replica_main_cpu_s", ())),
                        postgres_own=_number(seen["postgres_own_cpu_s"]) / seconds,
                        postgres_all=_number(seen["postgres_cpu_s"]) / seconds,
                        driver=seen["driver_cpu_s"] / seconds,
                        load_average=seen["load_average"],
                        admission_ms=1e3 * seen["admission_seconds"] / passes if passes else float("nan"),
                        heartbeat_s=run["heartbeat_s"],
                        driver_busiest=max(seen.get("driver_each_cpu_s") or [seen["driver_cpu_s"]]) / seconds,
                    )
                )
    return sorted(cells, key=lambda cell: (cell.replicas, cell.hosts, cell.when))


def print_cells(cells: Sequence[Cell]) -> None:
    print(
        f"{'R':>2} {'hosts':>6} {'served':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'lag ms':>7}"
        f" {'missed':>6} {'servers':>8} {'each replica':<18} {'main procs':<18} {'pg own':>7}"
        f" {'pg all':>7} {'driver':>7} {'adm ms':>7} {'load':>5}"
    )
    for cell in cells:
        shares = "+".join(f"{cpu:.2f}" for cpu in cell.replica)
        mains = "+".join(f"{cpu:.2f}" for cpu in cell.main) or "-"
        print(
            f"{cell.replicas:>2} {cell.hosts:>6} {cell.served:>6.0f} {cell.p50_ms:>7.1f}"
            f" {cell.p99_ms:>7.1f} {cell.max_ms:>7.0f} {cell.lag_max_ms:>7.0f} {cell.missed:>6}"
            f" {cell.total:>8.2f} {shares:<18} {mains:<18} {cell.postgres_own:>7.2f}"
            f" {cell.postgres_all:>7.2f} {cell.driver:>7.2f} {cell.admission_ms:>7.0f}"
            f" {cell.load_average:>5.1f}"
        )
    print(
        "(CPU in cores: CPU seconds / window seconds; each replica with its planner and reader"
        " processes, main procs without; pg own: the backends of this bench's servers)"
    )


def print_line(label: str, line: Line, hosts: int) -> None:
    print(
        f"  {label:<34} {1e6 * line.slope:>8.1f} {line.intercept:>9.3f} {line.r_squared:>6.3f}"
        f" {line.points:>3} {line.at(hosts):>10.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("results", nargs="+", type=Path, help="JSON lines from bench/fleet.py --json")
    parser.add_argument("--window", choices=["idle", "load"], default="load")
    parser.add_argument("--hosts", type=int, default=10_000, help="fleet size to project to")
    parser.add_argument("--replicas", type=int, default=3, help="replica count to project for")
    parser.add_argument(
        "--max-driver",
        type=float,
        default=0.8,
        help="leave out cells whose busiest load process used more of a core than this (the client"
        " saturated)",
    )
    parser.add_argument(
        "--min-served",
        type=float,
        default=0.9,
        help="leave out cells whose servers answered less than this share of the offered heartbeats"
        " (behind, with a backlog, a heartbeat costs more: the fit is of servers that keep up)",
    )
    args = parser.parse_args(argv)
    cells = read_cells(args.results, args.window)
    if not cells:
        print(f"no {args.window} windows in {', '.join(map(str, args.results))}", file=sys.stderr)
        return 1
    print(f"== {args.window} window, every cell ==")
    print_cells(cells)
    kept = [
        cell
        for cell in cells
        if cell.driver_busiest <= args.max_driver and cell.served >= args.min_served * cell.hosts
    ]
    if len(kept) < len(cells):
        print(
            f"left out of the fit (a load process over {args.max_driver:g} of a core, or under"
            f" {args.min_served:.0%} of the heartbeats answered): ",
            end="",
        )
        print(", ".join(f"{cell.hosts} on {cell.replicas}" for cell in cells if cell not in kept))

    hosts = args.hosts
    print(f"\n== fits: cores = intercept + slope x hosts served; projected to {hosts} hosts ==")
    print(f"  {'':<34} {'us/s/host':>8} {'intercept':>9} {'R^2':>6} {'n':>3} {'at ' + str(hosts):>10}")
    lines: dict[tuple[str, int], Line] = {}
    for replicas in sorted({cell.replicas for cell in kept}):
        these = [cell for cell in kept if cell.replicas == replicas]
        if len({cell.hosts for cell in these}) < 2:  # one fleet size (maybe run twice): no line
            continue
        xs = [cell.served for cell in these]
        for name, values in (
            ("servers", [cell.total for cell in these]),
            ("main processes", [cell.mains for cell in these]),
            ("busiest main process", [cell.busiest_main for cell in these]),
            ("postgres own", [cell.postgres_own for cell in these]),
            ("load process", [cell.driver for cell in these]),
        ):
            try:
                lines[(name, replicas)] = fit(xs, values)
            except ValueError:  # fewer than two sizes recorded it
                continue
            print_line(f"{name}, {replicas} replica(s)", lines[(name, replicas)], hosts)
    pooled = fit([cell.served for cell in kept], [cell.postgres_own for cell in kept])
    print_line("postgres own, every replica count", pooled, hosts)

    target = args.replicas
    if ("servers", target) not in lines:
        print(f"\nno fit for {target} replicas: nothing to project", file=sys.stderr)
        return 1
    heartbeat_s = kept[0].heartbeat_s
    servers = lines[("servers", target)]
    # (results without the main processes apart: the servers' lines stand in for them)
    mains = lines.get(("main processes", target), servers)
    busiest = lines.get(("busiest main process", target), servers)
    # what a heartbeat costs the interpreter that answers it: the main processes' slope, without
    # the admission planning and the lists (the planner and reader processes)
    per_beat_ms = 1e3 * mains.slope * heartbeat_s
    rate = hosts / heartbeat_s
    rho = busiest.at(hosts)
    print(f"\n== projection: {hosts} hosts on {target} replicas ({args.window} window) ==")
    print(f"  heartbeats offered               {rate:>8.0f} /s ({rate / target:.0f} per replica)")
    print(f"  main processes' CPU per heartbeat {per_beat_ms:>7.2f} ms (their slope x {heartbeat_s:g} s)")
    print(f"  servers, all processes           {servers.at(hosts):>8.2f} cores")
    print(f"  main processes, all replicas     {mains.at(hosts):>8.2f} cores")
    print(f"  planner and reader processes     {servers.at(hosts) - mains.at(hosts):>8.2f} cores")
    print(f"  PostgreSQL (this bench's)        {pooled.at(hosts):>8.2f} cores")
    if rho < 1:
        queue = f"M/M/1 p99 floor {per_beat_ms * math.log(100) / (1 - rho):.0f} ms"
    else:
        queue = "saturated: no p99"
    print(f"  busiest main process, one queue  {rho:>8.2f} of one core ({queue})")
    needed = math.ceil(mains.at(hosts) / UTILISATION_BAR)
    print(f"  replicas needed at {UTILISATION_BAR:.0%} of a core each, split evenly: {needed}")
    plausible = rho < UTILISATION_BAR
    print(
        f"  busiest replica under {UTILISATION_BAR:.0%} of a core: {'yes' if plausible else 'no'}"
        f" -> heartbeat p99 < 100 ms {'plausible' if plausible else 'not shown'} on {target} replicas"
    )
    print("\n== the fitted curve (cores) ==")
    print(f"  {'hosts':>6} {'servers':>8} {'mains':>8} {'busiest':>8} {'postgres':>9}")
    for size in (1_000, 2_000, 5_000, 7_500, 10_000):
        print(
            f"  {size:>6} {servers.at(size):>8.2f} {mains.at(size):>8.2f} {busiest.at(size):>8.2f}"
            f" {pooled.at(size):>9.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
