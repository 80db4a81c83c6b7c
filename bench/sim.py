"""The simulator's speed: simulated jobs per second, and where the time goes.

Cases (``--case``):

- ``alibaba``: the Alibaba GPU trace as it is (7,255 replayed tasks of 8,152 on its 1,213 nodes /
  6,212 GPUs); target < 60 s per policy on a 2-core machine;
- ``synthetic``: the multi-tenant workload of ``corral.sim.synthetic`` at ``--jobs`` (100,000) on
  ``--workers`` (2,000) x 8 GPUs with gangs and ``--pools`` (50) pools; target < 10 minutes;
- ``small``: the synthetic workload at 2,000 jobs on 64 workers (what CI runs);
- ``contended``: the synthetic workload at 12,000 jobs on 121 workers x 8 GPUs (968) with 18 pools,
  three of them (32% of the quotas) offered 70% of the jobs at 2.75 times what the cluster can run:
  six times their share; gangs up to 16 x 8; a tenth of the single jobs class 8 without
  checkpoints (kept off borrowed capacity by the claim); target < 3 minutes per policy.

Prints per policy: wall time and this process's CPU time (what to compare on a loaded machine),
simulated jobs per second, events, admission cycles run and skipped
(and those run without the preemption planner, ``corral.sim.shortcuts``), where the time goes
(timed around the core's gang admission and preemption planner and the engine's snapshot and
claims: cheap, always on), with ``--decisions PATH`` a fingerprint of the decisions (equal
fingerprints: the same decisions), and, with ``--profile``, the top functions by cumulative time. Then the
machine block.

    .venv/bin/python bench/sim.py --case alibaba
    .venv/bin/python bench/sim.py --case synthetic --jobs 100000 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import pstats
import sys
import time
from dataclasses import replace
from pathlib import Path

import machine
from corral.core import admission, preemption
from corral.sim import engine, readers, synthetic
from corral.sim.policy import POLICIES
from corral.sim.summary import summarize
from corral.sim.workload import Scenario

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
TARGETS = {"alibaba": 60.0, "synthetic": 600.0, "small": 60.0, "contended": 180.0}


def build(args: argparse.Namespace) -> Scenario:
    traces = Path(args.traces)
    jobs = traces / "alibaba-gpu-v2023" / "jobs.csv"
    trace = readers.read_workload(jobs)
    if args.case == "alibaba":
        nodes = readers.alibaba_nodes_beside(jobs)
        assert nodes is not None
        return Scenario(trace, readers.read_cluster(nodes))
    quotas = readers.venus_quotas(traces / "helios-venus" / "cluster_gpu_number.csv")
    if args.case == "small":
        shape = synthetic.Shape(jobs=2000, workers=64)
    elif args.case == "contended":
        shape = synthetic.Shape(jobs=12_000, workers=121, pools=18, load=2.75, protected_fraction=0.1)
    else:
        shape = synthetic.Shape(jobs=args.jobs, workers=args.workers, pools=args.pools)
    workload, cluster, pools = synthetic.multi_tenant(trace, quotas, shape, seed=args.seed)
    return Scenario(workload, cluster, pools)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--case", choices=sorted(TARGETS), default="alibaba")
    parser.add_argument("--policy", default="corral,fifo")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--pools", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--traces", default=str(Path("/work/shared/traces")))
    parser.add_argument("--profile", action="store_true", help="profile each run (slower) and print the top")
    parser.add_argument(
        "--decisions",
        metavar="PATH",
        help="record each run's decisions and write them with its summary (less the wall time) as JSON to"
        " PATH.<policy>.json, and print the decision log's sha256: two runs made the same decisions when"
        " their fingerprints are equal (the files also hold the engine's counts: cycles skipped...)",
    )
    parser.add_argument(
        "--tick", type=float, default=None, help="CORRAL_ADMISSION_TICK_S for the run (default 5)"
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="stop a run after this many seconds and say how far it got",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    scenario = build(args)
    if args.tick is not None:
        scenario = replace(scenario, settings=replace(scenario.settings, admission_tick_s=args.tick))
    print(
        f"case {args.case}: {len(scenario.workload.jobs)} jobs, {len(scenario.cluster.workers)} workers,"
        f" {scenario.cluster.gpus} GPUs, {len({job.pool for job in scenario.workload.jobs})} pools"
        f" (built in {time.perf_counter() - started:.1f} s)"
    )
    target = TARGETS[args.case]
    for name in args.policy.split(","):
        spent = _timed()
        profiler = cProfile.Profile() if args.profile else None
        started = time.perf_counter()
        cpu_started = time.process_time()
        if profiler is not None:
            profiler.enable()
        run = engine.Engine(
            scenario,
            POLICIES[name],
            _watch(started, args.time_limit),
            record_decisions=args.decisions is not None,
        )
        try:
            record = run.run()
        except _OutOfTime as stop:
            wall = time.perf_counter() - started
            done = len(run.record.ends)
            print(
                f"{name:>7}: stopped after {wall:.0f} s at simulated {stop.fraction:.1%} of the arrivals,"
                f" {done} of {len(scenario.workload.jobs)} jobs done ({done / wall:.0f} jobs/s so far),"
                f" {run.record.cycles} cycles run{_planner_skips(run.record, name)},"
                f" {run.record.cycles_skipped} skipped"
            )
            print("         time: " + _breakdown(spent, wall))
            if profiler is not None:
                profiler.disable()
                _print_profile(profiler, wall)
            continue
        finally:
            if profiler is not None:
                profiler.disable()
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        summary = summarize(scenario, record, name, wall)
        fingerprint = ""
        if args.decisions is not None:
            kept = {"summary": summarize(scenario, record, name), "decisions": record.decisions}
            written = json.dumps(kept, sort_keys=True, default=str)
            Path(f"{args.decisions}.{name}.json").write_text(written)
            decided = json.dumps(record.decisions, default=str).encode()  # not the engine's counts
            fingerprint = f", decisions {hashlib.sha256(decided).hexdigest()[:12]}"
        jobs = len(scenario.workload.jobs)
        verdict = "meets" if wall < target else "MISSES"
        print(
            f"{name:>7}: {wall:7.1f} s  {jobs / wall:8.0f} jobs/s  {record.events} events,"
            f" {record.cycles} cycles run{_planner_skips(record, name)},"
            f" {record.cycles_skipped} skipped  ({verdict} the {target:.0f} s target)"
        )
        print(f"         CPU {cpu:.1f} s (this process: on a loaded machine, compare this){fingerprint}")
        print("         time: " + _breakdown(spent, wall))
        delay = summary["queue_delay_s"]
        print(
            f"         queue delay p50/p99 {delay['p50']}/{delay['p99']} s,"
            f" allocation {summary['gpu_allocation']:.3f}, preemptions {summary['preemptions']}"
        )
        if profiler is not None:
            _print_profile(profiler, wall)
    machine.print_machine()
    return 0


def _print_profile(profiler: cProfile.Profile, wall: float) -> None:
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    core = sum(
        entry[3]
        for key, entry in stats.stats.items()  # type: ignore[attr-defined]
        if "/corral/core/" in key[0] and key[2] in ("decide", "plan")
    )
    print(f"         in corral.core's admission.decide (planner included): {core:.1f} s of {wall:.1f} s")
    stats.sort_stats("cumulative").print_stats(18)
    print("\n".join("         " + line for line in stream.getvalue().splitlines()[6:40]))
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(25)
    print("\n".join("         " + line for line in stream.getvalue().splitlines()[6:40]))


#: what ``_timed`` wraps: (label, owner, attribute); the planner runs inside the admission cycle
_TIMED = (
    ("admission.decide", admission, "decide"),
    ("preemption.plan", preemption, "plan"),
    ("snapshot", engine.Engine, "_snapshot"),
    ("claims", engine.Engine, "_claims"),
)


def _timed() -> dict[str, float]:
    """Wrap the phases of ``_TIMED`` (once) so that each adds its wall time to the dict returned,
    fresh for each run."""
    spent = dict.fromkeys((label for label, _, _ in _TIMED), 0.0)
    _timed.current = spent  # type: ignore[attr-defined]
    if getattr(_timed, "wrapped", False):
        return spent
    _timed.wrapped = True  # type: ignore[attr-defined]
    for label, owner, attribute in _TIMED:
        function = getattr(owner, attribute)

        def wrapper(*args, _function=function, _label=label, **kwargs):  # type: ignore[no-untyped-def]
            started = time.perf_counter()
            try:
                return _function(*args, **kwargs)
            finally:
                _timed.current[_label] += time.perf_counter() - started  # type: ignore[attr-defined]

        setattr(owner, attribute, wrapper)
    return spent


def _planner_skips(record: engine.Record, policy: str) -> str:
    """How many cycles ran without the planner (``corral.sim.shortcuts``), for a policy that has one."""
    return f" ({record.plans_skipped} without the planner)" if POLICIES[policy].preemption else ""


def _breakdown(spent: dict[str, float], wall: float) -> str:
    """Where a run's wall time went: the core's gang admission (the cycle less the planner), the
    planner, the engine's snapshots and claims, and the rest of the engine (events, transitions)."""
    planner = spent["preemption.plan"]
    parts = {
        "gang admission (core)": spent["admission.decide"] - planner,
        "preemption planner (core)": planner,
        "snapshots (engine)": spent["snapshot"],
        "claims (engine, core placement)": spent["claims"],
    }
    parts["events and transitions (engine)"] = wall - sum(parts.values())
    return ", ".join(f"{label} {seconds:.1f} s ({seconds / wall:.0%})" for label, seconds in parts.items())


class _OutOfTime(Exception):
    def __init__(self, fraction: float) -> None:
        self.fraction = fraction


def _watch(started: float, limit: float | None):  # type: ignore[no-untyped-def]
    """A progress callback: a line on stderr every 30 s of wall time, and the stop at ``limit``."""
    last = [started]

    def progress(how_far: engine.Progress) -> None:
        clock = time.perf_counter()
        fraction = how_far.now / how_far.horizon if how_far.horizon else 1.0
        if clock - last[0] > 30:
            last[0] = clock
            print(
                f"         ... {clock - started:.0f} s: simulated {fraction:.1%} of the arrivals,"
                f" {how_far.done} of {how_far.total} jobs done",
                file=sys.stderr,
            )
        if limit is not None and clock - started > limit:
            raise _OutOfTime(fraction)

    return progress


if __name__ == "__main__":
    sys.exit(main())
