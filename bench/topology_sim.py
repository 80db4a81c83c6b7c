"""Topology-aware gang placement in the simulator (issue 25): the same multi-tenant workload run with
the topology off (``CORRAL_TOPOLOGY_LEVELS`` empty: labels and asks ignored, the id-order best fit)
and on, on a cluster of ``--blocks`` (8) blocks x ``--racks`` (4) racks x ``--hosts`` (4) hosts of 8
GPUs, each worker labelled ``topology.block`` and ``topology.rack``.

The workload is ``corral.sim.synthetic.multi_tenant`` at ``--jobs`` (3,000) with ``--gang-fraction``
(0.1) of the jobs gangs of 2-16 hosts (8 GPUs a task); ``--required`` (half) of the gangs small
enough for one rack require ``topology.rack``. Prints, per run: the racks and blocks the gangs
spanned at their first start against the fewest racks their hosts fit in, the rack-required gangs
split over racks, queue delay and GPU allocation; then the issue's checks (racks spanned at most
1.2x the fewest with the topology on, no rack-required gang split, queue delay and allocation
within 3% of the run with it off). ``--out DIR`` writes the simulator's report (with the "gang
spread" table and figure) there.

    .venv/bin/python bench/topology_sim.py
    .venv/bin/python bench/topology_sim.py --jobs 2000 --out /tmp/topology-report
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import replace
from pathlib import Path

import machine
from corral.sim import engine, readers, report, synthetic
from corral.sim.policy import POLICIES
from corral.sim.summary import summarize
from corral.sim.workload import Cluster, Scenario, Workload


def labelled_cluster(cluster: Cluster, racks: int, hosts: int) -> Cluster:
    """Worker i in rack i // hosts, block i // (racks x hosts)."""
    workers = tuple(
        replace(
            worker,
            labels={
                **worker.labels,
                "topology.block": f"b{index // (racks * hosts)}",
                "topology.rack": f"r{index // hosts:03d}",
            },
        )
        for index, worker in enumerate(cluster.workers)
    )
    return Cluster(workers, f"{cluster.name} in racks of {hosts}")


def with_asks(workload: Workload, hosts: int, share: float, seed: int) -> Workload:
    """``share`` of the gangs of at most ``hosts`` tasks require one rack."""
    draw = random.Random(seed)
    jobs = tuple(
        replace(job, topology=("required", "topology.rack"))
        if 1 < job.gang_size <= hosts and draw.random() < share
        else job
        for job in workload.jobs
    )
    return Workload(jobs, name=workload.name, unscheduled=workload.unscheduled)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--racks", type=int, default=4, help="racks per block")
    parser.add_argument("--hosts", type=int, default=4, help="hosts per rack")
    parser.add_argument("--gang-fraction", type=float, default=0.1)
    parser.add_argument("--required", type=float, default=0.5, help="share of one-rack gangs requiring it")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policy", default="corral", help="corral or fifo (fifo never preempts)")
    parser.add_argument("--traces", default="/work/shared/traces")
    parser.add_argument("--out", help="write the simulator's report (both runs) to this directory")
    args = parser.parse_args()

    machine.print_machine()
    traces = Path(args.traces)
    trace = readers.read_workload(traces / "alibaba-gpu-v2023" / "jobs.csv")
    quotas = readers.venus_quotas(traces / "helios-venus" / "cluster_gpu_number.csv")
    workers = args.blocks * args.racks * args.hosts
    shape = synthetic.Shape(jobs=args.jobs, workers=workers, gang_fraction=args.gang_fraction)
    workload, cluster, pools = synthetic.multi_tenant(trace, quotas, shape, seed=args.seed)
    scenario = Scenario(
        with_asks(workload, args.hosts, args.required, args.seed),
        labelled_cluster(cluster, args.racks, args.hosts),
        pools,
    )
    gangs = sum(job.gang_size > 1 for job in scenario.workload.jobs)
    required = sum(job.topology is not None for job in scenario.workload.jobs)
    print(
        f"  {len(scenario.workload.jobs)} jobs ({gangs} gangs, {required} requiring one rack) on {workers}"
        f" workers ({args.blocks} blocks x {args.racks} racks x {args.hosts} hosts x 8 GPUs)"
    )
    runs = {"topology off": "", "topology on": scenario.settings.topology_levels}
    summaries, records = [], {}
    for name, levels in runs.items():
        run = replace(scenario, settings=replace(scenario.settings, topology_levels=levels))
        started = time.perf_counter()
        record = engine.Engine(run, POLICIES[args.policy]).run()
        wall = time.perf_counter() - started
        summary = summarize(run, record, name, wall)
        summaries.append(summary)
        records[name] = record
        spread = summary["gang_spread"]
        multi = spread["multi_host"]
        delay = summary["queue_delay_s"]
        print(f"\n  {name} ({wall:.0f} s):")
        print(
            f"    gangs of 2+ hosts: {multi['gangs']}, racks spanned {multi['mean_racks']:.2f} (mean),"
            f" fewest possible {multi['mean_fewest_racks']:.2f}: {multi['ratio']:.2f}x;"
            f" blocks {multi['mean_blocks']:.2f}"
        )
        for hosts, row in spread["by_hosts"].items():
            print(
                f"      {hosts:>2} hosts: {row['gangs']:>4} gangs, racks {row['mean_racks']:.2f}"
                f" (fewest {row['mean_fewest_racks']:.2f}), blocks {row['mean_blocks']:.2f}"
            )
        split, asked = spread["required_rack_split"], spread["required_rack_gangs"]
        print(f"    rack-required gangs split over racks: {split} of {asked}")
        print(
            f"    queue delay mean {delay['mean']:.0f} s, p50 {delay['p50']:.0f} s,"
            f" p99 {delay['p99']:.0f} s; GPU allocation {summary['gpu_allocation']:.4f};"
            f" finished {summary['finished']} of {summary['jobs']}"
        )
        print(
            f"    makespan {summary['makespan_s']:.0f} s, preemptions {summary['preemptions']},"
            f" GPU-hours lost {summary['gpu_hours_lost']:.0f}"
        )
    off, on = summaries
    ratio = on["gang_spread"]["multi_host"]["ratio"]
    print("\n  checks (topology on):")
    print(f"    racks spanned / fewest {ratio:.2f} (target <= 1.2): {'PASS' if ratio <= 1.2 else 'FAIL'}")
    split = on["gang_spread"]["required_rack_split"]
    print(f"    rack-required gangs split: {split} (target 0): {'PASS' if split == 0 else 'FAIL'}")
    for key in ("mean", "p50", "p99"):
        before, after = off["queue_delay_s"][key], on["queue_delay_s"][key]
        change = (after - before) / before if before else 0.0
        print(f"    queue delay {key}: {before:.0f} s -> {after:.0f} s ({change:+.1%}; target within 3%)")
    before, after = off["gpu_allocation"], on["gpu_allocation"]
    change = (after - before) / before
    print(f"    GPU allocation: {before:.4f} -> {after:.4f} ({change:+.1%}; target within 3%)")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        page = report.write(out, scenario, records, summaries)
        print(f"\n  report: {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
