"""End-to-end throughput: jobs running ``true`` through real ``python -m corral worker`` processes.

For each worker count of ``--workers`` (a fresh server and store each time): start the server and
the workers on this machine (``--cpus`` each, short heartbeats), wait until every worker is
registered, submit ``--jobs`` jobs (``command: true``, ``--job-cpus`` each) with ``POST /jobs/batch``,
and wait until every job has ended. The figure is jobs/s from the first submit sent to the last
job's ``finished_at`` (the server's time of its ``done``; same clock, same machine). Every job
must end ``done``.

Just before each run, with nothing of the benchmark running yet, the **spawn ceiling** is measured:
how many ``/bin/sh -c true`` processes Python spawns and reaps per second with two threads
(``harness.spawn_ceiling``), the most any one-process worker could start on this machine at this
moment. The run's jobs/s is printed as a share of it, so runs on a busy or a quiet machine compare.

    .venv/bin/python bench/e2e.py [--workers 2,4] [--jobs 1000] [--db sqlite|postgres] [--repeat 3]
        [--profile py-spy]   # sample the server and the first worker during the run

Targets (2-core machine): >= 400 jobs/s (10x tuned Slurm, 35-41 jobs/s here), >= 40% of the spawn
ceiling, 4 workers not slower than 2.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import orjson

import harness
import machine

TARGET_JOBS_S = 400.0
TARGET_CEILING_SHARE = 0.40
CEILING_S = 2.0


async def run_once(
    args: argparse.Namespace,
    server: harness.Server,
    workers: list[harness.Child],
    worker_ids: list[str],
    processes: harness.Processes,
    directory: Path,
) -> dict[str, float | str]:
    conn = await harness.HttpConn(server.host, server.port).connect()
    await harness.wait_workers(conn, worker_ids, processes)
    await asyncio.sleep(args.settle_s)  # every worker is back in its long-poll
    job = {"command": args.command, "resources": {"cpus": args.job_cpus}}
    bodies = [
        orjson.dumps({"jobs": [job] * min(args.batch, args.jobs - start)})
        for start in range(0, args.jobs, args.batch)
    ]
    spies = []
    if args.profile == "py-spy":
        spies.append(harness.start_pyspy(processes, server.child.process.pid, directory / "pyspy-server.txt"))
        spies.append(
            harness.start_pyspy(processes, workers[0].process.pid, directory / "pyspy-worker.txt", gil=True)
        )
    pids = [server.child.process.pid] + [worker.process.pid for worker in workers]
    cpu_before = [harness.cpu_seconds(pid, children=True) for pid in pids]
    own_before = [harness.cpu_seconds(pid) for pid in pids[1:]]

    started = time.time()
    for body in bodies:
        await conn.json(b"POST", "/jobs/batch", body, expect=201)
    submitted = time.time()
    deadline = time.monotonic() + args.timeout
    ended = 0.0
    while True:
        _, text = await conn.request(b"GET", "/metrics")
        metrics = text.decode()
        ended = harness.metric(metrics, "corral_jobs_completed_total") + harness.metric(
            metrics, "corral_jobs_failed_total"
        )
        if ended >= args.jobs:
            break
        if time.monotonic() > deadline:
            break
        for worker in workers:
            if worker.process.poll() is not None:
                raise RuntimeError(f"{worker.name} exited with {worker.process.returncode} during the run")
        await asyncio.sleep(0.05)
    observed = time.time()
    cpu_after = [harness.cpu_seconds(pid, children=True) for pid in pids]
    own_after = [harness.cpu_seconds(pid) for pid in pids[1:]]
    for spy in spies:
        harness.stop_pyspy(processes, spy)

    jobs = await harness.list_jobs(conn)
    await conn.close()
    statuses = Counter(item["status"] for item in jobs)
    finished = [harness.parse_time(item["finished_at"]) for item in jobs if item["finished_at"]]
    started_at = [harness.parse_time(item["started_at"]) for item in jobs if item["started_at"]]
    last_finish = max((value for value in finished if value is not None), default=float("nan"))
    first_start = min((value for value in started_at if value is not None), default=float("nan"))
    per_worker = Counter(item["worker_id"] for item in jobs)
    wall = last_finish - started
    return {
        "jobs_s": args.jobs / wall if statuses.get("done", 0) == args.jobs else float("nan"),
        "done_per_s": statuses.get("done", 0) / wall,
        "wall": wall,
        "submit": submitted - started,
        "first_start": first_start - started,
        "observed": observed - started,
        "statuses": ", ".join(f"{name} {count}" for name, count in sorted(statuses.items())),
        "done": statuses.get("done", 0),
        "per_worker": ", ".join(f"{name} {count}" for name, count in sorted(per_worker.items())),
        "server_cpu": cpu_after[0] - cpu_before[0],
        "workers_cpu": sum(
            after - before for after, before in zip(cpu_after[1:], cpu_before[1:], strict=True)
        ),
        "workers_own_cpu": sum(after - before for after, before in zip(own_after, own_before, strict=True)),
        "timed_out": "yes" if ended < args.jobs else "no",
    }


def report(count: int, args: argparse.Namespace, result: dict[str, float | str]) -> None:
    harness.banner(
        f"e2e on {args.db}: {args.jobs} jobs '{args.command}' ({args.job_cpus} cpu each),"
        f" {count} workers x --cpus {args.cpus}, --heartbeat-s {args.heartbeat_s}"
    )
    jobs_s = float(result["jobs_s"])
    ceiling = float(result["ceiling"])
    print(f"  load average before the run: {result['load']}")
    print(harness.figure("spawn ceiling (/bin/sh -c true, 2 threads, just before)", ceiling, "spawns/s"))
    if jobs_s == jobs_s:
        print(harness.figure("jobs/s (first submit -> last done)", jobs_s, "jobs/s", TARGET_JOBS_S))
        print(
            harness.figure(
                "  share of the spawn ceiling", 100 * jobs_s / ceiling, "%", 100 * TARGET_CEILING_SHARE
            )
        )
    else:
        print(f"  not every job is done ({result['statuses']}): no jobs/s figure   BELOW")
        print(harness.figure("done jobs/s", float(result["done_per_s"]), "jobs/s", TARGET_JOBS_S))
    print(harness.figure("wall time (first submit -> last finished_at)", float(result["wall"]), "s"))
    print(harness.figure("  submit answered after", float(result["submit"]), "s"))
    print(harness.figure("  first job started after", float(result["first_start"]), "s"))
    print(harness.figure("  client saw the last one after (/metrics poll)", float(result["observed"]), "s"))
    wall = float(result["wall"])
    print(
        f"  CPU during the run: server {float(result['server_cpu']):.1f}s"
        f" ({100 * float(result['server_cpu']) / wall:.0f}% of one core),"
        f" workers with their jobs {float(result['workers_cpu']):.1f}s"
        f" ({100 * float(result['workers_cpu']) / wall:.0f}%), of which the workers themselves"
        f" {float(result['workers_own_cpu']):.1f}s"
        f" ({1e6 * float(result['workers_own_cpu']) / args.jobs:.0f} us per job)"
    )
    print(f"  statuses: {result['statuses']}; per worker: {result['per_worker']}")
    if result["timed_out"] == "yes":
        print(f"  TIMED OUT after {args.timeout:.0f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", default="2,4", help="comma list of worker counts, one run each")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=1000, help="jobs per POST /jobs/batch")
    parser.add_argument("--command", default="true", help="each job's command")
    parser.add_argument("--cpus", type=int, default=64, help="--cpus of each worker")
    parser.add_argument("--job-cpus", type=int, default=1, help="cpus each job asks for")
    parser.add_argument("--heartbeat-s", type=float, default=1.0, help="--heartbeat-s of each worker")
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--pg-url", default=harness.DEFAULT_PG_URL)
    parser.add_argument("--settle-s", type=float, default=0.5, help="pause after registration, before submit")
    parser.add_argument("--timeout", type=float, default=120.0, help="bound on one run's jobs (s)")
    parser.add_argument("--server-arg", action="append", default=[], help="extra flag for corral server")
    parser.add_argument("--worker-arg", action="append", default=[], help="extra flag for corral worker")
    parser.add_argument("--profile", choices=["none", "py-spy"], default="none")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of the whole --workers list; medians")
    args = parser.parse_args(argv)
    counts = [int(part) for part in args.workers.split(",") if part.strip()]
    results: dict[int, list[dict[str, float | str]]] = {count: [] for count in counts}

    machine.print_machine()
    available, why = harness.worker_available()
    if not available:
        print(f"\npython -m corral worker is not available yet; nothing measured:\n{why}")
        return 2
    harness.new_event_loop_policy()
    processes = harness.Processes()
    failed = False
    try:
        bound = args.repeat * len(counts) * (args.timeout + 90 + CEILING_S)
        with harness.bounded(bound), harness.workdir(args.keep) as root:
            for round_index, count in ((index, count) for index in range(args.repeat) for count in counts):
                directory = root / f"run-{round_index}-workers-{count}"
                directory.mkdir()
                load = harness.load_average()
                ceiling = harness.spawn_ceiling(CEILING_S)
                with harness.store_url(args.db, directory, args.pg_url) as db_url:
                    server = harness.start_server(processes, db_url, directory, args.server_arg)
                    worker_ids = [f"bench-e2e-{index}" for index in range(count)]
                    workers = [
                        harness.start_worker(
                            processes,
                            server.url,
                            worker_id,
                            directory,
                            args.cpus,
                            args.heartbeat_s,
                            args.worker_arg,
                        )
                        for worker_id in worker_ids
                    ]
                    try:
                        result = asyncio.run(
                            run_once(args, server, workers, worker_ids, processes, directory)
                        )
                    finally:
                        processes.stop_all()
                    result["ceiling"] = ceiling
                    result["load"] = load
                    results[count].append(result)
                    report(count, args, result)
                    if result["done"] != args.jobs:
                        failed = True
                    if args.profile == "py-spy":
                        harness.print_collapsed(directory / "pyspy-server.txt")
                        harness.print_collapsed(directory / "pyspy-worker.txt", title="worker")
    except KeyboardInterrupt:
        print("interrupted; processes stopped", file=sys.stderr)
        return 130
    finally:
        processes.stop_all()
    summarize(args, results)
    return 1 if failed else 0


def summarize(args: argparse.Namespace, results: dict[int, list[dict[str, float | str]]]) -> None:
    """Per worker count: the median jobs/s, ceiling and share over the repeats, and 4 vs 2."""
    harness.banner(f"summary: medians of {args.repeat} run(s) per worker count")
    medians: dict[int, float] = {}
    for count, runs in results.items():
        if not runs:
            continue
        jobs_s = [float(run["jobs_s"]) for run in runs]
        ceilings = [float(run["ceiling"]) for run in runs]
        shares = [100 * rate / ceiling for rate, ceiling in zip(jobs_s, ceilings, strict=True)]
        medians[count] = statistics.median(jobs_s)
        listed = ", ".join(f"{rate:.0f}" for rate in jobs_s)
        print(
            f"  {count} workers: {medians[count]:.0f} jobs/s ({listed}); ceiling"
            f" {statistics.median(ceilings):.0f} spawns/s; share {statistics.median(shares):.1f}%"
            f" (target >= {100 * TARGET_CEILING_SHARE:.0f}%); loads {'; '.join(str(r['load']) for r in runs)}"
        )
    ordered = sorted(medians)
    for fewer, more in itertools.pairwise(ordered):
        verdict = "ok" if medians[more] >= medians[fewer] else "SLOWER"
        print(f"  {more} workers vs {fewer}: {medians[more] / medians[fewer]:.2f}x   {verdict}")


if __name__ == "__main__":
    sys.exit(main())
