"""Large ``POST /jobs/batch`` submits beside heartbeats: what a replica taking them does to the
heartbeats it answers meanwhile, and where its CPU goes.

One real ``corral server`` on a fresh store; ``--hosts`` (20) registered workers, each sending a
worker heartbeat every ``--beat-ms`` (20 ms) on its own keep-alive connection (a probe of the event
loop: 1,000 beats/s by default); meanwhile one client submits ``--batches`` (4) batches of
``--batch`` (10,000) jobs back to back. Printed per run: the heartbeats during the submits, p50 /
p99 / max; the submit's wall time and jobs/s; the server's CPU during the submits, its main process
alone (and beyond what the heartbeats alone cost it, measured for ``--idle-s`` first) and its
children (planner, reader, writer) apart.

    .venv/bin/python bench/batch_submit.py [--db postgres|sqlite] [--batch 10000] [--batches 4]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness


async def _register(conn: harness.HttpConn, worker_id: str) -> None:
    body = {"id": worker_id, "address": "127.0.0.1", "resources": {"cpus": 8, "memory_mb": 8192, "gpus": 8}}
    await conn.json(b"POST", "/workers/register", orjson.dumps(body), expect=201)


async def _beat(
    server: harness.Server, worker_id: str, every_s: float, stop: asyncio.Event, into: list[float]
):
    conn = await harness.HttpConn(server.host, server.port).connect()
    body = orjson.dumps({"running": []})
    path = f"/workers/{worker_id}/heartbeat"
    try:
        due = time.monotonic()
        while not stop.is_set():
            sent = time.monotonic()
            await conn.json(b"POST", path, body)
            into.append(time.monotonic() - sent)
            due = max(due + every_s, time.monotonic())
            await asyncio.sleep(due - time.monotonic())
    finally:
        await conn.close()


async def run(args: argparse.Namespace, server: harness.Server) -> None:
    setup = await harness.HttpConn(server.host, server.port).connect()
    for index in range(args.hosts):
        await _register(setup, f"probe-{index:03d}")
    job = {"command": "true", "resources": {"gpus": 1, "cpus": 1}, "preemption_class": 10}
    bodies = [
        orjson.dumps({"jobs": [{**job, "name": f"b{batch}-{i}"} for i in range(args.batch)]})
        for batch in range(args.batches + 1)
    ]
    # one batch first, untimed: the writer process (where the server runs one) is started by it
    await setup.json(b"POST", "/jobs/batch", bodies[0], expect=201)
    stop = asyncio.Event()
    beats: list[float] = []
    beaters = [
        asyncio.create_task(_beat(server, f"probe-{index:03d}", args.beat_ms / 1e3, stop, beats))
        for index in range(args.hosts)
    ]
    await asyncio.sleep(1.0)
    pid = server.child.process.pid
    # the heartbeats alone first: their latency, and the main process's CPU per heartbeat
    beats.clear()
    idle_before = harness.cpu_seconds(pid)
    await asyncio.sleep(args.idle_s)
    idle_cpu = harness.cpu_seconds(pid) - idle_before
    idle_rate = idle_cpu / args.idle_s
    idle = list(beats)
    beats.clear()
    main_before, all_before = harness.cpu_seconds(pid), harness.cpu_seconds(pid, children=True)
    started = time.monotonic()
    for body in bodies[1:]:
        await setup.json(b"POST", "/jobs/batch", body, expect=201)
    wall = time.monotonic() - started
    main_cpu = harness.cpu_seconds(pid) - main_before
    all_cpu = harness.cpu_seconds(pid, children=True) - all_before
    during = list(beats)
    stop.set()
    await asyncio.gather(*beaters)
    await setup.close()
    jobs = args.batch * args.batches
    # what the heartbeats served meanwhile would have cost it alone, taken off
    submit_cpu = main_cpu - idle_cpu / max(1, len(idle)) * len(during)
    print(
        f"  heartbeats alone ({args.idle_s:g}s): {len(idle)}, p50 / p99 / max"
        f" {1e3 * harness.percentile(idle, 50):.1f} / {1e3 * harness.percentile(idle, 99):.1f}"
        f" / {1e3 * max(idle):.1f} ms; main process {100 * idle_rate:.0f}% of a core",
        flush=True,
    )
    print(
        f"  {args.batches} x {args.batch} jobs in {wall:.2f}s ({jobs / wall:,.0f} jobs/s);"
        f" heartbeats during: {len(during)}, p50 / p99 / max"
        f" {1e3 * harness.percentile(during, 50):.1f} / {1e3 * harness.percentile(during, 99):.1f}"
        f" / {1e3 * max(during):.1f} ms; server CPU {all_cpu:.2f}s, main process {main_cpu:.2f}s"
        f" ({100 * main_cpu / wall:.0f}% of a core; beyond the heartbeats' own"
        f" {1e3 * submit_cpu / jobs * 1000:.0f} ms per 1,000 jobs), children {all_cpu - main_cpu:.2f}s",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="postgres")
    parser.add_argument("--batch", type=int, default=10_000, help="jobs per batch (at most 10,000)")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--hosts", type=int, default=20, help="workers heartbeating meanwhile")
    parser.add_argument("--beat-ms", type=float, default=20.0, help="each one's heartbeat interval")
    parser.add_argument("--idle-s", type=float, default=3.0, help="heartbeats alone, before the submits")
    parser.add_argument("--server-arg", action="append", default=[], help="extra flag for corral server")
    args = parser.parse_args(argv)
    print(f"  load {harness.load_average()}", flush=True)
    processes = harness.Processes()
    with harness.workdir() as directory, harness.store_url(args.db, directory) as url:
        try:
            server = harness.start_server(processes, url, directory, args.server_arg)
            asyncio.run(run(args, server))
        finally:
            processes.stop_all()


if __name__ == "__main__":
    main()
